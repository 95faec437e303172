"""Inference's replica of graph-builder's cluster graph: the one ``ClusterView`` every decider in this
process reads (the NATS decision loop, the extender's three verbs, the batch scheduler), holding
graph-builder's versions plus this process's own assumed decisions.

Graph updates are applied in version order; a gap, a new graph-builder epoch or a cold start asks
graph-builder for the full graph (``graph_sync``, request/reply). Full states decode off the event loop.
``bound_listeners`` hear the bindings each update shows (the extender publishes the decisions held for
them): ``(pod key, node)`` pairs of a delta's ``bound`` changes, or None after a full graph.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Iterable

from prometheus_client import Counter, Gauge

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.cluster import changes as ch
from agmarl_common.core.cluster.model import state_from_dict
from agmarl_common.core.cluster.view import ClusterView
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime

SYNC_TIMEOUT_S = 10.0  # a full graph of a large cluster takes a while to compact and send
SYNC_RETRY_S = 1.0


class GraphReplica:
    def __init__(self, rt: ServiceRuntime, cluster: str, assume_ttl: float = 30.0):
        self.rt = rt
        self.cluster = cluster
        self.view = ClusterView(assume_ttl=assume_ttl)
        self.ready = asyncio.Event()  # set once the view holds a full graph
        self._syncing: asyncio.Task | None = None
        self._full_token: object = None
        self.bound_listeners: list[Callable[[Iterable[tuple[str, str]] | None], None]] = []
        reg = rt.registry
        self.applied = Counter("agmarl_view_updates_total", "Graph versions applied to the cluster view",
                               ["kind"], registry=reg)
        self.syncs = Counter("agmarl_view_syncs_total", "Full graphs requested from graph-builder", ["reason"],
                             registry=reg)
        self.assumed_gauge = Gauge("agmarl_view_assumed_pods", "Decisions assumed, not yet observed bound",
                                   registry=reg)
        self.expired = Counter("agmarl_view_assumed_expired_total",
                               "Assumed pods whose binding was never observed (given back)", registry=reg)

    def details(self) -> dict:
        v = self.view
        return {"view_warm": v.warm, "view_version": v.seq, "view_assumed": len(v.assumed), "view_resets": v.resets,
                "view_gaps": v.gaps}

    async def on_update(self, msg: m.GraphUpdate, ctx: HandlerContext | None = None) -> None:
        if msg.cluster != self.cluster:
            return
        if msg.full:
            await self._apply_full(msg)
            return
        pos = self.view.position(msg.epoch, msg.version)
        if pos == "reset":
            self.request_sync("epoch" if self.view.warm else "cold")
            return
        if pos == "stale":
            return
        self.view.accept(msg.epoch, msg.version)
        changes = ch.check(msg.changes)
        ch.apply(self.view, changes)
        self.applied.labels(kind="delta").inc()
        if self.bound_listeners:
            bound = [(f"{c['pod'].get('namespace', 'default')}/{c['pod'].get('name', '')}", c["node"])
                     for c in changes if c["op"] == "bound"]
            if bound:
                self._tell(bound)
        self.assumed_gauge.set(len(self.view.assumed))
        if pos == "gap":
            self.request_sync("gap")

    async def _apply_full(self, msg: m.GraphUpdate) -> None:
        if not msg.state or self.view.position(msg.epoch, msg.version) == "stale":
            return
        self._full_token = token = object()
        state = await asyncio.to_thread(state_from_dict, msg.state)
        if self._full_token is not token or self.view.position(msg.epoch, msg.version) == "stale":
            return  # a newer full graph or later deltas arrived while this one decoded
        self.view.apply_snapshot(msg.epoch, msg.version, state)
        self.applied.labels(kind="full").inc()
        self.ready.set()
        self._tell(None)

    def _tell(self, bound: list[tuple[str, str]] | None) -> None:
        for listener in self.bound_listeners:
            try:
                listener(bound)
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the view
                self.rt.log.exception("bound listener failed")

    def request_sync(self, reason: str) -> None:
        """Ask graph-builder for the full graph (one request at a time, retried until it answers)."""
        if self._syncing is not None and not self._syncing.done():
            return
        self.syncs.labels(reason=reason).inc()
        self._syncing = self.rt.spawn(self._sync(), name="graph-sync")

    async def _sync(self) -> None:
        while True:
            try:
                reply = await self.rt.bus.request(subjects.graph_sync(self.cluster),
                                                  m.GraphSync(cluster=self.cluster), m.GraphUpdate,
                                                  timeout=SYNC_TIMEOUT_S)
                if reply.state:
                    await self._apply_full(reply)
                    return
            except Exception as exc:  # noqa: BLE001 - no graph-builder yet, or a timeout: try again
                self.rt.log.info("graph sync: %s: %s (retrying)", type(exc).__name__, exc)
            if self.view.warm and self.ready.is_set():
                return  # a full graph arrived on the update subject meanwhile
            await asyncio.sleep(SYNC_RETRY_S)

    async def expire_loop(self, period: float = 1.0) -> None:
        """Give back assumed pods whose binding was never observed."""
        while True:
            await asyncio.sleep(period)
            gone = self.view.expire(time.time())
            if gone:
                self.expired.inc(len(gone))
                self.rt.log.info("assumed pods expired (binding never observed): %s", ", ".join(gone[:10]))
            self.assumed_gauge.set(len(self.view.assumed))
