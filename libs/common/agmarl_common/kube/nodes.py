"""v1.Node (camelCase dict) -> model.Node: allocatable, GPUs and their model, topology labels,
taints and readiness (the rules are in ``kubeconvert``'s docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from agmarl_common.core.cluster.model import MAX_GPUS, RACK_LABEL, ZONE_LABEL, Node, Taint
from agmarl_common.kube.quantity import (
    GPU_RESOURCE,
    KubeConvertError,
    _first,
    _list,
    _resources,
    _str_map,
    count,
    cpu_milli,
    mib,
)

GPU_COUNT_RESOURCE = "alibabacloud.com/gpu-count"
GPU_MODEL_LABELS = ("nvidia.com/gpu.product", "alibabacloud.com/gpu-card-model", "agmarl.io/gpu-model")
LEGACY_ZONE_LABEL = "failure-domain.beta.kubernetes.io/zone"
RACK_LABELS = (RACK_LABEL, "topology.kubernetes.io/rack", "rack")


def node_from_k8s(obj: Mapping[str, Any]) -> Node:
    """v1.Node (dict) -> model.Node."""
    if not isinstance(obj, Mapping):
        raise KubeConvertError("node: expected a map")
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    name = meta.get("name")
    if not name:
        raise KubeConvertError("node: metadata.name is missing")
    where = f"node {name}"
    labels = _str_map(meta.get("labels"), f"{where} labels")
    if ZONE_LABEL not in labels and labels.get(LEGACY_ZONE_LABEL):
        labels[ZONE_LABEL] = labels[LEGACY_ZONE_LABEL]
    rack = _first(labels, RACK_LABELS)
    if rack is not None:
        labels.setdefault(RACK_LABEL, rack)
    alloc = {**_resources(status.get("capacity"), f"{where} capacity"),
             **_resources(status.get("allocatable"), f"{where} allocatable")}
    gpus = count(alloc.get(GPU_RESOURCE, alloc.get(GPU_COUNT_RESOURCE, Fraction(0))))
    if not 0 <= gpus <= MAX_GPUS:
        raise KubeConvertError(f"{where}: {gpus} GPUs, the model holds 0..{MAX_GPUS}")
    taints = []
    for t in _list(spec.get("taints"), where):
        if not isinstance(t, Mapping) or not t.get("key") or not t.get("effect"):
            raise KubeConvertError(f"{where}: a taint needs key and effect")
        taints.append(Taint(str(t["key"]), str(t.get("value") or ""), str(t["effect"])))
    ready = True
    for cond in _list(status.get("conditions"), where):
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
    return Node(
        name=str(name), cpu_milli=cpu_milli(alloc.get("cpu", Fraction(0))),
        memory_mib=mib(alloc.get("memory", Fraction(0)), round_up=False),
        gpu_count=gpus, gpu_model=(_first(labels, GPU_MODEL_LABELS) or "") if gpus else "",
        max_pods=count(alloc["pods"]) if "pods" in alloc else 110,
        ephemeral_mib=mib(alloc.get("ephemeral-storage", Fraction(0)), round_up=False),
        labels=labels, taints=tuple(taints), unschedulable=bool(spec.get("unschedulable")), ready=ready)
