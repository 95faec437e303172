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
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from fractions import Fraction
from typing import Any

import numpy as np

from agmarl_common.cluster.model import (
    DEFAULT_SCHEDULER,
    GPU_MILLI,
    MAX_GPUS,
    RACK_LABEL,
    ZONE_LABEL,
    ClusterState,
    LabelRequirement,
    LabelSelector,
    Node,
    NodeSelectorTerm,
    Pod,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    Taint,
    Toleration,
    TopologySpreadConstraint,
    WeightedPodAffinityTerm,
    choose_gpus,
)

GPU_RESOURCE = "nvidia.com/gpu"
GPU_COUNT_RESOURCE = "alibabacloud.com/gpu-count"
GPU_MILLI_ANNOTATIONS = ("agmarl.io/gpu-milli", "alibabacloud.com/gpu-milli")
GPU_COUNT_ANNOTATIONS = ("agmarl.io/gpu-count", "alibabacloud.com/gpu-count")
GPU_SPEC_ANNOTATIONS = ("agmarl.io/gpu-models", "alibabacloud.com/gpu-card-model")
GPU_MODEL_LABELS = ("nvidia.com/gpu.product", "alibabacloud.com/gpu-card-model", "agmarl.io/gpu-model")
LEGACY_ZONE_LABEL = "failure-domain.beta.kubernetes.io/zone"
RACK_LABELS = (RACK_LABEL, "topology.kubernetes.io/rack", "rack")
NIL_SELECTOR = LabelSelector(match_expressions=(LabelRequirement("agmarl.io/nil-selector", "In", ()),))
INACTIVE_PHASES = ("Succeeded", "Failed")
MIB = 1 << 20


class KubeConvertError(ValueError):
    """A Kubernetes object this module cannot turn into the model (the message says where)."""


# ---------------------------------------------------------------------------------------------
# Quantities

_QUANTITY = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {None: Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
           "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
           "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
           "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60)}


def parse_quantity(value: str | int | float) -> Fraction:
    """A resource.Quantity ("500m", "1Gi", "1e3", "1.5", 2) as an exact Fraction of base units."""
    if isinstance(value, bool):
        raise KubeConvertError(f"quantity {value!r} is not a number")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise KubeConvertError(f"quantity {value!r} is not finite")
        return Fraction(str(value))
    if not isinstance(value, str):
        raise KubeConvertError(f"quantity {value!r} is not a string or number")
    m = _QUANTITY.match(value.strip())
    if m is None:
        raise KubeConvertError(f"quantity {value!r} is not a Kubernetes quantity")
    sign, number, suffix = m.groups()
    amount = Fraction(number)
    if suffix in _SUFFIX:
        amount *= _SUFFIX[suffix]
    else:  # decimal exponent: e3, E-2, e+1
        amount *= Fraction(10) ** int(suffix[1:])
    return -amount if sign == "-" else amount


def cpu_milli(value: str | int | float | Fraction) -> int:
    """Milli-cpu, rounded up (Quantity.MilliValue): "100m" -> 100, "0.5" -> 500, "1.0001" -> 1001."""
    q = value if isinstance(value, Fraction) else parse_quantity(value)
    return math.ceil(q * 1000)


def mib(value: str | int | float | Fraction, round_up: bool = True) -> int:
    """Bytes -> MiB: "1Gi" -> 1024; "1G" (953.67 MiB) -> 954 rounded up, 953 rounded down."""
    q = value if isinstance(value, Fraction) else parse_quantity(value)
    return math.ceil(q / MIB) if round_up else math.floor(q / MIB)


def count(value: str | int | float | Fraction) -> int:
    """An integer resource (pods, GPUs), rounded up as Quantity.Value does."""
    q = value if isinstance(value, Fraction) else parse_quantity(value)
    return math.ceil(q)


# ---------------------------------------------------------------------------------------------
# Small readers

def _get(obj: Mapping[str, Any] | None, *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise KubeConvertError(f"{where}: expected a map, got {type(value).__name__}")
    return {str(k): "" if v is None else str(v) for k, v in value.items()}


def _list(value: Any, where: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise KubeConvertError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _resources(values: Any, where: str) -> dict[str, Fraction]:
    return {str(k): parse_quantity(v) for k, v in _str_map_raw(values, where).items()}


def _str_map_raw(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise KubeConvertError(f"{where}: expected a map, got {type(value).__name__}")
    return dict(value)


def _first(mapping: Mapping[str, str], keys: Sequence[str]) -> str | None:
    for k in keys:
        if mapping.get(k):
            return mapping[k]
    return None


def parse_time(value: Any) -> float:
    """RFC 3339 timestamp ("2026-11-29T17:53:35Z") -> epoch seconds; absent -> 0.0."""
    if not value:
        return 0.0
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise KubeConvertError(f"timestamp {value!r} is not RFC 3339") from None


# ---------------------------------------------------------------------------------------------
# Selectors, affinity, tolerations

def _requirement(raw: Mapping[str, Any], where: str) -> LabelRequirement:
    if not isinstance(raw, Mapping) or not raw.get("key") or not raw.get("operator"):
        raise KubeConvertError(f"{where}: a requirement needs key and operator")
    op = str(raw["operator"])
    if op not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
        raise KubeConvertError(f"{where}: unknown operator {op!r}")
    return LabelRequirement(str(raw["key"]), op, tuple(str(v) for v in _list(raw.get("values"), where)))


def label_selector(raw: Any, where: str = "labelSelector") -> LabelSelector:
    """metav1.LabelSelector; None (nil) -> NIL_SELECTOR (matches nothing), {} -> matches everything."""
    if raw is None:
        return NIL_SELECTOR
    if not isinstance(raw, Mapping):
        raise KubeConvertError(f"{where}: expected a map")
    return LabelSelector(match_labels=_str_map(raw.get("matchLabels"), where),
                         match_expressions=tuple(_requirement(r, where)
                                                 for r in _list(raw.get("matchExpressions"), where)))


def _with_label_keys(sel: LabelSelector, keys: Any, labels: Mapping[str, str], where: str) -> LabelSelector:
    """matchLabelKeys: AND ``key In (pod's value)`` for every key the pod carries."""
    extra = tuple(LabelRequirement(str(k), "In", (labels[k],)) for k in _list(keys, where) if k in labels)
    return replace(sel, match_expressions=sel.match_expressions + extra) if extra else sel


_SELECTOR_TERM = re.compile(r"^\s*(!?)\s*([\w./-]+)\s*(?:(==|=|!=)\s*([\w./-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def parse_label_selector(text: str) -> LabelSelector:
    """kubectl-style selector text: "a=b,c!=d,e,!f,g in (x,y),h notin (z)" -> LabelSelector."""
    labels: dict[str, str] = {}
    exprs: list[LabelRequirement] = []
    for part in re.split(r",(?![^()]*\))", text or ""):
        if not part.strip():
            continue
        m = _SELECTOR_TERM.match(part)
        if m is None:
            raise KubeConvertError(f"label selector term {part.strip()!r} is not valid")
        neg, key, op, value, set_op, values = m.groups()
        if neg and (op or set_op):
            raise KubeConvertError(f"label selector term {part.strip()!r} is not valid")
        if op in ("=", "=="):
            labels[key] = value or ""
        elif op == "!=":
            exprs.append(LabelRequirement(key, "NotIn", (value or "",)))
        elif set_op:
            vals = tuple(v.strip() for v in values.split(",") if v.strip())
            exprs.append(LabelRequirement(key, "In" if set_op == "in" else "NotIn", vals))
        else:
            exprs.append(LabelRequirement(key, "DoesNotExist" if neg else "Exists"))
    return LabelSelector(match_labels=labels, match_expressions=tuple(exprs))


def _node_selector_term(raw: Any, where: str) -> NodeSelectorTerm:
    if not isinstance(raw, Mapping):
        raise KubeConvertError(f"{where}: expected a map")
    return NodeSelectorTerm(
        match_expressions=tuple(_requirement(r, where) for r in _list(raw.get("matchExpressions"), where)),
        match_fields=tuple(_requirement(r, where) for r in _list(raw.get("matchFields"), where)))


def _affinity_term(raw: Any, labels: Mapping[str, str], where: str) -> PodAffinityTerm:
    if not isinstance(raw, Mapping) or not raw.get("topologyKey"):
        raise KubeConvertError(f"{where}: a pod affinity term needs a topologyKey")
    sel = label_selector(raw.get("labelSelector"), where)
    if sel is not NIL_SELECTOR:
        sel = _with_label_keys(sel, raw.get("matchLabelKeys"), labels, where)
    namespaces = tuple(str(n) for n in _list(raw.get("namespaces"), where))
    return PodAffinityTerm(sel, str(raw["topologyKey"]), namespaces)


def _pod_affinity(raw: Any, labels: Mapping[str, str], where: str
                  ) -> tuple[tuple[PodAffinityTerm, ...], tuple[WeightedPodAffinityTerm, ...]]:
    req = tuple(_affinity_term(t, labels, where)
                for t in _list(_get(raw, "requiredDuringSchedulingIgnoredDuringExecution"), where))
    pref = tuple(WeightedPodAffinityTerm(int(t.get("weight", 0)),
                                         _affinity_term(t.get("podAffinityTerm"), labels, where))
                 for t in _list(_get(raw, "preferredDuringSchedulingIgnoredDuringExecution"), where))
    return req, pref


def _toleration(raw: Any, where: str) -> Toleration:
    if not isinstance(raw, Mapping):
        raise KubeConvertError(f"{where}: a toleration must be a map")
    return Toleration(key=str(raw.get("key") or ""), operator=str(raw.get("operator") or "Equal"),
                      value=str(raw.get("value") or ""), effect=str(raw.get("effect") or ""))


def _spread(raw: Any, labels: Mapping[str, str], where: str) -> TopologySpreadConstraint:
    if not isinstance(raw, Mapping) or not raw.get("topologyKey") or raw.get("maxSkew") is None:
        raise KubeConvertError(f"{where}: a topology spread constraint needs maxSkew and topologyKey")
    # a nil selector matches no pod (labels.Nothing), so the constraint counts nothing
    selector = _with_label_keys(label_selector(raw.get("labelSelector"), where), raw.get("matchLabelKeys"),
                                labels, where)
    return TopologySpreadConstraint(max_skew=int(raw["maxSkew"]), topology_key=str(raw["topologyKey"]),
                                    when_unsatisfiable=str(raw.get("whenUnsatisfiable") or "DoNotSchedule"),
                                    label_selector=selector, min_domains=int(raw.get("minDomains") or 1))


# ---------------------------------------------------------------------------------------------
# Pods

def _container_requests(c: Mapping[str, Any], where: str) -> dict[str, Fraction]:
    res = c.get("resources") or {}
    reqs = _resources(res.get("requests"), f"{where}.resources.requests")
    for name, q in _resources(res.get("limits"), f"{where}.resources.limits").items():
        reqs.setdefault(name, q)  # API server defaulting: a limit without a request requests the limit
    return reqs


def _add(acc: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for k, v in more.items():
        acc[k] = acc.get(k, Fraction(0)) + v


def _max(acc: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    for k, v in other.items():
        if v > acc.get(k, Fraction(0)):
            acc[k] = v


def pod_requests(spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """resourcehelper.PodRequests: containers summed, init containers maxed (sidecars added), overhead."""
    reqs: dict[str, Fraction] = {}
    for i, c in enumerate(_list(spec.get("containers"), "spec.containers")):
        _add(reqs, _container_requests(c, f"spec.containers[{i}]"))
    sidecars: dict[str, Fraction] = {}
    init_max: dict[str, Fraction] = {}
    for i, c in enumerate(_list(spec.get("initContainers"), "spec.initContainers")):
        r = _container_requests(c, f"spec.initContainers[{i}]")
        if c.get("restartPolicy") == "Always":
            _add(reqs, r)
            _add(sidecars, r)
            current = dict(sidecars)
        else:
            current = dict(r)
            _add(current, sidecars)
        _max(init_max, current)
    _max(reqs, init_max)
    pod_level = _resources(_get(spec, "resources", "requests"), "spec.resources.requests")
    for name in ("cpu", "memory"):
        if name in pod_level:
            reqs[name] = pod_level[name]
    _add(reqs, _resources(spec.get("overhead"), "spec.overhead"))
    return reqs


def qos_class(spec: Mapping[str, Any]) -> str:
    """v1.PodQOSClass computed from the containers when status.qosClass is absent."""
    containers = _list(spec.get("containers"), "spec.containers") + _list(spec.get("initContainers"), "")
    any_set, guaranteed = False, True
    for c in containers:
        res = c.get("resources") or {}
        req, lim = _str_map_raw(res.get("requests"), "requests"), _str_map_raw(res.get("limits"), "limits")
        if any(k in req or k in lim for k in ("cpu", "memory")):
            any_set = True
        for k in ("cpu", "memory"):
            if k not in lim or parse_quantity(req.get(k, lim[k])) != parse_quantity(lim[k]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _pod_gpus(reqs: Mapping[str, Fraction], ann: Mapping[str, str], where: str) -> tuple[int, int]:
    whole = count(reqs.get(GPU_RESOURCE, Fraction(0)))
    if whole > 0:
        return whole, GPU_MILLI
    milli_s = _first(ann, GPU_MILLI_ANNOTATIONS)
    if milli_s is None:
        return 0, 0
    milli = count(milli_s)
    n = count(_first(ann, GPU_COUNT_ANNOTATIONS) or "1")
    if milli <= 0 or n <= 0:
        return 0, 0
    if milli > GPU_MILLI or n > MAX_GPUS or (n > 1 and milli < GPU_MILLI):
        raise KubeConvertError(f"{where}: GPU request of {n} x {milli} milli is not representable")
    return n, milli


def pod_from_k8s(obj: Mapping[str, Any]) -> Pod:
    """v1.Pod (dict) -> model.Pod."""
    if not isinstance(obj, Mapping):
        raise KubeConvertError("pod: expected a map")
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    name = meta.get("name")
    if not name:
        raise KubeConvertError("pod: metadata.name is missing")
    ns = str(meta.get("namespace") or "default")
    where = f"pod {ns}/{name}"
    labels = _str_map(meta.get("labels"), f"{where} labels")
    ann = _str_map(meta.get("annotations"), f"{where} annotations")
    try:
        reqs = pod_requests(spec)
    except KubeConvertError as exc:
        raise KubeConvertError(f"{where}: {exc}") from None
    num_gpu, gpu_milli = _pod_gpus(reqs, ann, where)
    spec_s = _first(ann, GPU_SPEC_ANNOTATIONS) or ""
    gpu_spec = tuple(s.strip() for s in re.split(r"[|,]", spec_s) if s.strip())
    affinity = spec.get("affinity") or {}
    na = affinity.get("nodeAffinity") or {}
    required = _get(na, "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
    preferred = _list(na.get("preferredDuringSchedulingIgnoredDuringExecution"), where)
    aff, pref_aff = _pod_affinity(affinity.get("podAffinity"), labels, where)
    anti, pref_anti = _pod_affinity(affinity.get("podAntiAffinity"), labels, where)
    owners = _list(meta.get("ownerReferences"), where)
    service = str(owners[0].get("name", "")) if owners and isinstance(owners[0], Mapping) else ""
    return Pod(
        name=str(name), namespace=ns, uid=str(meta.get("uid") or ""),
        cpu_milli=cpu_milli(reqs.get("cpu", Fraction(0))), memory_mib=mib(reqs.get("memory", Fraction(0))),
        ephemeral_mib=mib(reqs.get("ephemeral-storage", Fraction(0))),
        num_gpu=num_gpu, gpu_milli=gpu_milli, gpu_spec=gpu_spec, labels=labels,
        node_selector=_str_map(spec.get("nodeSelector"), f"{where} nodeSelector"),
        required_node_affinity=tuple(_node_selector_term(t, where) for t in _list(required, where)),
        preferred_node_affinity=tuple(PreferredSchedulingTerm(int(t.get("weight", 0)),
                                                              _node_selector_term(t.get("preference"), where))
                                      for t in preferred),
        tolerations=tuple(_toleration(t, where) for t in _list(spec.get("tolerations"), where)),
        pod_affinity=aff, pod_anti_affinity=anti, preferred_pod_affinity=pref_aff,
        preferred_pod_anti_affinity=pref_anti,
        topology_spread=tuple(_spread(c, labels, where) for c in _list(spec.get("topologySpreadConstraints"), where)),
        qos=str(status.get("qosClass") or qos_class(spec)), priority=int(spec.get("priority") or 0),
        scheduler_name=str(spec.get("schedulerName") or DEFAULT_SCHEDULER),
        service=service or labels.get("app.kubernetes.io/name", labels.get("app", "")),
        creation_time=parse_time(meta.get("creationTimestamp")), node_name=str(spec.get("nodeName") or ""))


def pod_is_active(obj: Mapping[str, Any]) -> bool:
    """Holds node resources: not Succeeded/Failed (terminating pods still hold them)."""
    return _get(obj, "status", "phase") not in INACTIVE_PHASES


# ---------------------------------------------------------------------------------------------
# Nodes

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
