"""state-collector: wires the cluster source to subjects.

Simulator source: every tick the simulated cluster advances; events, a snapshot and the pods that
need a decision are published, each new pod as far into the tick as the simulator created it (``paced``:
a tick's arrivals are not one burst). Each newly pending pod starts a trace (the decision's root span)
that graph-builder and inference continue through the NATS headers. Decisions bind pods in the
simulator; the simulator re-checks the hard filter before binding.

Decisions arrive through a durable JetStream consumer on DECISIONS, acked once applied: one that
arrived while this process was stopped, paused or cut off from NATS is delivered when it is back, one
delivered again is applied at most once (the pod is no longer pending: counted stale). The simulated
cluster lives in this process: a decision announced by an earlier collector (its ``seen_at`` is before
this one started) was made for a cluster that is gone and is acked without being applied (counted as
``agmarl_decisions_foreign_total``), even when a pod of the new run has the same name.

A snapshot's compact state and encoding (~0.1 s for 1,523 nodes and 3,000 bound pods) are built in a
background thread (``runtime.heap.in_background``) while the loop goes on announcing pods on time (on the loop
they stalled it, and the pods due meanwhile went out in one burst); a decision waits until the snapshot is
published, so that no event numbered after it overtakes it.

A decision's outcome event (``pod_bound``, ``bind_rejected``) is stored in the EVENTS stream (a JetStream
publish, ``Nats-Msg-Id`` = epoch and sequence number) before the decision is acked: the reward-calculator
learns from EVENTS which decisions were bound, so an outcome must not be lost with a NATS crash. A store that
fails is retried for ``event_store_seconds``, then the decision is redelivered and the recorded outcome is
stored again (never applied twice).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict

from opentelemetry.context import Context
from prometheus_client import Counter, Gauge

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.cluster.filters import violations
from agmarl_common.core.cluster.model import to_dict
from agmarl_common.core.reward import balance_std, utilisation_by_resource
from agmarl_common.runtime.heap import in_background, settle
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_common.runtime.settings import load_settings
from agmarl_state_collector.settings import CollectorSettings
from agmarl_state_collector.replay import InflationReplay
from agmarl_state_collector.simsource import SimulatedCluster, paced
from agmarl_state_collector.snapshots import SnapshotPublisher, built_snapshot

SERVICE = "state-collector"
OUTCOMES = ("pod_bound", "bind_rejected")  # the events that settle a decision: stored before it is acked
APPLIED_KEPT = 20_000  # decisions whose outcome event is kept for a redelivery


class CollectorApp:
    def __init__(self, rt: ServiceRuntime, settings: CollectorSettings, sim: SimulatedCluster):
        self.rt = rt
        self.settings = settings
        self.sim = sim
        self.epoch = uuid.uuid4().hex  # this run: a restarted collector resets every cluster view
        self.started_at = time.time()  # every pod this process announces is seen at or after this
        self.seq = 0  # one sequence for events and snapshots (a snapshot includes every event before it)
        self.last_snapshot = float("-inf")
        self.snapshot_cost = 0.0  # CPU seconds the last snapshot took to build and publish
        self.snapshot_idle = asyncio.Event()  # cleared while a snapshot is built: decisions wait for it
        self.snapshot_idle.set()
        self.finished = False  # a trace replay has decided every pod
        self.paced = isinstance(sim, SimulatedCluster)  # a trace replay announces by its own rate, at once
        self.announced = 0  # PendingPods published (in the snapshot stats: the arrival rate `agmarl up` reports)
        self.clock, self.sleep = time.monotonic, asyncio.sleep  # the pacing's (a test's fake clock)
        self.violations = 0
        self.snapshots = SnapshotPublisher(rt, settings.max_message_bytes)
        # decision id -> (its outcome event until stored in EVENTS, stored yet): a redelivered decision is not
        # applied again (a stored event is not kept: 20,000 of them made each full garbage collection slow)
        self.applied: OrderedDict[str, tuple[m.ClusterEvent | None, bool]] = OrderedDict()
        reg = rt.registry
        self.bound_total = Counter("agmarl_pods_bound_total", "Pods bound in the cluster", registry=reg)
        self.rejected_total = Counter("agmarl_bind_rejected_total", "Decisions refused by the hard filter at bind",
                                      registry=reg)
        self.stale_total = Counter("agmarl_decisions_stale_total",
                                   "Decisions for pods no longer pending (a duplicate announcement decided twice)",
                                   registry=reg)
        self.unschedulable_total = Counter("agmarl_decisions_unschedulable_total",
                                           "Decisions that found no node for a pending pod", registry=reg)
        self.foreign_total = Counter("agmarl_decisions_foreign_total",
                                     "Decisions for pods an earlier collector announced (its cluster is gone)",
                                     registry=reg)
        self.pending_gauge = Gauge("agmarl_pending_pods", "Pods waiting for a node", registry=reg)
        self.sched_pending = Gauge("scheduler_pending_pods", "Pending pods, kube-scheduler naming", ["queue"],
                                   registry=reg)
        self.util_gauge = Gauge("agmarl_cluster_utilisation_ratio", "Requested / allocatable", ["resource"],
                                registry=reg)
        self.balance_gauge = Gauge("agmarl_cluster_balance_std", "Std of node utilisation", registry=reg)
        self.violations_gauge = Gauge("agmarl_constraint_violations", "Hard-constraint violations in the state",
                                      registry=reg)

    async def on_decision(self, msg: m.Decision, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster or msg.source != "loop":
            return  # extender and batch decisions are bound by kube-scheduler / the binder, not here
        if msg.seen_at < self.started_at:  # announced by an earlier collector, for a cluster that is gone
            self.foreign_total.inc()
            return
        await self.snapshot_idle.wait()  # its events come after the snapshot being built
        note = getattr(self.sim, "note_applied", None)
        if note is not None:  # how far behind the decisions this binder is: re-announcements wait for it
            note(time.time() - msg.decided_at)
        prior = self.applied.get(msg.decision_id)
        if prior is not None:  # applied already: store its outcome if that failed, never apply it twice
            if not prior[1] and prior[0] is not None:
                await self.store_outcome(prior[0], ctx.publish)
            self.stale_total.inc()
            return
        now = time.time()
        if not self.sim.is_pending(msg.pod_key):  # decided already (a duplicate or a redelivery): nothing to do
            self.stale_total.inc()
            return
        if not msg.node:
            self.unschedulable_total.inc()
            self.sim.unschedulable(msg.pod_key, now)
            await self.sim_progress()
            return
        outcome = self.sim.bind(msg.pod_key, msg.node, tuple(msg.gpus) if msg.gpus else None, now)
        ctx.span.set_attribute("agmarl.bind.ok", outcome.ok)
        if outcome.ok:
            self.bound_total.inc()
            pod = self.sim.bound_pod(msg.pod_key, msg.node)
            await self.publish_event("pod_bound", msg.pod_key, msg.node, outcome.reason, msg.decision_id,
                                     pod=to_dict(pod) if pod is not None else {},
                                     gpus=list(pod.gpu_devices) if pod is not None else [], publish=ctx.publish)
        else:
            self.rejected_total.inc()
            ctx.span.set_attribute("agmarl.bind.reason", outcome.reason)
            self.rt.log.info("bind refused pod=%s node=%s reason=%s (will retry)", msg.pod_key, msg.node,
                             outcome.reason)
            await self.publish_event("bind_rejected", msg.pod_key, msg.node, outcome.reason, msg.decision_id,
                                     publish=ctx.publish)
        await self.sim_progress()

    async def publish_event(self, etype: str, pod_key: str, node: str, reason: str, decision_id: str = "",
                            pod: dict | None = None, gpus: list[int] | None = None, at: float | None = None,
                            publish=None) -> None:
        """One cluster event, stamped with the next sequence number of this run; a decision's outcome is stored
        in EVENTS before this returns (``store_outcome``)."""
        self.seq += 1
        event = m.ClusterEvent(
            cluster=self.settings.cluster, seq=self.seq, epoch=self.epoch, type=etype, pod_key=pod_key, node=node,
            reason=reason, time=self.sim.state.time if at is None else at, decision_id=decision_id,
            pod=pod or {}, gpus=gpus or [])
        if etype in OUTCOMES and decision_id:
            self.applied[decision_id] = (event, False)
            while len(self.applied) > APPLIED_KEPT:
                self.applied.popitem(last=False)
            await self.store_outcome(event, publish)
        else:
            await (publish or self.rt.publish)(subjects.event(self.settings.cluster), event)

    async def store_outcome(self, event: m.ClusterEvent, publish=None) -> None:
        """Publish ``event`` into EVENTS and wait for the stream's ack, retrying for ``event_store_seconds`` (NATS
        restarting); then raise, so the decision is not acked and comes again."""
        deadline = time.monotonic() + self.settings.event_store_seconds
        while True:
            try:
                await (publish or self.rt.publish)(subjects.event(self.settings.cluster), event, js=True,
                                                   msg_id=f"{event.epoch}-{event.seq}")
                break
            except Exception as exc:  # noqa: BLE001 - NATS away: retried, then the decision is redelivered
                if time.monotonic() >= deadline:
                    raise
                self.rt.log.warning("storing the %s event of decision %s failed (%s: %s); retrying", event.type,
                                    event.decision_id, type(exc).__name__, exc)
                await asyncio.sleep(0.5)
        self.applied[event.decision_id] = (None, True)

    async def sim_progress(self) -> None:
        """After a decision: announce what is due now (a trace replay's next pod), and finish a replay."""
        await self.announce_due()
        if getattr(self.sim, "done", False) and not self.finished:
            self.finished = True
            await self.publish_snapshot()
            if self.settings.replay_out:
                self.sim.write_result(self.settings.replay_out)
            result = self.sim.result()
            self.rt.log.info("replay finished: %d pods, %d scheduled, %d failed, GPU allocation at 100 %% arrived "
                             "%.2f %%, at 130 %% %.2f %% (result: %s)", result["pods"], result["scheduled"],
                             result["failed"], result["gpu_alloc_100"], result["gpu_alloc_130"],
                             self.settings.replay_out or "-")

    async def announce_due(self) -> None:
        for pod in self.sim.due(time.time()):
            await self.announce(pod)

    async def announce(self, pod) -> None:
        """Publish one pending pod; its ``seen_at`` (now) is where its decision latency starts. Its span is a trace's
        root, also when a decision's handler announces it (a retry): not one more child of that decision's trace."""
        cluster = self.settings.cluster
        with self.rt.tracer.start_as_current_span(f"{SERVICE} pending_pod_seen", context=Context()) as span:
            span.set_attribute("agmarl.pod", pod.key)
            span.set_attribute("agmarl.cluster", cluster)
            await self.rt.publish(subjects.pending(cluster), m.PendingPod(
                cluster=cluster, pod=to_dict(pod), seen_at=time.time(), seq=self.seq))
        self.announced += 1

    async def announce_paced(self, due: list, started: float) -> None:
        """Announce ``due`` ((offset, pod) from ``paced``), each at ``started`` + its offset."""
        for offset, pod in due:
            wait = started + offset - self.clock()
            if wait > 0:
                await self.sleep(wait)
            if self.sim.is_pending(pod.key):
                await self.announce(pod)

    async def tick(self) -> list:
        """One simulator step: its events, a snapshot when due; returns the pods to announce during this tick
        (``paced``; a trace replay announces its due pods here, at once)."""
        s = self.settings
        since = self.sim.state.time
        events = self.sim.advance(s.tick_seconds * s.sim_time_scale)
        # taken before the first await: a decision handled meanwhile (sim_progress) must not announce them at once
        due = paced(self.sim.due(time.time()), since, s.sim_time_scale) if self.paced else []
        try:  # taken due, they are announced whatever happens here (else not before 10 retry periods)
            if events:
                await self.snapshot_idle.wait()  # numbered after the snapshot being built
            for ev in events:
                if ev.type == "pod_bound":
                    continue  # published when the decision is applied
                await self.publish_event(ev.type, ev.pod_key, ev.node, ev.reason, at=ev.time)
            budget = self.snapshot_cost / s.snapshot_cpu_share if s.snapshot_cpu_share > 0 else 0.0
            if self.snapshot_idle.is_set() and time.monotonic() - self.last_snapshot >= max(s.snapshot_seconds,
                                                                                             budget):
                self.last_snapshot = time.monotonic()
                self.snapshot_idle.clear()  # now: a decision handled before the task starts waits for it too
                self.rt.spawn(self.publish_snapshot(), name="snapshot")
        except Exception:  # noqa: BLE001 - the loop must survive a bad tick; the log has the traceback
            self.rt.log.exception("tick failed")
        if not self.paced:
            await self.announce_due()
        return due

    async def publish_snapshot(self) -> None:
        """The cluster's snapshot, numbered after every event published so far; its compact state and encoding
        are built in the background thread (the state is immutable) while decisions wait (``snapshot_idle``)."""
        self.snapshot_idle.clear()
        try:
            await self._publish_snapshot()
        finally:
            self.snapshot_idle.set()

    async def _publish_snapshot(self) -> None:
        began = time.thread_time()
        state = self.sim.state
        cluster = state.cluster
        self.seq += 1
        found = violations(cluster)
        self.violations = max(self.violations, len(found))
        util = utilisation_by_resource(cluster)
        stats = {f"utilisation_{k}": v for k, v in util.items()}
        stats.update(balance=balance_std(cluster), pending=float(len(state.pending)),
                     violations=float(len(found)), bound=float(sum(len(b) for b in cluster.bound)),
                     announced=float(self.announced))
        stats.update({k: float(v) for k, v in state.counters.as_dict().items()})
        for k, v in util.items():
            self.util_gauge.labels(resource=k).set(v)
        self.balance_gauge.set(stats["balance"])
        self.pending_gauge.set(stats["pending"])
        self.sched_pending.labels(queue="active").set(stats["pending"])
        self.violations_gauge.set(len(found))
        pending = state.pending_pods()
        loop_cpu = time.thread_time() - began
        msg, data, cpu = await in_background(built_snapshot, self.settings.cluster, self.seq, state.time, cluster,
                                             pending, stats, self.epoch)
        began = time.thread_time()
        await self.snapshots.publish(msg, data)
        self.snapshot_cost = loop_cpu + cpu + time.thread_time() - began

    async def run_loop(self) -> None:
        """Tick forever; the runtime cancels this task at shutdown."""
        period = self.settings.tick_seconds
        while True:
            started = self.clock()
            try:
                await self.announce_paced(await self.tick(), started)
            except Exception:  # noqa: BLE001 - the loop must survive a bad tick; the log has the traceback
                self.rt.log.exception("tick failed")
            await self.sleep(max(0.0, period - (self.clock() - started)))


def make_source(settings: CollectorSettings) -> SimulatedCluster | InflationReplay:
    """The simulated cluster behind the collector: a trace replay (``replay_workload``) or the synthetic
    dynamic simulator."""
    workload = settings.replay_workload
    if workload and settings.replay_protocol == "inflation":
        return InflationReplay.from_spec(workload, settings.replay_nodes, settings.sim_seed, settings.replay_ratio,
                                         settings.replay_tie_break, settings.replay_in_flight, settings.replay_rate,
                                         settings.retry_seconds)
    if workload:  # dynamic: a synthetic workload driven by the dynamic simulator
        kind, _, name = workload.partition(":")
        if kind != "synthetic":
            raise ValueError(f"--protocol dynamic replays synthetic:<name> workloads, not {workload!r}")
        settings = settings.model_copy(update={"sim_workload": name})
    return SimulatedCluster.create(settings.sim_nodes, settings.sim_zones, settings.sim_workload,
                                   settings.sim_rate, settings.sim_seed, settings.chunk_seconds,
                                   settings.retry_seconds)


async def main() -> int:
    settings = load_settings(CollectorSettings)
    rt = ServiceRuntime(SERVICE, settings)
    if settings.source == "kubernetes":
        from agmarl_state_collector.k8sapp import run_kubernetes
        return await run_kubernetes(rt, settings)
    if settings.source != "simulator":
        rt.log.error("source %r is not available (use 'simulator' or 'kubernetes')", settings.source)
        return 2
    try:
        sim = make_source(settings)
    except (ValueError, OSError) as exc:
        rt.log.error("cluster source: %s", exc)
        return 2
    app = CollectorApp(rt, settings, sim)
    # durable: decisions wait in the stream while this process is down; a new consumer starts at the end of
    # the stream (an earlier run's decisions are not replayed into this cluster)
    rt.handle_stream(subjects.DECISIONS, subjects.decision_wildcard(settings.cluster),
                     subjects.durable(SERVICE, settings.cluster), m.Decision, ack_wait=settings.decision_ack_wait,
                     deliver_new=True)(app.on_decision)
    await rt.start()
    settle()  # the source's cluster and pod list live as long as the process: out of full collections
    # EVENTS keeps the bind outcomes (pod_bound, bind_rejected): a restarted reward-calculator reads them back
    rt.spawn(rt.bus.ensure_stream(subjects.EVENTS), name="ensure-events")
    rt.spawn(app.run_loop(), name="simulator-loop")
    return await rt.run_until_stopped()
