"""The time-driven ("dynamic") cluster simulator: frozen state, step functions, an in-process runner.

Step API (the scheduling decision comes from outside):
- ``reset(nodes, workload, config, seed)`` -> the state at ``config.start_s``, nothing arrived yet;
- ``advance(state, dt, config)`` -> (state, events): departures, node recoveries and failures
  (random, and the config's scripted node loss), random evictions, arrivals with ``creation_time <= time``, pending timeouts, measured load;
- ``bind(state, pod_key, node_name, gpus=None)`` -> (state, BindOutcome): re-runs the hard filter
  and refuses an infeasible binding (counted in ``bind_rejected``), so no hard-constraint violation
  can enter the state;
- ``snapshot_stats(state)`` -> a flat dict of the current metrics.
``run(policy, ...)`` drives these with an in-process policy and returns a ``DynamicResult``.
The plain data (config, events, state, counters, result) and the metric snapshots live in
``sim.dynamic_state`` and are re-exported here.

Randomness: every ``advance`` draws from ``default_rng([seed, step])``, so a run replays exactly
for a seed whatever the scheduling decisions were. No wall clock and no I/O in here.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import replace

import numpy as np

from agmarl_common.core.cluster import model
from agmarl_common.core.cluster.filters import feasible_nodes, filter_node, violations
from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Node, Pod
from agmarl_common.core.policies.base import Policy, brief, select_node
from agmarl_common.core.sim import metrics
from agmarl_common.core.sim.dynamic_state import (  # noqa: F401  (plain data and metrics: re-exported, part of this module's API)
    EVENT_TYPES, RESTART_POLICIES, BindOutcome, DynamicResult, PendingPod, RunInfo, SimConfig, SimCounters,
    SimEvent, SimState, _record, mean_pending_wait, snapshot_stats, window_outcomes)

OBJECTIVE = "composite"  # what this harness measures (features.OBJECTIVES): the composite reward


def _log(log: tuple, values: list[float] | tuple[float, ...]) -> tuple:
    for v in values:
        log = (float(v), log)
    return log


def _unbind_at(cluster: ClusterState, i: int, key: str) -> ClusterState:
    """``model.unbind`` for a pod known to be on node i, without scanning every node's pods."""
    return model.unbind_at(cluster, i, key)


def _clean(pod: Pod) -> Pod:
    return replace(pod, node_name="", gpu_devices=()) if pod.node_name or pod.gpu_devices else pod


def reset(nodes: list[Node] | tuple[Node, ...], workload: list[Pod] | tuple[Pod, ...],
          config: SimConfig = SimConfig(), seed: int = 0) -> SimState:
    """A cluster with nothing bound at ``config.start_s``; pods arrive on ``advance``."""
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError("seed must be a non-negative integer")
    order = sorted(range(len(workload)), key=lambda k: (workload[k].creation_time, k))
    pods = tuple(_clean(workload[k]) for k in order)
    keys = [p.key for p in pods]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})[:5]
        raise ValueError(f"workload pod keys must be unique, duplicated: {dup}")
    nodes = tuple(nodes)
    return SimState(time=float(config.start_s), step=0, seed=int(seed), cluster=ClusterState.empty(nodes),
                    base_nodes=nodes, workload=pods)


class _Step:
    """Mutable scratch copy of a state used inside one ``advance`` (never escapes it)."""

    def __init__(self, state: SimState, t: float, config: SimConfig) -> None:
        self.t, self.config = t, config
        self.cluster = state.cluster
        self.pending = dict(state.pending)
        self.running = dict(state.running)
        self.down = dict(state.down)
        self.c = state.counters.as_dict()
        self.waits: list[float] = []
        self.ends = state.ends
        self.events: list[SimEvent] = []

    def remove_running(self, key: str, reason: str) -> None:
        """Unbind a running pod involuntarily; requeue it or count it failed."""
        info = self.running.pop(key)
        node = self.cluster.nodes[info.node_index]
        pod = next(p for p in self.cluster.bound[info.node_index] if p.key == key)
        self.cluster = _unbind_at(self.cluster, info.node_index, key)
        self.c["evicted"] += 1
        if self.config.restart_policy == "requeue":
            self.pending[key] = PendingPod(_clean(pod), info.arrival_time, self.t, info.restarts + 1)
            self.c["restarted"] += 1
            self.events.append(SimEvent("pod_evicted", key, node.name, self.t, f"{reason}; requeued"))
        else:
            self.c["failed"] += 1
            self.events.append(SimEvent("pod_failed", key, node.name, self.t, reason))

    def set_ready(self, i: int, ready: bool, base: Node) -> None:
        nodes = list(self.cluster.nodes)
        nodes[i] = base if ready else replace(base, ready=False)
        sched = self.cluster.schedulable.copy()
        sched[i] = ready and base.ready and not base.unschedulable
        self.cluster = replace(self.cluster, nodes=tuple(nodes), schedulable=sched)


def advance(state: SimState, dt: float, config: SimConfig = SimConfig()) -> tuple[SimState, list[SimEvent]]:
    """Move time forward by ``dt`` seconds (``dt = 0`` only admits arrivals at the current time)."""
    if dt < 0:
        raise ValueError("dt must be >= 0")
    t = state.time + dt
    rng = np.random.default_rng([state.seed, state.step])
    s = _Step(state, t, config)
    _departures(s)
    _recoveries(s, state.base_nodes)
    _failures(s, state.base_nodes, rng, dt)
    _scripted_loss(s, state, config)
    _evictions(s, rng, dt)
    next_arrival = _arrivals(s, state.workload, state.next_arrival)
    _timeouts(s)
    _measure_load(s, rng)
    new = replace(state, time=t, step=state.step + 1, cluster=s.cluster, next_arrival=next_arrival,
                  pending=s.pending, running=s.running, down=s.down, counters=SimCounters(**s.c),
                  ends=s.ends, wait_log=_log(state.wait_log, s.waits))
    return new, s.events


def _departures(s: _Step) -> None:
    k = 0
    while k < len(s.ends) and s.ends[k][0] <= s.t:
        k += 1
    ended, s.ends = s.ends[:k], s.ends[k:]
    for end, key in ended:
        info = s.running.get(key)
        if info is None or info.end != end:  # stale: evicted (and maybe bound again) since
            continue
        del s.running[key]
        s.cluster = _unbind_at(s.cluster, info.node_index, key)
        s.c["departed"] += 1
        s.events.append(SimEvent("pod_deleted", key, s.cluster.nodes[info.node_index].name, end, "completed"))


def _recoveries(s: _Step, base: tuple[Node, ...]) -> None:
    for i, at in sorted(s.down.items()):
        if at <= s.t:
            del s.down[i]
            s.set_ready(i, True, base[i])
            s.c["node_recoveries"] += 1
            s.events.append(SimEvent("node_recovered", "", base[i].name, at, ""))


def _failures(s: _Step, base: tuple[Node, ...], rng: np.random.Generator, dt: float) -> None:
    if s.config.node_failure_rate <= 0 or dt <= 0:
        return
    p = -math.expm1(-s.config.node_failure_rate / 3600.0 * dt)
    u = rng.random(len(base))
    for i in np.nonzero(u < p)[0].tolist():
        if i not in s.down:
            until = s.t + float(rng.exponential(s.config.mean_recovery_s))
            _fail(s, i, until, base[i], f"down until {until:.1f}s")


def _fail(s: _Step, i: int, until: float, base: Node, reason: str) -> None:
    """Node ``i`` not ready until ``until``; its pods evicted and requeued."""
    s.down[i] = until
    s.set_ready(i, False, base)
    s.c["node_failures"] += 1
    s.events.append(SimEvent("node_failed", "", base.name, s.t, reason))
    for pod in s.cluster.bound[i]:
        s.remove_running(pod.key, "node_failed")


NODE_LOSS_STREAM = 7919  # the seed stream that picks the nodes of a scripted loss


def lost_nodes(n_nodes: int, fraction: float, seed: int) -> list[int]:
    """The nodes a scripted loss of ``fraction`` takes down for ``seed`` (at least one when fraction > 0)."""
    if fraction <= 0 or n_nodes == 0:
        return []
    k = min(n_nodes, max(1, int(round(fraction * n_nodes))))
    return sorted(np.random.default_rng([seed, NODE_LOSS_STREAM]).permutation(n_nodes)[:k].tolist())


def _scripted_loss(s: _Step, state: SimState, config: SimConfig) -> None:
    """``config.node_loss_fraction`` of the nodes fail when time crosses ``node_loss_at_s``."""
    at = config.node_loss_at_s
    if config.node_loss_fraction <= 0 or not state.time < at <= s.t:
        return
    for i in lost_nodes(len(state.base_nodes), config.node_loss_fraction, state.seed):
        if i not in s.down:
            _fail(s, i, at + config.node_loss_s, state.base_nodes[i], "scripted node loss")


def fail_nodes(state: SimState, indexes: list[int] | tuple[int, ...], until: float,
               config: SimConfig = SimConfig()) -> tuple[SimState, list[SimEvent]]:
    """A scripted failure now (a benchmark's "lose 20 % of the nodes"): nodes ``indexes`` not ready
    until ``until`` (``advance`` recovers them then), their pods evicted and requeued, as a random
    failure does; nodes already down are left as they are."""
    s = _Step(state, state.time, config)
    for i in indexes:
        if i not in s.down:
            _fail(s, i, until, state.base_nodes[i], "scripted")
    return replace(state, cluster=s.cluster, pending=s.pending, running=s.running, down=s.down,
                   counters=SimCounters(**s.c), ends=s.ends), s.events


def _evictions(s: _Step, rng: np.random.Generator, dt: float) -> None:
    if s.config.eviction_rate <= 0 or dt <= 0 or not s.running:
        return
    p = -math.expm1(-s.config.eviction_rate / 3600.0 * dt)
    keys = list(s.running)
    u = rng.random(len(keys))
    for k in np.nonzero(u < p)[0].tolist():
        s.remove_running(keys[k], "evicted")


def _arrivals(s: _Step, workload: tuple[Pod, ...], nxt: int) -> int:
    while nxt < len(workload) and workload[nxt].creation_time <= s.t:
        pod = workload[nxt]
        nxt += 1
        s.pending[pod.key] = PendingPod(pod, pod.creation_time, pod.creation_time)
        s.c["arrived"] += 1
        s.events.append(SimEvent("pod_added", pod.key, "", pod.creation_time, ""))
    return nxt


def _timeouts(s: _Step) -> None:
    limit = s.config.pending_timeout_s
    if limit <= 0:
        return
    for key in [k for k, pp in s.pending.items() if s.t - pp.enqueue_time > limit]:
        pp = s.pending.pop(key)
        s.waits.append(s.t - pp.enqueue_time)
        s.c["unschedulable"] += 1
        s.events.append(SimEvent("pod_deleted", key, "", s.t, "unschedulable: pending timeout"))


def _measure_load(s: _Step, rng: np.random.Generator) -> None:
    cfg = s.config
    if cfg.metric_noise_std == 0 and cfg.load_ratio == 1.0:
        return
    n = s.cluster.n_nodes
    f_cpu = np.maximum(cfg.load_ratio + cfg.metric_noise_std * rng.standard_normal(n), 0.0)
    f_mem = np.maximum(cfg.load_ratio + cfg.metric_noise_std * rng.standard_normal(n), 0.0)
    s.cluster = replace(s.cluster, cpu_load=s.cluster.cpu_used * f_cpu, mem_load=s.cluster.mem_used * f_mem)


def _check_gpus(pod: Pod, cluster: ClusterState, i: int, gpus: tuple[int, ...]) -> str:
    """'' when devices ``gpus`` on node i can host ``pod``, else why not."""
    want = pod.num_gpu if pod.num_gpu else 0
    if len(gpus) != want or len(set(gpus)) != len(gpus):
        return f"pod needs {want} distinct GPU devices, got {list(gpus)}"
    free = cluster.gpu_free()[i]
    need = pod.gpu_milli if pod.is_gpu_share else GPU_MILLI
    for j in gpus:
        if not 0 <= j < cluster.gpu_count[i] or free[j] < need:
            return f"GPU device {j} cannot host {need} milli"
    return ""


def _reject(state: SimState, pod_key: str, node_name: str, reason: str) -> tuple[SimState, BindOutcome]:
    ev = SimEvent("bind_rejected", pod_key, node_name, state.time, reason)
    counters = replace(state.counters, bind_rejected=state.counters.bind_rejected + 1)
    return replace(state, counters=counters), BindOutcome(False, reason, ev)


def bind(state: SimState, pod_key: str, node_name: str,
         gpus: tuple[int, ...] | None = None) -> tuple[SimState, BindOutcome]:
    """Bind a pending pod at the current time, or refuse (state unchanged but ``bind_rejected``).

    The hard filter (``filter_node``) runs again here; ``gpus=None`` picks devices with
    ``model.choose_gpus``, explicit devices are checked.
    """
    return _bind(state, pod_key, node_name, gpus, run_filter=True)


def _bind(state: SimState, pod_key: str, node_name: str, gpus: tuple[int, ...] | None,
          run_filter: bool) -> tuple[SimState, BindOutcome]:
    """``bind``; ``run_filter=False`` only for a node taken from ``feasible_nodes`` of this very state."""
    pp = state.pending.get(pod_key)
    if pp is None:
        return _reject(state, pod_key, node_name, "pod is not pending")
    cluster = state.cluster
    i = cluster.index.get(node_name)
    if i is None:
        return _reject(state, pod_key, node_name, "unknown node")
    if i in state.down:
        return _reject(state, pod_key, node_name, "node is down")
    status = filter_node(pp.pod, cluster, i) if run_filter else None
    if status is not None and not status.ok:
        return _reject(state, pod_key, node_name, f"{status.plugin}: {status.reason}")
    if gpus is None:
        gpus = model.choose_gpus(pp.pod, cluster.gpu_free()[i])
        if gpus is None:
            return _reject(state, pod_key, node_name, "no GPU devices fit")
    why = _check_gpus(pp.pod, cluster, i, tuple(gpus))
    if why:
        return _reject(state, pod_key, node_name, why)
    pending = dict(state.pending)
    del pending[pod_key]
    running = dict(state.running)
    end = state.time + pp.pod.duration if pp.pod.duration > 0 else math.inf
    running[pod_key] = RunInfo(i, state.time, end, pp.arrival_time, pp.restarts)
    ends = state.ends
    if end < math.inf:
        at = bisect.bisect_right(ends, (end, pod_key))
        ends = ends[:at] + ((end, pod_key),) + ends[at:]
    new = replace(state, cluster=model.bind(cluster, pp.pod, i, tuple(gpus)), pending=pending, running=running,
                  counters=replace(state.counters, bound=state.counters.bound + 1),
                  ends=ends, wait_log=(state.time - pp.enqueue_time, state.wait_log))
    return new, BindOutcome(True, "", SimEvent("pod_bound", pod_key, node_name, state.time, ""))



# ---------------------------------------------------------------------------------------------
# In-process runner


def schedule_pending(policy: Policy, state: SimState, config: SimConfig,
                     retry: dict[str, tuple[float, float]]) -> SimState:
    """One scheduling pass over the queue in order; ``retry`` (key -> (next try, backoff)) is updated.

    A policy with ``observe_sim(state, config)`` (the lookahead reference, ``sim.lookahead``) is shown the
    simulator state before each of its decisions."""
    observe = getattr(policy, "observe_sim", None)
    for key, pp in list(state.pending.items()):
        if retry.get(key, (-math.inf, 0.0))[0] > state.time:
            continue
        if callable(observe):
            observe(state, config)
        cluster = state.cluster
        candidates = feasible_nodes(pp.pod, cluster)
        if state.down:
            candidates = np.array([c for c in candidates.tolist() if c not in state.down], dtype=np.int64)
        node = select_node(policy, pp.pod, cluster, candidates)
        gpus = policy.choose_gpus(pp.pod, cluster, node) if node is not None else None
        ok = False
        if node is not None and gpus is not None:
            # node comes from feasible_nodes on this exact state: the filter already ran
            state, outcome = _bind(state, key, cluster.nodes[node].name, tuple(gpus), run_filter=False)
            ok = outcome.ok
        if ok:
            retry.pop(key, None)
        else:
            delay = min(max(2 * retry.get(key, (0.0, 0.0))[1], config.backoff_initial_s), config.backoff_max_s)
            retry[key] = (state.time + delay, delay)
    return state


def run(policy: Policy, nodes: list[Node] | tuple[Node, ...], workload: list[Pod] | tuple[Pod, ...],
        config: SimConfig = SimConfig(), seed: int = 0, record_every: float = 10.0,
        check_every: int = 0) -> DynamicResult:
    """Tick, advance, schedule the queue with ``policy``; record metrics every ``record_every`` s.

    ``violations(state)`` (the whole-state legality check) runs on the final state and, when
    ``check_every > 0``, at every ``check_every``-th record point too (it is O(pods^2) with anti-affinity).
    """
    brief(policy, objective=OBJECTIVE)  # a learned policy is asked for what this harness measures
    state = reset(nodes, workload, config, seed)
    retry: dict[str, tuple[float, float]] = {}
    every = max(1, round(record_every / config.tick_s))
    rows: list[tuple[float, ...]] = []
    sla_pods: set[str] = set()
    worst, examples = 0, ()
    n_ticks = int(math.ceil(config.horizon_s / config.tick_s - 1e-9))
    for k in range(1, n_ticks + 1):
        state, _ = advance(state, config.tick_s, config)
        state = schedule_pending(policy, state, config, retry)
        if k % every == 0 or k == n_ticks:
            rows.append(_record(state, config, sla_pods))
        if k == n_ticks or (check_every > 0 and k % (every * check_every) == 0):
            found = violations(state.cluster)
            if len(found) > worst:
                worst, examples = len(found), tuple(found[:5])
    return DynamicResult(policy=getattr(policy, "name", type(policy).__name__), seed=seed, config=config,
                         counters=state.counters, pending_times=state.pending_times,
                         series=metrics.series_from_rows(rows), sla_violating_pods=len(sla_pods),
                         hard_violations=worst, violation_examples=examples, final_state=state)

