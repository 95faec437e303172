"""graph-builder: owns the whole-cluster graph (nodes, topology, bound pods) and publishes it versioned.

It applies the state-collector's snapshots and ordered events to a ``ClusterView`` and publishes each
change as a ``GraphUpdate``: a delta (the ``cluster.changes`` an event or a snapshot diff makes) or, when
the node set changed or the collector restarted, the full state. Versions are consecutive within
graph-builder's own epoch, so a replica (inference's cluster view) that misses one asks for the full
graph on ``graph_sync``. Per pending pod nothing happens here: inference decides on its replica.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from prometheus_client import Counter, Gauge

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.cluster import changes as ch
from agmarl_common.core.cluster.compact import compact_snapshot
from agmarl_common.core.cluster.model import state_from_dict
from agmarl_common.core.cluster.view import ClusterView
from agmarl_common.runtime.heap import settle
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_common.runtime.settings import load_settings
from agmarl_graph_builder.settings import GraphBuilderSettings

SERVICE = "graph-builder"
SNAPSHOT_CPU_SHARE = 0.1  # at most this share of a core goes to decoding snapshots the events made redundant


class GraphBuilderApp:
    def __init__(self, rt: ServiceRuntime, settings: GraphBuilderSettings):
        self.rt = rt
        self.settings = settings
        self.view = ClusterView()  # observed only: graph-builder never assumes
        self.epoch = uuid.uuid4().hex  # graph versions of this process
        self.version = 0
        self.full_state: dict[str, Any] | None = None  # compact form of the view at ``full_version``
        self.full_version = -1
        self.lock = asyncio.Lock()  # one update at a time, in order
        # Events carry every change, so a snapshot only checks and repairs the view: one is decoded at most
        # every SNAPSHOT_CPU_SHARE^-1 x its own decode time (a 1,523-node snapshot costs ~0.25 s), at once
        # when the view is cold, reset or missed an event
        self.next_snapshot_at = 0.0
        self.repair = False
        reg = rt.registry
        self.updates = Counter("agmarl_graph_updates_total", "Graph versions published", ["kind"], registry=reg)
        self.version_gauge = Gauge("agmarl_graph_version", "Current graph version", registry=reg)
        self.skipped = Counter("agmarl_graph_snapshots_skipped_total",
                               "Snapshots not decoded: the events kept the view current (checked periodically)",
                               registry=reg)
        self.dropped = Counter("agmarl_graph_events_dropped_total",
                               "Collector events not applied (stale, before the first snapshot, or unusable)",
                               ["reason"], registry=reg)

    def details(self) -> dict[str, Any]:
        state = self.view.state
        return {"graph_version": self.version, "graph_epoch": self.epoch, "collector_seq": self.view.seq,
                "nodes": state.n_nodes if state is not None else 0,
                "bound_pods": len(self.view.where), "resets": self.view.resets, "gaps": self.view.gaps}

    async def _publish(self, full: bool, state: dict[str, Any] | None = None,
                       changes: list[dict[str, Any]] | None = None) -> None:
        self.version += 1
        self.version_gauge.set(self.version)
        self.updates.labels(kind="full" if full else "delta").inc()
        if full:
            self.full_state, self.full_version = state, self.version
        await self.rt.publish(subjects.graph(self.settings.cluster), m.GraphUpdate(
            cluster=self.settings.cluster, epoch=self.epoch, version=self.version, full=full,
            state=state or {}, changes=changes or [], time=time.time()))

    async def on_snapshot(self, msg: m.ClusterSnapshot, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster:
            return
        pos = self.view.position(msg.epoch, msg.seq)
        if pos == "stale":
            return
        if pos != "reset" and not self.repair and time.monotonic() < self.next_snapshot_at:
            self.skipped.inc()
            return
        started = time.monotonic()
        state = await asyncio.to_thread(state_from_dict, msg.state)  # ~0.1 s of CPU: off the event loop
        async with self.lock:
            pos = self.view.position(msg.epoch, msg.seq)
            if pos == "stale":  # events after it were applied while it decoded
                return
            old = self.view.state
            diff = ch.diff(old, state) if old is not None and pos != "reset" else None
            self.view.apply_snapshot(msg.epoch, msg.seq, state)
            self.repair = False
            self.next_snapshot_at = time.monotonic() + (time.monotonic() - started) / SNAPSHOT_CPU_SHARE
            if diff is None:
                await self._publish(True, state=msg.state)  # the view now equals the snapshot: forward it
                settle()  # the cluster just taken lives on: out of full collections (each scanned it, ~10+ ms)
            elif diff:
                self.rt.log.debug("snapshot seq %d repaired %d changes the events had not", msg.seq, len(diff))
                await self._publish(False, changes=diff)

    async def on_event(self, msg: m.ClusterEvent, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster:
            return
        async with self.lock:
            gaps = self.view.gaps
            if not self.view.accept(msg.epoch, msg.seq):
                self.dropped.labels(reason="stale" if self.view.warm else "no_snapshot").inc()
                self.repair = self.repair or self.view.position(msg.epoch, msg.seq) == "reset"
                return
            self.repair = self.repair or self.view.gaps > gaps
            try:
                change = ch.from_event(msg.type, msg.pod_key, msg.node, msg.pod, list(msg.gpus))
                if change is None:
                    self.repair = self.repair or msg.type == "node_added"  # a new node comes with the next snapshot
                    return
                ch.apply(self.view, [change])
            except (ValueError, KeyError, TypeError) as exc:
                self.dropped.labels(reason="unusable").inc()
                self.repair = True
                self.rt.log.warning("event seq %d (%s) not applied: %s; the next snapshot repairs the view",
                                    msg.seq, msg.type, exc)
                return
            await self._publish(False, changes=[change])

    async def on_sync(self, msg: m.GraphSync, ctx: HandlerContext) -> m.GraphUpdate:
        """A replica asks for the full graph: the current view, compacted (cached until it changes)."""
        async with self.lock:
            state = self.view.state
            if state is not None and (self.full_version != self.version or self.full_state is None):
                self.full_state = await asyncio.to_thread(compact_snapshot, state)
                self.full_version = self.version
            return m.GraphUpdate(cluster=self.settings.cluster, epoch=self.epoch, version=self.version, full=True,
                                 state=self.full_state if state is not None else {}, time=time.time())


async def main() -> int:
    settings = load_settings(GraphBuilderSettings)
    rt = ServiceRuntime(SERVICE, settings)
    app = GraphBuilderApp(rt, settings)
    cluster = settings.cluster
    rt.handle(subjects.snapshot(cluster), m.ClusterSnapshot)(app.on_snapshot)
    rt.handle(subjects.event(cluster), m.ClusterEvent)(app.on_event)
    rt.handle_request(subjects.graph_sync(cluster), m.GraphSync, m.GraphUpdate)(app.on_sync)
    rt.health_details = app.details
    await rt.start()
    return await rt.run_until_stopped()
