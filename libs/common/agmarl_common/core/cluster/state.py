"""Cluster usage: ``ClusterState`` (nodes, bound pods, numpy usage/capacity arrays), the default GPU
device choice, ``bind`` / ``unbind`` returning new states, and ``pod_index`` (the state's ``PodIndex``).
Import these through ``agmarl_common.core.cluster.model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from agmarl_common.core.cluster.podindex import PodIndex
from agmarl_common.core.cluster.specs import GPU_MILLI, MAX_GPUS, Node, Pod


@dataclass(frozen=True)
class ClusterState:
    """Nodes, what is bound to them, and what that uses.

    Arrays are indexed by node position in ``nodes``. ``gpu_used`` is (n_nodes, MAX_GPUS) milli
    used per device; a device j exists on node i iff j < nodes[i].gpu_count.
    Treat instances as immutable: ``bind`` / ``unbind`` return new states.
    """

    nodes: tuple[Node, ...]
    cpu_used: np.ndarray  # (n,) int64 milli
    mem_used: np.ndarray  # (n,) int64 MiB
    pods_used: np.ndarray  # (n,) int64
    eph_used: np.ndarray  # (n,) int64 MiB
    gpu_used: np.ndarray  # (n, MAX_GPUS) int64 milli per device
    bound: tuple[tuple[Pod, ...], ...]  # pods on each node
    index: Mapping[str, int] = field(default_factory=dict)
    # static capacity arrays, filled by ``empty`` from ``nodes`` (kept by ``replace``)
    cpu_cap: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mem_cap: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pods_cap: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    eph_cap: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gpu_count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gpu_model: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    schedulable: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # ready and not cordoned
    # measured load (for load-aware policies); None = use requests
    cpu_load: np.ndarray | None = None  # (n,) milli actually used
    mem_load: np.ndarray | None = None  # (n,) MiB actually used
    # derived indexes that let the hard filter skip work (filled by ``empty``, kept by bind/unbind)
    tainted: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # (n,) node has any taint
    affinity_pods: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (n,) bound pods with has_pod_affinity
    # bound pods grouped by labels and anti-affinity terms (see ``PodIndex``); kept by bind/unbind/unbind_at,
    # rebuilt by ``pod_index`` when absent or stale (a state made with ``replace(bound=...)``)
    pods_by_label: "PodIndex | None" = field(default=None, compare=False, repr=False)

    @staticmethod
    def empty(nodes: tuple[Node, ...] | list[Node]) -> "ClusterState":
        nodes = tuple(nodes)
        n = len(nodes)
        z = np.zeros(n, dtype=np.int64)
        bound: tuple[tuple[Pod, ...], ...] = tuple(() for _ in range(n))
        return ClusterState(
            nodes=nodes,
            cpu_used=z.copy(),
            mem_used=z.copy(),
            pods_used=z.copy(),
            eph_used=z.copy(),
            gpu_used=np.zeros((n, MAX_GPUS), dtype=np.int64),
            bound=bound,
            index={node.name: i for i, node in enumerate(nodes)},
            cpu_cap=np.array([nd.cpu_milli for nd in nodes], dtype=np.int64),
            mem_cap=np.array([nd.memory_mib for nd in nodes], dtype=np.int64),
            pods_cap=np.array([nd.max_pods for nd in nodes], dtype=np.int64),
            eph_cap=np.array([nd.ephemeral_mib for nd in nodes], dtype=np.int64),
            gpu_count=np.array([nd.gpu_count for nd in nodes], dtype=np.int64),
            gpu_model=np.array([nd.gpu_model for nd in nodes], dtype=object),
            schedulable=np.array([nd.ready and not nd.unschedulable for nd in nodes], dtype=bool),
            tainted=np.array([bool(nd.taints) for nd in nodes], dtype=bool),
            affinity_pods=z.copy(),
            pods_by_label=PodIndex.build(nodes, bound),
        )

    def with_nodes(self, nodes: tuple[Node, ...] | list[Node]) -> "ClusterState":
        """Same bound pods (matched by node name), new node specs; pods on vanished nodes are dropped."""
        fresh = ClusterState.empty(nodes)
        state = fresh
        for pods in self.bound:
            for p in pods:
                if p.node_name in fresh.index:
                    state = bind(state, p, fresh.index[p.node_name], p.gpu_devices)
        return state

    def node_index(self, name: str) -> int:
        return self.index[name]

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    def gpu_exists(self) -> np.ndarray:
        """(n, MAX_GPUS) bool: which device slots are real GPUs."""
        return np.arange(MAX_GPUS)[None, :] < self.gpu_count[:, None]

    def gpu_free(self) -> np.ndarray:
        """(n, MAX_GPUS) milli free per device (0 for slots that are not GPUs)."""
        return np.where(self.gpu_exists(), GPU_MILLI - self.gpu_used, 0)

    def all_pods(self) -> list[Pod]:
        return [p for pods in self.bound for p in pods]


def choose_gpus(pod: Pod, gpu_free_row: np.ndarray) -> tuple[int, ...] | None:
    """Default device choice on one node: best fit for a share, lowest free devices for whole GPUs.

    Returns device indexes, () for a pod without GPUs, or None when the node cannot host it.
    """
    if pod.num_gpu == 0:
        return ()
    if pod.is_gpu_share:
        ok = np.nonzero(gpu_free_row >= pod.gpu_milli)[0]
        if ok.size == 0:
            return None
        # tightest device that fits; ties -> lowest index
        best = ok[np.argmin(gpu_free_row[ok])]
        return (int(best),)
    whole = np.nonzero(gpu_free_row >= GPU_MILLI)[0]
    if whole.size < pod.num_gpu:
        return None
    return tuple(int(j) for j in whole[: pod.num_gpu])


def bind(state: ClusterState, pod: Pod, node_index: int, gpus: tuple[int, ...] = ()) -> ClusterState:
    """A new state with ``pod`` bound to node ``node_index`` on GPU devices ``gpus``."""
    i = node_index
    cpu, mem, cnt, eph = (a.copy() for a in (state.cpu_used, state.mem_used, state.pods_used, state.eph_used))
    gpu = state.gpu_used.copy()
    cpu[i] += pod.cpu_milli
    mem[i] += pod.memory_mib
    cnt[i] += 1
    eph[i] += pod.ephemeral_mib
    share = pod.gpu_milli if pod.is_gpu_share else GPU_MILLI
    for j in gpus:
        gpu[i, j] += share
    placed = replace(pod, node_name=state.nodes[i].name, gpu_devices=tuple(gpus))
    bound = state.bound[:i] + (state.bound[i] + (placed,),) + state.bound[i + 1 :]
    return replace(state, cpu_used=cpu, mem_used=mem, pods_used=cnt, eph_used=eph, gpu_used=gpu, bound=bound,
                   affinity_pods=_count_affinity(state.affinity_pods, i, pod, +1),
                   pods_by_label=_next_index(state, i, placed, bound, +1))


def unbind(state: ClusterState, pod_key: str) -> ClusterState:
    """A new state without the bound pod ``pod_key`` (namespace/name); unknown keys are a no-op."""
    for i, pods in enumerate(state.bound):
        for p in pods:
            if p.key == pod_key:
                return unbind_at(state, i, pod_key)
    return state


def unbind_at(state: ClusterState, node_index: int, pod_key: str) -> ClusterState:
    """``unbind`` for a pod known to be on node ``node_index``: looks at that node's pods only.

    The same state as ``unbind(state, pod_key)`` when the pod is there; a no-op when it is not."""
    i = node_index
    pods = state.bound[i]
    for k, p in enumerate(pods):
        if p.key == pod_key:
            cpu, mem, cnt, eph = (a.copy() for a in (state.cpu_used, state.mem_used, state.pods_used, state.eph_used))
            gpu = state.gpu_used.copy()
            cpu[i] -= p.cpu_milli
            mem[i] -= p.memory_mib
            cnt[i] -= 1
            eph[i] -= p.ephemeral_mib
            share = p.gpu_milli if p.is_gpu_share else GPU_MILLI
            for j in p.gpu_devices:
                gpu[i, j] -= share
            bound = state.bound[:i] + (pods[:k] + pods[k + 1 :],) + state.bound[i + 1 :]
            return replace(state, cpu_used=cpu, mem_used=mem, pods_used=cnt, eph_used=eph, gpu_used=gpu, bound=bound,
                           affinity_pods=_count_affinity(state.affinity_pods, i, p, -1),
                           pods_by_label=_next_index(state, i, p, bound, -1))
    return state


def _count_affinity(counts: np.ndarray, i: int, pod: Pod, delta: int) -> np.ndarray:
    """``affinity_pods`` after adding/removing ``pod`` on node i (unchanged array when it has no terms)."""
    if not pod.has_pod_affinity or i >= counts.shape[0]:
        return counts
    out = counts.copy()
    out[i] += delta
    return out


def state_with_bound(nodes: Sequence[Node], bound: Sequence[Sequence[Pod]]) -> ClusterState:
    """The state of ``nodes`` holding ``bound[i]`` on node i (pods as given, ``gpu_devices`` included),
    usage arrays summed from those pods in one pass; the ``PodIndex`` is built on demand (``pod_index``)."""
    state = ClusterState.empty(tuple(nodes))
    cpu, mem, cnt, eph, aff = (a.copy() for a in (state.cpu_used, state.mem_used, state.pods_used, state.eph_used,
                                                  state.affinity_pods))
    gpu = state.gpu_used.copy()
    for i, pods in enumerate(bound):
        for p in pods:
            cpu[i] += p.cpu_milli
            mem[i] += p.memory_mib
            cnt[i] += 1
            eph[i] += p.ephemeral_mib
            aff[i] += p.has_pod_affinity
            for j in p.gpu_devices:
                gpu[i, j] += p.gpu_milli if p.is_gpu_share else GPU_MILLI
    return replace(state, cpu_used=cpu, mem_used=mem, pods_used=cnt, eph_used=eph, gpu_used=gpu,
                   bound=tuple(tuple(pods) for pods in bound), affinity_pods=aff, pods_by_label=None)


def pod_index(state: ClusterState) -> PodIndex:
    """The state's ``PodIndex``, built (once per state object) when it is absent or describes other tuples."""
    idx = state.pods_by_label
    if idx is not None and idx.bound is state.bound and idx.nodes is state.nodes:
        return idx
    if idx is not None and idx.bound is state.bound:
        idx = replace(idx, nodes=state.nodes, node_cache={})
    else:
        idx = PodIndex.build(state.nodes, state.bound)
    object.__setattr__(state, "pods_by_label", idx)  # memo of derived data: the state's value is unchanged
    return idx


def _next_index(state: ClusterState, i: int, pod: Pod, bound: tuple, delta: int) -> PodIndex | None:
    """The index after a bind/unbind when the state's index is current, else None (rebuilt on demand)."""
    idx = state.pods_by_label
    if idx is None or idx.bound is not state.bound or len(bound) != len(state.bound):
        return None
    return (idx.add if delta > 0 else idx.remove)(i, pod, bound, state.nodes)
