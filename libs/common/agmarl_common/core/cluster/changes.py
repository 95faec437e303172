"""Changes to a cluster view as plain data: what travels in a graph update between full states.

A change is a dict (msgpack-friendly):
- ``{"op": "bound", "pod": <pod dict>, "node": name, "gpus": [..]}``
- ``{"op": "removed", "pod_key": key}``
- ``{"op": "node_ready", "node": name, "ready": bool}``
- ``{"op": "load", "cpu": [..] | None, "mem": [..] | None}`` (measured load of every node)
- ``{"op": "rejected", "pod_key": key, "node": name}`` (a bind to ``node`` was refused: a view forgets the pod
  if it assumed it there)

``diff(old, new)`` lists the changes that turn ``old`` into ``new`` when both have the same nodes (None
when they do not: a full state is due); ``apply(view, changes)`` applies them to a ``ClusterView``.
Pure functions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from agmarl_common.core.cluster.codec import pod_from_dict, to_dict
from agmarl_common.core.cluster.state import ClusterState
from agmarl_common.core.cluster.specs import Node
from agmarl_common.core.cluster.view import ClusterView

OPS = ("bound", "removed", "node_ready", "load", "rejected")


def nodes_changed(state: ClusterState, nodes: tuple[Node, ...]) -> bool:
    """Whether ``nodes`` differ from the view's nodes in anything but readiness (a full state is due)."""
    if len(nodes) != state.n_nodes:
        return True
    return any(a.name != b.name or replace(a, ready=True) != replace(b, ready=True)
               for a, b in zip(state.nodes, nodes))


def bound_change(pod: Any, node: str, gpus: tuple[int, ...] | list[int]) -> dict[str, Any]:
    return {"op": "bound", "pod": to_dict(pod) if not isinstance(pod, dict) else pod, "node": node,
            "gpus": [int(g) for g in gpus]}


def removed_change(pod_key: str) -> dict[str, Any]:
    return {"op": "removed", "pod_key": pod_key}


def rejected_change(pod_key: str, node: str = "") -> dict[str, Any]:
    return {"op": "rejected", "pod_key": pod_key, "node": node}


def node_ready_change(node: str, ready: bool) -> dict[str, Any]:
    return {"op": "node_ready", "node": node, "ready": bool(ready)}


def load_change(state: ClusterState) -> dict[str, Any]:
    return {"op": "load", "cpu": None if state.cpu_load is None else state.cpu_load.tolist(),
            "mem": None if state.mem_load is None else state.mem_load.tolist()}


def _same_load(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(np.array_equal(a, b))


def diff(old: ClusterState, new: ClusterState) -> list[dict[str, Any]] | None:
    """Changes from ``old`` to ``new`` (module docstring); None when the node set or specs changed."""
    if nodes_changed(old, new.nodes):
        return None
    out: list[dict[str, Any]] = []
    for i, (a, b) in enumerate(zip(old.nodes, new.nodes)):
        if a.ready != b.ready:
            out.append(node_ready_change(b.name, b.ready))
    was = {p.key: (i, p.gpu_devices) for i, pods in enumerate(old.bound) for p in pods}
    now = {p.key: (i, p) for i, pods in enumerate(new.bound) for p in pods}
    for key, (i, _) in was.items():
        if key not in now or now[key][0] != i or now[key][1].gpu_devices != was[key][1]:
            out.append(removed_change(key))
    for key, (i, pod) in now.items():
        if key not in was or was[key][0] != i or was[key][1] != pod.gpu_devices:
            out.append(bound_change(pod, new.nodes[i].name, pod.gpu_devices))
    if not (_same_load(old.cpu_load, new.cpu_load) and _same_load(old.mem_load, new.mem_load)):
        out.append(load_change(new))
    return out


def apply(view: ClusterView, changes: list[dict[str, Any]]) -> None:
    """Apply changes in order (unknown ops raise ValueError: the message was validated before)."""
    for ch in changes:
        op = ch.get("op")
        if op == "bound":
            view.observe_bound(pod_from_dict(ch["pod"]), str(ch["node"]), tuple(int(g) for g in ch.get("gpus") or ()))
        elif op == "removed":
            view.observe_removed(str(ch["pod_key"]))
        elif op == "node_ready":
            view.observe_node_ready(str(ch["node"]), bool(ch["ready"]))
        elif op == "rejected":
            view.forget(str(ch["pod_key"]), str(ch.get("node") or ""))
        elif op == "load":
            cpu, mem = ch.get("cpu"), ch.get("mem")
            view.observe_load(None if cpu is None else np.asarray(cpu), None if mem is None else np.asarray(mem))
        else:
            raise ValueError(f"unknown change op {op!r} (known: {', '.join(OPS)})")


EVENT_CHANGES = {"pod_deleted": "removed", "pod_failed": "removed", "pod_evicted": "removed",
                 "node_failed": "node_ready", "node_recovered": "node_ready", "bind_rejected": "rejected"}


def from_event(etype: str, pod_key: str, node: str, pod: dict[str, Any], gpus: list[int]) -> dict[str, Any] | None:
    """The change a cluster event makes (None: it changes no placement, e.g. pod_added). A pod_bound
    event without its pod cannot be applied: ValueError (the next full state repairs the view)."""
    if etype == "pod_bound":
        if not pod:
            raise ValueError(f"pod_bound event for {pod_key!r} does not carry the pod")
        return bound_change(pod, node, gpus)
    kind = EVENT_CHANGES.get(etype)
    if kind == "removed":
        return removed_change(pod_key)
    if kind == "rejected":
        return rejected_change(pod_key, node)
    if kind == "node_ready":
        return node_ready_change(node, etype == "node_recovered")
    return None


def check(changes: Any) -> list[dict[str, Any]]:
    """Validate the shape of a change list from the wire; ValueError with the first problem."""
    if not isinstance(changes, list):
        raise ValueError("changes must be a list")
    need = {"bound": ("pod", "node"), "removed": ("pod_key",), "node_ready": ("node", "ready"), "load": (),
            "rejected": ("pod_key",)}
    for k, ch in enumerate(changes):
        if not isinstance(ch, dict) or ch.get("op") not in need:
            raise ValueError(f"change {k}: not a known op")
        missing = [f for f in need[ch["op"]] if f not in ch]
        if missing:
            raise ValueError(f"change {k} ({ch['op']}): missing {', '.join(missing)}")
    return changes
