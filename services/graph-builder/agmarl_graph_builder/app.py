"""graph-builder: snapshots and decisions keep the graph cache current; each pending pod becomes a
graph request (candidates after the hard filter and their features), continuing the pod's trace."""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import Counter, Gauge

from agmarl_common import messages as m
from agmarl_common import subjects
from agmarl_common.cluster.model import pod_from_dict
from agmarl_common.service import HandlerContext, ServiceRuntime
from agmarl_common.settings import load_settings
from agmarl_common.telemetry import extract
from agmarl_graph_builder.cache import GraphCache, coupled
from agmarl_graph_builder.settings import GraphBuilderSettings

SERVICE = "graph-builder"


class GraphBuilderApp:
    def __init__(self, rt: ServiceRuntime, settings: GraphBuilderSettings):
        self.rt = rt
        self.settings = settings
        self.cache = GraphCache()
        self.buffer: list[tuple[m.PendingPod, dict]] = []  # waiting for the first snapshot
        self.deferred: deque[tuple[m.PendingPod, dict]] = deque()  # waiting for coupled peers' decisions
        self.graphs = Counter("agmarl_graphs_built_total", "Graph requests built", registry=rt.registry)
        self.seq_gauge = Gauge("agmarl_graph_snapshot_seq", "Sequence of the cached snapshot", registry=rt.registry)

    async def on_snapshot(self, msg: m.ClusterSnapshot, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster or not self.cache.on_snapshot(msg.seq, msg.state, time.time()):
            return
        self.seq_gauge.set(msg.seq)
        buffered, self.buffer = self.buffer, []
        for pending, headers in buffered:
            await self._build_later(pending, headers)
        await self._release_deferred()

    async def on_decision(self, msg: m.Decision, ctx: HandlerContext) -> None:
        if msg.cluster == self.settings.cluster:
            self.cache.on_decision(msg.pod_key, msg.node, tuple(msg.gpus), time.time(), msg.origin,
                                  msg.origin_seq)
            await self._release_deferred()

    async def _release_deferred(self) -> None:
        """Build deferred pods, in arrival order, as far as their coupled peers are decided."""
        now = time.time()
        while self.deferred:
            pending, headers = self.deferred[0]
            if self.cache.waits(pod_from_dict(pending.pod), now, self.settings.coupled_timeout_seconds):
                return
            self.deferred.popleft()
            await self._build_later(pending, headers)

    async def _build_later(self, pending: m.PendingPod, headers: dict) -> None:
        # continue the pod's own trace, not the trace of the message that released it
        with self.rt.tracer.start_as_current_span(f"{SERVICE} pending_pod", context=extract(headers)) as span:
            await self._build(pending, span)

    async def on_pending(self, msg: m.PendingPod, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster:
            return
        if self.cache.state is None:
            if len(self.buffer) < self.settings.max_buffered:
                self.buffer.append((msg, dict(ctx.headers or {})))
            else:
                self.rt.log.warning("no snapshot yet and buffer full: dropping pending pod %s (it will be re-announced)",
                                    msg.pod.get("name"))
            return
        pod = pod_from_dict(msg.pod)
        if self.deferred or self.cache.waits(pod, time.time(), self.settings.coupled_timeout_seconds):
            if self.deferred and not coupled(pod):
                await self._build(msg, ctx.span)  # independent pods never wait behind coupled ones
                return
            self.deferred.append((msg, dict(ctx.headers or {})))
            return
        await self._build(msg, ctx.span)

    async def _build(self, msg: m.PendingPod, span) -> None:
        pod = pod_from_dict(msg.pod)
        names, features, reasons = self.cache.build(pod, self.settings.max_reasons, time.time())
        span.set_attribute("agmarl.pod", pod.key)
        span.set_attribute("agmarl.candidates", len(names))
        self.graphs.inc()
        await self.rt.publish(subjects.graph(self.settings.cluster), m.GraphRequest(
            cluster=msg.cluster, snapshot_seq=self.cache.seq, pod=msg.pod, seen_at=msg.seen_at,
            candidates=names, features=features, filtered_out=reasons, decisions_seen=dict(self.cache.seen)))


async def main() -> int:
    settings = load_settings(GraphBuilderSettings)
    rt = ServiceRuntime(SERVICE, settings)
    app = GraphBuilderApp(rt, settings)
    cluster = settings.cluster
    rt.handle(subjects.snapshot(cluster), m.ClusterSnapshot)(app.on_snapshot)
    rt.handle(subjects.decision_wildcard(cluster), m.Decision)(app.on_decision)
    rt.handle(subjects.pending(cluster), m.PendingPod, queue=settings.queue_group)(app.on_pending)
    await rt.start()
    return await rt.run_until_stopped()
