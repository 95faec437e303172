"""The pure half of the Kubernetes source: API objects in, a current ``ClusterState`` and changes out.

``KubeCache`` keeps the nodes, the bound (running) pods and the pending pods it has been told about
and derives a ``model.ClusterState``. ``replace(kind, items)`` applies a full list (a relist: what
disappeared is deleted), ``apply(kind, type, obj)`` one watch event. Both return the ``Change``s
they caused, named like ``messages.ClusterEvent`` types. No I/O, threads or clocks in here: the
watch threads and the bus live in ``k8ssource`` / ``k8sapp``.

Pod lifecycle as the cache sees it:
- ``spec.nodeName`` empty and ``status.phase`` Pending -> pending (``pod_added`` when new);
- ``spec.nodeName`` set and phase not terminal -> bound, using node resources (``pod_bound``);
- phase Succeeded / Failed, or DELETED -> resources freed (``pod_deleted`` / ``pod_failed``).
Node lifecycle: new -> ``node_added``; Ready True -> False or DELETED -> ``node_failed``;
False -> True -> ``node_recovered``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Node, Pod, bind, choose_gpus, state_with_bound, unbind

PodConverter = Callable[[Mapping[str, Any]], Pod]
NodeConverter = Callable[[Mapping[str, Any]], Node]
TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Change:
    """One lifecycle change; ``type`` is a ``messages.ClusterEvent`` type."""

    type: str
    pod_key: str = ""
    node: str = ""
    reason: str = ""


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def pod_phase(obj: Mapping[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "Pending")


def build_state(nodes: Iterable[Node], pods: Iterable[Pod]) -> ClusterState:
    """A ClusterState from nodes and bound pods in one pass (pods on unknown nodes are left out);
    pods without GPU devices but asking for GPUs get the default device choice."""
    state = ClusterState.empty(tuple(nodes))
    gpu = state.gpu_used.copy()  # devices taken so far, for the default device choice
    bound: list[list[Pod]] = [[] for _ in state.nodes]
    for p in pods:
        i = state.index.get(p.node_name)
        if i is None:
            continue
        if p.num_gpu and not p.gpu_devices:
            free = np.where(state.gpu_exists()[i], GPU_MILLI - gpu[i], 0)
            p = replace(p, gpu_devices=choose_gpus(p, free) or _fallback_devices(p, int(state.gpu_count[i])))
        for j in p.gpu_devices:
            gpu[i, j] += p.gpu_milli if p.is_gpu_share else GPU_MILLI
        bound[i].append(p)
    return state_with_bound(state.nodes, bound)


def _fallback_devices(pod: Pod, gpu_count: int) -> tuple[int, ...]:
    """Devices for a pod the API says runs here although our view has no room: the first ones
    (the overcommit then shows up in ``filters.violations`` instead of vanishing)."""
    return tuple(range(min(pod.num_gpu, gpu_count)))


@dataclass
class KubeCache:
    """Nodes, bound pods and pending pods from the API; ``state`` is derived (see module docstring)."""

    pod_from_api: PodConverter
    node_from_api: NodeConverter
    nodes: dict[str, Node] = field(default_factory=dict)
    bound: dict[str, Pod] = field(default_factory=dict)  # key -> pod with node_name
    pending: dict[str, Pod] = field(default_factory=dict)
    resource_versions: dict[str, str] = field(default_factory=dict)  # "nodes" / "pods" -> last seen
    rejected: list[str] = field(default_factory=list)  # objects the converters could not read (in lists)
    _state: ClusterState | None = None

    @property
    def state(self) -> ClusterState:
        if self._state is None:
            self._state = build_state(sorted(self.nodes.values(), key=lambda n: n.name), self.bound.values())
        return self._state

    def pending_pods(self) -> list[Pod]:
        return sorted(self.pending.values(), key=lambda p: (p.creation_time, p.key))

    # --- whole lists ---------------------------------------------------------------------------

    def replace(self, kind: str, items: list[Mapping[str, Any]], rv: str) -> list[Change]:
        """Apply a full list of ``kind`` ("nodes" | "pods"): every item as ADDED/MODIFIED, and a
        DELETED for what the cache holds that the list no longer has."""
        changes: list[Change] = []
        seen = {object_key(o) for o in items}
        if kind == "nodes":
            gone = [n for n in self.nodes if n not in seen]
            for name in gone:
                changes += self._node_deleted(name)
        else:
            gone = [k for k in (*self.bound, *self.pending) if k not in seen]
            for key in gone:
                changes += self._pod_deleted(key, "deleted")
        for obj in items:
            try:
                changes += self.apply(kind, "MODIFIED", obj)
            except (KeyError, TypeError, ValueError) as exc:  # one unreadable object must not stop a relist
                self.rejected.append(f"{kind} {object_key(obj)}: {type(exc).__name__}: {exc}")
        self.resource_versions[kind] = rv
        return changes

    # --- one event -----------------------------------------------------------------------------

    def apply(self, kind: str, etype: str, obj: Mapping[str, Any]) -> list[Change]:
        """One watch event (ADDED | MODIFIED | DELETED | BOOKMARK); the resourceVersion advances."""
        rv = resource_version(obj)
        if rv:
            self.resource_versions[kind] = rv
        if etype == "BOOKMARK":
            return []
        if kind == "nodes":
            return self._node_deleted(object_key(obj)) if etype == "DELETED" else self._node_upsert(obj)
        if kind == "pods":
            return self._pod_event(etype, obj)
        raise ValueError(f"unknown kind {kind!r}")

    def _node_upsert(self, obj: Mapping[str, Any]) -> list[Change]:
        node = self.node_from_api(obj)
        old = self.nodes.get(node.name)
        if old == node:
            return []
        self.nodes[node.name] = node
        self._state = None
        if old is None:
            return [Change("node_added", node=node.name)]
        if old.ready and not node.ready:
            return [Change("node_failed", node=node.name, reason="NotReady")]
        if node.ready and not old.ready:
            return [Change("node_recovered", node=node.name)]
        return []

    def _node_deleted(self, name: str) -> list[Change]:
        if self.nodes.pop(name, None) is None:
            return []
        self._state = None
        return [Change("node_failed", node=name, reason="deleted")]

    def _pod_event(self, etype: str, obj: Mapping[str, Any]) -> list[Change]:
        key = object_key(obj)
        phase = pod_phase(obj)
        if etype == "DELETED":
            return self._pod_deleted(key, "deleted")
        if phase in TERMINAL_PHASES:
            return self._pod_deleted(key, phase)
        pod = self.pod_from_api(obj)
        if pod.node_name:
            return self._pod_bound(key, pod)
        if phase != "Pending" or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return []
        new = key not in self.pending
        self.pending[key] = pod
        return [Change("pod_added", pod_key=key)] if new else []

    def _pod_bound(self, key: str, pod: Pod) -> list[Change]:
        self.pending.pop(key, None)
        old = self.bound.get(key)
        if old is not None and _same_placement(old, pod):
            return []
        if old is not None and self._state is not None:
            self._state = unbind(self._state, key)
        self.bound[key] = pod
        if self._state is not None:
            i = self._state.index.get(pod.node_name)
            if i is not None:
                self._state = _bind_default(self._state, pod, i)
        return [] if old is not None and old.node_name == pod.node_name else [Change("pod_bound", key, pod.node_name)]

    def _pod_deleted(self, key: str, reason: str) -> list[Change]:
        if self.pending.pop(key, None) is not None:
            return [Change("pod_deleted", pod_key=key, reason=reason)]
        old = self.bound.pop(key, None)
        if old is None:
            return []
        if self._state is not None:
            self._state = unbind(self._state, key)
        kind = "pod_failed" if reason == "Failed" else "pod_deleted"
        return [Change(kind, pod_key=key, node=old.node_name, reason=reason)]


def _same_placement(a: Pod, b: Pod) -> bool:
    return (a.node_name, a.cpu_milli, a.memory_mib, a.num_gpu, a.gpu_milli, a.ephemeral_mib) == \
        (b.node_name, b.cpu_milli, b.memory_mib, b.num_gpu, b.gpu_milli, b.ephemeral_mib)


def _bind_default(state: ClusterState, pod: Pod, i: int) -> ClusterState:
    gpus = pod.gpu_devices
    if pod.num_gpu and not gpus:
        gpus = choose_gpus(pod, state.gpu_free()[i]) or _fallback_devices(pod, int(state.gpu_count[i]))
    return bind(state, pod, i, gpus)
