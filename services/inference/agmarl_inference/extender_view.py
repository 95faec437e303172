"""The extender's cluster view: ``NodeCache`` (the latest ClusterSnapshot, replaced atomically) and the
state one request is judged in (``request_state``: the cache for NodeNames requests, the request's own
nodes plus the cached pods on them for NodeList requests)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from agmarl_common import kubeconvert as kc
from agmarl_common import messages as m
from agmarl_common.cluster.model import ClusterState, Pod, state_from_dict, unbind
from agmarl_inference.extender_wire import ExtenderArgs


class NodeCache:
    """The inference service's cluster view: the latest snapshot state, replaced atomically."""

    def __init__(self, cluster: str):
        self.cluster = cluster
        self.state: ClusterState | None = None
        self.seq = -1
        self.updated_at = 0.0
        self.bound_keys: frozenset[str] = frozenset()
        self._latest: object = None

    @property
    def warm(self) -> bool:
        return self.state is not None

    def set_state(self, state: ClusterState, seq: int = 0, now: float | None = None) -> None:
        self.bound_keys = frozenset(p.key for pods in state.bound for p in pods)
        self.state, self.seq = state, seq
        self.updated_at = time.time() if now is None else now

    def pods_on(self, node_names: list[str]) -> list[Pod]:
        state = self.state
        if state is None:
            return []
        return [p for n in node_names if n in state.index for p in state.bound[state.index[n]]]

    async def on_snapshot(self, msg: m.ClusterSnapshot, ctx: Any = None) -> None:
        """ClusterSnapshot handler: decode off the event loop, keep only newer snapshots."""
        if msg.cluster != self.cluster:
            return
        self._latest = token = object()
        state = await asyncio.to_thread(state_from_dict, msg.state)
        if self._latest is token:  # a later snapshot that decoded first is not overwritten
            self.set_state(state, msg.seq)


@dataclass
class RequestState:
    state: ClusterState | None  # None: cache cold in cache mode
    names: list[str]  # the request's node names, in request order
    idx: list[int | None]  # their index in state (None: unknown)
    items: dict[str, dict] = field(default_factory=dict)  # nocache: name -> original node object
    unreadable: dict[str, str] = field(default_factory=dict)  # nocache: nodes that failed to convert


def request_state(pod: Pod, args: ExtenderArgs, cache: NodeCache) -> RequestState:
    """The state a request is judged in: the cache (NodeNames) or the given nodes + cached pods."""
    if args.Nodes is not None:
        nodes, items, unreadable, names = [], {}, {}, []
        for obj in args.Nodes.items:
            name = str((obj.get("metadata") or {}).get("name") or "")
            names.append(name)
            try:
                nodes.append(kc.node_from_k8s(obj))
                items[name] = obj
            except kc.KubeConvertError as exc:
                unreadable[name] = f"node object could not be read: {exc}"
        pods = [p for p in cache.pods_on([n.name for n in nodes]) if p.key != pod.key]
        state = kc.pods_on_nodes(nodes, pods)
        return RequestState(state, names, [state.index.get(n) for n in names], items, unreadable)
    names = list(args.NodeNames or [])
    state = cache.state
    if state is None:
        return RequestState(None, names, [None] * len(names))
    if pod.key in cache.bound_keys:  # a retry of a pod the snapshot already shows as bound
        state = unbind(state, pod.key)
    return RequestState(state, names, [state.index.get(n) for n in names])
