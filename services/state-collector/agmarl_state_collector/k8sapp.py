"""state-collector with ``source: kubernetes``: the watched cluster on the bus.

Publishes, like the simulator path: a ``ClusterEvent`` per change the watch saw; a
``ClusterSnapshot`` when the state changed (debounced: at most one per ``snapshot_min_interval``,
and at least one per ``snapshot_resync_seconds``); and a ``PendingPod`` for every pending pod whose
``schedulerName`` is the batch scheduler (``batch_scheduler_name``; none when it is empty), again after
``pending_retry_seconds`` while it stays pending -- these feed the inference service's batch mode.
Pods of any other scheduler (kube-scheduler with the extender: ``agmarl-scheduler``) are never
announced, so each pod is decided once, by whoever schedules it.
Each newly pending pod starts a trace. Decisions are not applied here: in a real cluster
kube-scheduler (extender mode) or the batch binder creates the Bindings, and the watch sees them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from prometheus_client import Gauge

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.cluster.filters import violations
from agmarl_common.core.cluster.model import to_dict
from agmarl_common.kube.client import load_api_client
from agmarl_common.core.reward import balance_std, utilisation_by_resource
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_state_collector.k8scache import Change
from agmarl_state_collector.k8ssource import KubernetesSource, WatchConfig
from agmarl_state_collector.settings import CollectorSettings
from agmarl_state_collector.snapshots import SnapshotPublisher, snapshot_message

SERVICE = "state-collector"


def watch_config(settings: CollectorSettings) -> WatchConfig:
    return WatchConfig(timeout_seconds=settings.watch_timeout_seconds, request_timeout=settings.watch_request_timeout,
                       backoff_base=settings.watch_backoff_base, backoff_max=settings.watch_backoff_max,
                       queue_size=settings.watch_queue_size)


def converters() -> tuple[Callable, Callable]:
    """(pod_from_api, node_from_api): Kubernetes API JSON dicts -> model.Pod / model.Node."""
    from agmarl_common.kube import convert as kubeconvert
    return kubeconvert.pod_from_k8s, kubeconvert.node_from_k8s


class KubernetesCollectorApp:
    def __init__(self, rt: ServiceRuntime, settings: CollectorSettings, source: KubernetesSource,
                 clock: Callable[[], float] = time.time):
        self.rt = rt
        self.settings = settings
        self.source = source
        self.clock = clock
        self.epoch = uuid.uuid4().hex  # this watch's run: a restarted collector resets every cluster view
        self.seq = 0
        self.announced: dict[str, float] = {}  # pending pod key -> when last published
        self.snapshots = SnapshotPublisher(rt, settings.max_message_bytes)
        reg = rt.registry
        self.pending_gauge = Gauge("agmarl_pending_pods", "Pods waiting for a node", registry=reg)
        self.util_gauge = Gauge("agmarl_cluster_utilisation_ratio", "Requested / allocatable", ["resource"],
                                registry=reg)
        self.balance_gauge = Gauge("agmarl_cluster_balance_std", "Std of node utilisation", registry=reg)
        self.violations_gauge = Gauge("agmarl_constraint_violations", "Hard-constraint violations in the state",
                                      registry=reg)
        self.watch_gauge = Gauge("agmarl_k8s_watch", "Kubernetes watch counters (lists, relists, reconnects, "
                                 "events, bookmarks, errors)", ["what"], registry=reg)

    def bound_pod(self, pod_key: str, node: str):
        """The pod as the watch sees it bound on ``node`` (with its GPU devices), or None."""
        state = self.source.cache.state
        i = state.index.get(node)
        return None if i is None else next((p for p in state.bound[i] if p.key == pod_key), None)

    async def on_changes(self, changes: list[Change]) -> None:
        cluster, now = self.settings.cluster, self.clock()
        for ch in changes:
            self.seq += 1  # one sequence for events and snapshots: graph-builder applies them in order
            pod = self.bound_pod(ch.pod_key, ch.node) if ch.type == "pod_bound" else None
            await self.rt.publish(subjects.event(cluster), m.ClusterEvent(
                cluster=cluster, seq=self.seq, epoch=self.epoch, type=ch.type, pod_key=ch.pod_key, node=ch.node,
                reason=ch.reason, time=now, pod=to_dict(pod) if pod is not None else {},
                gpus=list(pod.gpu_devices) if pod is not None else []))
            if ch.type != "pod_added":
                self.announced.pop(ch.pod_key, None)
        await self.announce_due(now)

    def batch_pending(self):
        name = self.settings.batch_scheduler_name
        if not name:
            return []
        return [p for p in self.source.cache.pending_pods() if p.scheduler_name == name]

    async def announce_due(self, now: float) -> int:
        """Publish PendingPod for batch-scheduler pods not yet announced, or announced too long ago."""
        cluster, count = self.settings.cluster, 0
        live = set()
        for pod in self.batch_pending():
            live.add(pod.key)
            last = self.announced.get(pod.key)
            if last is not None and now - last < self.settings.pending_retry_seconds:
                continue
            self.announced[pod.key] = now
            with self.rt.tracer.start_as_current_span(f"{SERVICE} pending_pod_seen") as span:
                span.set_attribute("agmarl.pod", pod.key)
                span.set_attribute("agmarl.cluster", cluster)
                await self.rt.publish(subjects.pending(cluster), m.PendingPod(
                    cluster=cluster, pod=to_dict(pod), seen_at=now, seq=self.seq))
            count += 1
        for key in [k for k in self.announced if k not in live]:
            del self.announced[key]
        return count

    async def publish_snapshot(self) -> None:
        cache = self.source.cache
        state = cache.state
        self.seq += 1
        found = violations(state)
        util = utilisation_by_resource(state)
        pending = cache.pending_pods()
        stats = {f"utilisation_{k}": v for k, v in util.items()}
        stats.update(balance=balance_std(state), pending=float(len(pending)), violations=float(len(found)),
                     bound=float(sum(len(b) for b in state.bound)), nodes=float(state.n_nodes))
        for k, v in util.items():
            self.util_gauge.labels(resource=k).set(v)
        self.balance_gauge.set(stats["balance"])
        self.pending_gauge.set(stats["pending"])
        self.violations_gauge.set(len(found))
        for what, value in vars(self.source.stats).items():
            self.watch_gauge.labels(what=what).set(value)
        await self.snapshots.publish(snapshot_message(self.settings.cluster, self.seq, self.clock(), state, pending,
                                                      stats, self.epoch))

    async def run_loop(self) -> None:
        """Snapshot on change (debounced) or every resync period; re-announce long-pending pods."""
        s = self.settings
        await self.source.synced.wait()
        while True:
            try:
                await asyncio.wait_for(self.source.changed.wait(), timeout=s.snapshot_resync_seconds)
            except TimeoutError:
                pass
            self.source.changed.clear()
            try:
                await self.publish_snapshot()
                await self.announce_due(self.clock())
            except Exception:  # noqa: BLE001 - the loop must survive one bad snapshot; the log has it
                self.rt.log.exception("snapshot failed")
            await asyncio.sleep(s.snapshot_min_interval)

    def health(self) -> str | None:
        if not self.source.alive:
            return "kubernetes watch threads stopped"
        if not self.source.synced.is_set():
            return "kubernetes not listed yet"
        return None


async def run_kubernetes(rt: ServiceRuntime, settings: CollectorSettings) -> int:
    """The ``source: kubernetes`` service: watch threads, publishing loop, until SIGTERM."""
    api_client = load_api_client(settings.kubeconfig, settings.kube_context)
    pod_from_api, node_from_api = converters()
    source = KubernetesSource(api_client, pod_from_api, node_from_api, watch_config(settings))
    app = KubernetesCollectorApp(rt, settings, source)
    rt.add_health_check(app.health)
    await rt.start()
    source.start()
    rt.spawn(source.run(app.on_changes), name="k8s-apply")
    rt.spawn(app.run_loop(), name="k8s-publish")
    try:
        return await rt.run_until_stopped()
    finally:
        await asyncio.to_thread(source.stop)
        api_client.close()
