"""v1.Pod (camelCase dict) -> model.Pod: requests, GPU share annotations, selectors, affinity,
tolerations and topology spread (the rules are in ``kubeconvert``'s docstring)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from agmarl_common.core.cluster.model import (
    DEFAULT_SCHEDULER,
    GPU_MILLI,
    MAX_GPUS,
    LabelRequirement,
    LabelSelector,
    NodeSelectorTerm,
    Pod,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    Toleration,
    TopologySpreadConstraint,
    WeightedPodAffinityTerm,
)
from agmarl_common.kube.quantity import (
    GPU_RESOURCE,
    KubeConvertError,
    _first,
    _get,
    _list,
    _resources,
    _str_map,
    _str_map_raw,
    count,
    cpu_milli,
    mib,
    parse_quantity,
    parse_time,
)

GPU_MILLI_ANNOTATIONS = ("agmarl.io/gpu-milli", "alibabacloud.com/gpu-milli")
GPU_COUNT_ANNOTATIONS = ("agmarl.io/gpu-count", "alibabacloud.com/gpu-count")
GPU_SPEC_ANNOTATIONS = ("agmarl.io/gpu-models", "alibabacloud.com/gpu-card-model")
NIL_SELECTOR = LabelSelector(match_expressions=(LabelRequirement("agmarl.io/nil-selector", "In", ()),))
INACTIVE_PHASES = ("Succeeded", "Failed")


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
