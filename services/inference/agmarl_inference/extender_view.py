"""The state one extender request is judged in (``request_state``): the process's cluster view (the
``ClusterView`` every decider shares) for NodeNames requests, the request's own nodes plus the view's pods
on them for NodeList requests."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from agmarl_common.kube import convert as kc
from agmarl_common.core.cluster.model import ClusterState, Pod, unbind_at
from agmarl_common.core.cluster.view import ClusterView
from agmarl_inference.extender_wire import ExtenderArgs


@dataclass
class RequestState:
    state: ClusterState | None  # None: cache cold in cache mode
    names: list[str]  # the request's node names, in request order
    index: np.ndarray  # their index in state (int64; -1: unknown)
    items: dict[str, dict] = field(default_factory=dict)  # nocache: name -> original node object
    unreadable: dict[str, str] = field(default_factory=dict)  # nocache: nodes that failed to convert

    @property
    def idx(self) -> list[int | None]:
        """``index`` as a list, None for an unknown node."""
        return [None if i < 0 else i for i in self.index.tolist()]


def _indexes(state: ClusterState, names: list[str]) -> np.ndarray:
    return np.fromiter(map(state.index.get, names, repeat(-1)), np.int64, len(names))


def pods_on(view: ClusterView, node_names: list[str]) -> list[Pod]:
    state = view.state
    if state is None:
        return []
    return [p for n in node_names if n in state.index for p in state.bound[state.index[n]]]


def request_state(pod: Pod, args: ExtenderArgs, view: ClusterView) -> RequestState:
    """The state a request is judged in: the view (NodeNames) or the given nodes + the view's pods."""
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
        pods = [p for p in pods_on(view, [n.name for n in nodes]) if p.key != pod.key]
        state = kc.pods_on_nodes(nodes, pods)
        return RequestState(state, names, _indexes(state, names), items, unreadable)
    names = list(args.NodeNames or [])
    state = view.state
    if state is None:
        return RequestState(None, names, np.full(len(names), -1, np.int64))
    if pod.key in view.where:  # a retry of a pod the view already shows as bound (or assumed)
        state = unbind_at(state, view.where[pod.key], pod.key)
    return RequestState(state, names, _indexes(state, names))
