"""Hard-filter checks that look at one node only: the filter status, NodeUnschedulable,
TaintToleration, NodeAffinity, and NodeResourcesFit incl. GPUs (per node and, in ``fits_resources_mask``,
for every node at once). Import these through ``agmarl_common.core.cluster.filters``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState, Node, Pod, Taint, choose_gpus
from agmarl_common.core.cluster.selectors import (
    NO_EXECUTE,
    NO_SCHEDULE,
    TAINT_NOT_READY,
    TAINT_UNSCHEDULABLE,
    first_untolerated,
    is_tolerated,
    pod_matches_node_affinity,
)


@dataclass(frozen=True)
class FilterStatus:
    ok: bool
    plugin: str = ""
    reason: str = ""


OK = FilterStatus(True)


def _fail(plugin: str, reason: str) -> FilterStatus:
    return FilterStatus(False, plugin, reason)


# ---------------------------------------------------------------------------------------------
# Node-only checks


def fits_node_unschedulable(pod: Pod, node: Node) -> FilterStatus:
    """Cordoned nodes need a toleration of ``node.kubernetes.io/unschedulable:NoSchedule``; not-ready
    nodes carry ``node.kubernetes.io/not-ready`` with NoSchedule and NoExecute, both must be tolerated."""
    if node.unschedulable and not is_tolerated(pod.tolerations, Taint(TAINT_UNSCHEDULABLE, "", NO_SCHEDULE)):
        return _fail("NodeUnschedulable", "node(s) were unschedulable")
    if not node.ready:
        for effect in (NO_SCHEDULE, NO_EXECUTE):
            if not is_tolerated(pod.tolerations, Taint(TAINT_NOT_READY, "", effect)):
                return _fail("NodeUnschedulable", "node(s) were not ready")
    return OK


def fits_taints(pod: Pod, node: Node) -> FilterStatus:
    """TaintToleration: an untolerated NoSchedule or NoExecute taint fails; PreferNoSchedule does not."""
    taint = first_untolerated(node.taints, pod.tolerations)
    if taint is not None:
        return _fail("TaintToleration", f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}")
    return OK


def fits_node_selector(pod: Pod, node: Node) -> FilterStatus:
    """NodeAffinity: spec.nodeSelector AND required node affinity (terms ORed)."""
    if not pod_matches_node_affinity(pod, node):
        return _fail("NodeAffinity", "node(s) didn't match Pod's node affinity/selector")
    return OK


# ---------------------------------------------------------------------------------------------
# Resources


def _gpu_free_row(state: ClusterState, i: int) -> np.ndarray:
    exists = np.arange(MAX_GPUS) < state.gpu_count[i]
    return np.where(exists, GPU_MILLI - state.gpu_used[i], 0)


def fits_gpu(pod: Pod, state: ClusterState, i: int) -> FilterStatus:
    """GPU model (``gpu_spec``), then devices: a share needs one device with that much free milli,
    whole GPUs need ``num_gpu`` fully free devices (exactly when ``choose_gpus`` finds devices)."""
    if pod.num_gpu == 0:
        return OK
    if pod.gpu_spec and state.gpu_model[i] not in pod.gpu_spec:
        return _fail("NodeResourcesFit", "node(s) didn't match Pod's gpu_spec")
    if state.gpu_count[i] == 0 or choose_gpus(pod, _gpu_free_row(state, i)) is None:  # no devices: none free
        return _fail("NodeResourcesFit", "Insufficient nvidia.com/gpu")
    return OK


def fits_resources(pod: Pod, state: ClusterState, i: int) -> FilterStatus:
    """NodeResourcesFit: pod count, then cpu, memory, ephemeral storage (only on nodes that track it),
    then GPUs. A zero request always fits that resource, as in kube-scheduler."""
    if state.pods_used[i] + 1 > state.pods_cap[i]:
        return _fail("NodeResourcesFit", "Too many pods")
    if pod.cpu_milli > 0 and pod.cpu_milli > state.cpu_cap[i] - state.cpu_used[i]:
        return _fail("NodeResourcesFit", "Insufficient cpu")
    if pod.memory_mib > 0 and pod.memory_mib > state.mem_cap[i] - state.mem_used[i]:
        return _fail("NodeResourcesFit", "Insufficient memory")
    if pod.ephemeral_mib > 0 and state.eph_cap[i] > 0 and pod.ephemeral_mib > state.eph_cap[i] - state.eph_used[i]:
        return _fail("NodeResourcesFit", "Insufficient ephemeral-storage")
    return fits_gpu(pod, state, i)


# Row k: the (n, MAX_GPUS) bool "device exists" row of a node with k GPUs, as one uint64 of 0/1 bytes.
_EXISTS_BYTES = (np.arange(MAX_GPUS + 1)[:, None] > np.arange(MAX_GPUS)[None, :])
_EXISTS_U64 = _EXISTS_BYTES.view(np.uint64).ravel() if MAX_GPUS == 8 else None


def _devices_at_most(state: ClusterState, limit: int) -> np.ndarray:
    """(n,) number of existing GPU devices with at most ``limit`` milli used.

    With 8 device slots a node's row of bools is one uint64, so the per-row count is a popcount:
    ~10x faster than a numpy reduction over an axis of length 8."""
    counts = np.minimum(state.gpu_count, MAX_GPUS)
    if _EXISTS_U64 is not None:
        rows = np.ascontiguousarray(state.gpu_used <= limit).view(np.uint64).ravel()
        return np.bitwise_count(rows & _EXISTS_U64[counts]).astype(np.int64)
    return ((state.gpu_used <= limit) & _EXISTS_BYTES[counts]).sum(axis=1)


def fits_resources_mask(pod: Pod, state: ClusterState) -> np.ndarray:
    """(n_nodes,) bool: ``fits_resources(pod, state, i).ok`` (GPUs included) for every node, computed in bulk."""
    mask = state.pods_used + 1 <= state.pods_cap
    if pod.cpu_milli > 0:
        mask &= state.cpu_cap - state.cpu_used >= pod.cpu_milli
    if pod.memory_mib > 0:
        mask &= state.mem_cap - state.mem_used >= pod.memory_mib
    if pod.ephemeral_mib > 0:
        mask &= (state.eph_cap == 0) | (state.eph_cap - state.eph_used >= pod.ephemeral_mib)
    if pod.num_gpu == 0:
        return mask
    limit = GPU_MILLI - pod.gpu_milli if pod.is_gpu_share else 0  # most a device may already use
    need = 1 if pod.is_gpu_share else pod.num_gpu
    mask &= _devices_at_most(state, limit) >= need
    if pod.gpu_spec:
        spec = np.zeros(state.n_nodes, dtype=bool)
        for model in pod.gpu_spec:
            spec |= state.gpu_model == model
        mask &= spec
    return mask
