"""Kubernetes API objects (camelCase JSON dicts: v1.Pod, v1.Node, lists of them) -> the cluster model.

Pure functions over plain dicts, as the API server and kube-scheduler's extender send them; the
extender and the Kubernetes watch share them. Errors in an object raise ``KubeConvertError``.

Resources follow kube-scheduler:
- quantities ("500m", "1Gi", "2", "1e3", "0.5", 2) are parsed exactly (``parse_quantity`` ->
  Fraction); cpu becomes milli-cpu rounded up (Quantity.MilliValue); memory and ephemeral storage
  become MiB, rounded UP for requests (never under-count a pod) and DOWN for node allocatable
  (never over-state a node);
- pod requests = sum over containers, then max with each init container (sidecars, i.e. init
  containers with ``restartPolicy: Always``, add to the sum and to every later init container), plus
  ``spec.overhead``; pod-level ``spec.resources.requests`` replace cpu/memory when set; a container
  resource with a limit and no request requests its limit (the API server's defaulting);
- node capacity is ``status.allocatable`` (``status.capacity`` where allocatable lacks a resource).

GPUs (model semantics in ``cluster.model``):
- ``nvidia.com/gpu: N`` (extended resource) -> N whole GPUs;
- a GPU share, the FGD simulator's convention: pod annotations ``alibabacloud.com/gpu-milli``
  (milli per GPU, 1..1000) and ``alibabacloud.com/gpu-count`` (default 1); ``agmarl.io/gpu-milli`` /
  ``agmarl.io/gpu-count`` are accepted as the same. A share (< 1000) needs count 1;
- allowed GPU models of a pod: annotation ``agmarl.io/gpu-models`` or
  ``alibabacloud.com/gpu-card-model`` ("A100|V100" or "A100,V100");
- node GPUs: allocatable ``nvidia.com/gpu`` (else ``alibabacloud.com/gpu-count``); the model from
  label ``nvidia.com/gpu.product`` (GPU feature discovery), ``alibabacloud.com/gpu-card-model`` or
  ``agmarl.io/gpu-model``.

Topology labels: a node's legacy ``failure-domain.beta.kubernetes.io/zone`` is copied to
``topology.kubernetes.io/zone`` when that is absent, and the first of ``RACK_LABELS`` to
``topology.agmarl.io/rack``. Readiness: the ``Ready`` condition ("True" = ready); a node without a
Ready condition counts as ready (kube-scheduler itself only looks at taints).

Not representable in the model (ignored): affinity ``namespaceSelector``, topology spread
``nodeAffinityPolicy`` / ``nodeTaintsPolicy``. ``matchLabelKeys`` are merged into the selector with
the pod's own label values, as kube-scheduler does. A pod affinity term without a labelSelector
matches no pod (Kubernetes' nil selector): it gets ``NIL_SELECTOR``.

The pieces live in ``kubeconvert_quantity`` (quantities, timestamps, readers), ``kubeconvert_pod``
(pods, selectors, affinity terms) and ``kubeconvert_node`` (nodes); this module re-exports them and
builds cluster states from lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState, Node, Pod, choose_gpus
from agmarl_common.kube.nodes import (
    GPU_COUNT_RESOURCE,
    GPU_MODEL_LABELS,
    LEGACY_ZONE_LABEL,
    RACK_LABELS,
    node_from_k8s,
)
from agmarl_common.kube.pods import (
    GPU_COUNT_ANNOTATIONS,
    GPU_MILLI_ANNOTATIONS,
    GPU_SPEC_ANNOTATIONS,
    INACTIVE_PHASES,
    NIL_SELECTOR,
    label_selector,
    parse_label_selector,
    pod_from_k8s,
    pod_is_active,
    pod_requests,
    qos_class,
)
from agmarl_common.kube.quantity import (
    GPU_RESOURCE,
    MIB,
    KubeConvertError,
    _list,
    count,
    cpu_milli,
    mib,
    parse_quantity,
    parse_time,
)

__all__ = [
    "GPU_COUNT_ANNOTATIONS", "GPU_COUNT_RESOURCE", "GPU_MILLI_ANNOTATIONS", "GPU_MODEL_LABELS", "GPU_RESOURCE",
    "GPU_SPEC_ANNOTATIONS", "INACTIVE_PHASES", "LEGACY_ZONE_LABEL", "MIB", "NIL_SELECTOR", "RACK_LABELS",
    "KubeConvertError", "cluster_state_from_k8s", "count", "cpu_milli", "items", "label_selector", "mib",
    "node_from_k8s", "nodes_from_k8s", "parse_label_selector", "parse_quantity", "parse_time", "pod_from_k8s",
    "pod_is_active", "pod_requests", "pods_from_k8s", "pods_on_nodes", "qos_class",
]


def items(obj: Any) -> list[Mapping[str, Any]]:
    """The objects of a v1.*List dict ({"items": [...]}) or a plain list; None -> []."""
    if obj is None:
        return []
    if isinstance(obj, Mapping):
        return _list(obj.get("items"), "items")
    return _list(obj, "list")


def nodes_from_k8s(obj: Any) -> tuple[Node, ...]:
    return tuple(node_from_k8s(n) for n in items(obj))


def pods_from_k8s(obj: Any, active_only: bool = True) -> tuple[Pod, ...]:
    return tuple(pod_from_k8s(p) for p in items(obj) if not active_only or pod_is_active(p))


# ---------------------------------------------------------------------------------------------
# Cluster state

def pods_on_nodes(nodes: Sequence[Node], pods: Iterable[Pod]) -> ClusterState:
    """A ClusterState of ``nodes`` holding every pod whose ``node_name`` is one of them.

    Built in one pass (no per-pod array copies). Kubernetes does not say which GPU devices a pod
    holds: pods keep their ``gpu_devices`` when set and valid, else they get the default device
    choice, else (an over-committed node) the least-used devices, so usage is always counted.
    """
    state = ClusterState.empty(tuple(nodes))
    cpu, mem, cnt, eph = (a.copy() for a in (state.cpu_used, state.mem_used, state.pods_used, state.eph_used))
    gpu, aff = state.gpu_used.copy(), state.affinity_pods.copy()
    bound: list[list[Pod]] = [[] for _ in state.nodes]
    for p in pods:
        i = state.index.get(p.node_name)
        if i is None:
            continue
        cpu[i] += p.cpu_milli
        mem[i] += p.memory_mib
        cnt[i] += 1
        eph[i] += p.ephemeral_mib
        aff[i] += p.has_pod_affinity
        devices = p.gpu_devices
        if p.num_gpu and not (devices and all(0 <= d < state.gpu_count[i] for d in devices)):
            free = np.where(np.arange(MAX_GPUS) < state.gpu_count[i], GPU_MILLI - gpu[i], 0)
            devices = choose_gpus(p, free)
            if devices is None:
                order = np.argsort(gpu[i, : state.gpu_count[i]], kind="stable")
                devices = tuple(int(d) for d in order[: (1 if p.is_gpu_share else p.num_gpu)])
            p = replace(p, gpu_devices=tuple(devices))
        for d in devices:
            gpu[i, d] += p.gpu_milli if p.is_gpu_share else GPU_MILLI
        bound[i].append(p)
    return replace(state, cpu_used=cpu, mem_used=mem, pods_used=cnt, eph_used=eph, gpu_used=gpu,
                   bound=tuple(tuple(b) for b in bound), affinity_pods=aff)


def cluster_state_from_k8s(node_list: Any, pod_list: Any) -> ClusterState:
    """v1.NodeList + v1.PodList (dicts or lists) -> ClusterState of the active, bound pods."""
    return pods_on_nodes(nodes_from_k8s(node_list), pods_from_k8s(pod_list))
