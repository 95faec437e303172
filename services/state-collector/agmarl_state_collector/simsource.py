"""The simulated cluster source: the pure dynamic simulator driven by wall-clock ticks.

Holds the simulator state, advances it, tells the app which pods need a decision, and applies
decisions that arrive over the bus (the simulator's bind re-checks the hard filter, so an infeasible
decision is refused, never applied).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from agmarl_common.core.cluster.model import Pod
from agmarl_common.core.sim import dynamic, synthetic


MAX_LAG_S = 300.0  # a binder lag counted at most this long (a clock far off must not hold announcements forever)


@dataclass
class Announce:
    """Bookkeeping for a pod that was published as pending."""

    at: float  # wall time of the last announcement
    attempts: int = 0
    retry_after: float = 0.0


@dataclass
class SimulatedCluster:
    nodes: list
    workload: str
    rate: float | None
    seed: int
    chunk_seconds: float
    retry_seconds: float
    config: dynamic.SimConfig = field(default_factory=dynamic.SimConfig)
    state: dynamic.SimState | None = None
    chunk: int = 0
    announced: dict[str, Announce] = field(default_factory=dict)
    decision_lag: float = 0.0  # age of the last decision applied (s): how far behind the deciders this binder is

    @classmethod
    def create(cls, n_nodes: int, zones: int, workload: str, rate: float | None, seed: int,
               chunk_seconds: float, retry_seconds: float) -> "SimulatedCluster":
        nodes = synthetic.synthetic_cluster(n_nodes=n_nodes, zones=zones, seed=seed)
        sim = cls(nodes=nodes, workload=workload, rate=rate, seed=seed, chunk_seconds=chunk_seconds,
                  retry_seconds=retry_seconds)
        sim.state = dynamic.reset(nodes, sim._next_chunk(), sim.config, seed)
        return sim

    def _next_chunk(self) -> list[Pod]:
        """The next ``chunk_seconds`` of synthetic workload, with unique names and shifted times."""
        offset = self.chunk * self.chunk_seconds
        pods = synthetic.generate(self.workload, self.nodes, horizon_s=self.chunk_seconds, rate=self.rate,
                                  seed=self.seed + self.chunk)
        out = [replace(p, name=f"c{self.chunk}-{p.name}", creation_time=p.creation_time + offset) for p in pods]
        self.chunk += 1
        return out

    def advance(self, sim_dt: float) -> list[dynamic.SimEvent]:
        assert self.state is not None
        if self.state.time + sim_dt >= (self.chunk - 0.5) * self.chunk_seconds:
            self.state = add_workload(self.state, self._next_chunk())
        self.state, events = dynamic.advance(self.state, sim_dt, self.config)
        live = set(self.state.pending)
        for key in list(self.announced):
            if key not in live:
                del self.announced[key]
        return events

    def note_applied(self, age: float) -> None:
        """A decision ``age`` seconds old (since it was made) reached this binder."""
        self.decision_lag = min(max(0.0, age), MAX_LAG_S)

    def due(self, now: float) -> list[Pod]:
        """Pending pods that need a (new) decision now: new ones, refused or unschedulable ones after their
        retry time, and ones whose announcement got no decision for ``10 * retry_seconds`` (lost: nobody was
        listening) plus twice the binder's lag: while decisions queue here, a pod's own may be among them, and
        announcing it again once the decider's assumption of it expired would have it decided twice, adding to
        the queue (a binder behind by more than inference's 30 s made every queued pod a second decision)."""
        assert self.state is not None
        out = []
        stale = 10 * self.retry_seconds + 2 * self.decision_lag
        for pod in self.state.pending_pods():
            a = self.announced.get(pod.key)
            if a is None or (a.retry_after and now >= a.retry_after) or now - a.at > stale:
                self.announced[pod.key] = Announce(at=now, attempts=(a.attempts + 1 if a else 1))
                out.append(pod)
        return out

    def unschedulable(self, pod_key: str, now: float) -> None:
        a = self.announced.get(pod_key)
        if a is not None:
            a.retry_after = now + self.retry_seconds

    def bind(self, pod_key: str, node: str, gpus: tuple[int, ...] | None, now: float) -> dynamic.BindOutcome:
        """Bind as decided; the GPU devices are a hint (as with a device plugin, the node picks when
        the hinted devices were taken meanwhile). A refused pod is offered again at the next tick."""
        assert self.state is not None
        state, outcome = dynamic.bind(self.state, pod_key, node, gpus)
        if not outcome.ok and gpus:
            retry_state, retry = dynamic.bind(self.state, pod_key, node, None)
            if retry.ok:
                state, outcome = retry_state, retry
        self.state = state
        if not outcome.ok:
            a = self.announced.get(pod_key)
            if a is not None:
                a.retry_after = now  # re-announce at the next tick, against fresher state
        return outcome


    def is_pending(self, pod_key: str) -> bool:
        assert self.state is not None
        return pod_key in self.state.pending

    def bound_pod(self, pod_key: str, node: str) -> Pod | None:
        """The pod as bound on ``node`` (with its GPU devices), or None."""
        assert self.state is not None
        i = self.state.cluster.index.get(node)
        if i is None:
            return None
        return next((p for p in self.state.cluster.bound[i] if p.key == pod_key), None)


def paced(pods: list[Pod], since: float, time_scale: float) -> list[tuple[float, Pod]]:
    """When to announce the pods a tick found due: (wall seconds after the tick began, pod), earliest first. A pod
    created inside the tick's simulated interval (from ``since``) is announced as far into the tick as it was
    created (at ``time_scale`` simulated seconds per wall second), as a cluster would show it; one created
    before (a retry, a re-announcement, a pod queued again) at once. Without this a tick's arrivals (2.5
    simulated seconds of them, 15 pods on average at the default rate and up to 65) were published together
    and queued behind one another at inference."""
    scale = time_scale if time_scale > 0 else float("inf")
    return sorted(((max(0.0, (p.creation_time - since) / scale), p) for p in pods), key=lambda x: x[0])


def add_workload(state: dynamic.SimState, pods: list[Pod]) -> dynamic.SimState:
    """Add later arrivals to the simulator's workload, merged by creation time with the pods not arrived yet
    (a chunk's last pods may come a little after the next chunk's first); none may precede an arrived pod."""
    later = tuple(sorted(pods, key=lambda p: p.creation_time))
    arrived, queued = state.workload[:state.next_arrival], state.workload[state.next_arrival:]
    if later and arrived and later[0].creation_time < arrived[-1].creation_time:
        raise ValueError("added workload starts before pods that already arrived")
    merged = tuple(sorted(queued + later, key=lambda p: p.creation_time))  # stable: queued first on ties
    return replace(state, workload=arrived + merged)
