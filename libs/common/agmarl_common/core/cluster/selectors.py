"""Label, node-selector, toleration and pod-affinity-term matching, with Kubernetes' semantics.

Pure predicates over the plain types of ``cluster.model``. The hard filter (``filters.py``) and the
scorers (``scoring/kube_resources.py``, ``scoring/kube_affinity.py``) share them, so a term means
the same thing everywhere.

Two conventions worth knowing:
- every Kubernetes node carries ``kubernetes.io/hostname``; when a ``Node`` has no such label we
  use its name (``label_value``), so hostname topology keys and selectors work on tiny clusters;
- a ``LabelSelector`` with no labels and no expressions matches every pod (metav1's empty
  selector); the model has no way to say "nil selector", which in Kubernetes matches nothing.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from agmarl_common.core.cluster.model import (
    HOSTNAME_LABEL,
    LabelRequirement,
    LabelSelector,
    Node,
    NodeSelectorTerm,
    Pod,
    PodAffinityTerm,
    Taint,
    Toleration,
)

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
PREFER_NO_SCHEDULE = "PreferNoSchedule"
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
FIELD_NODE_NAME = "metadata.name"


def label_value(node: Node, key: str) -> str | None:
    """The node's value for label ``key`` (None when absent; hostname defaults to the node name)."""
    v = node.labels.get(key)
    if v is None and key == HOSTNAME_LABEL:
        return node.name
    return v


def _parse_int(s: str) -> int | None:
    try:
        return int(s)
    except (TypeError, ValueError):
        return None


def matches_requirement(value: str | None, req: LabelRequirement) -> bool:
    """One requirement against the value a label has (None = label absent).

    In / NotIn / Exists / DoesNotExist / Gt / Lt as in k8s.io/apimachinery labels.Requirement:
    NotIn and DoesNotExist match an absent label; Gt/Lt need the label and exactly one integer value.
    """
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(req.values) != 1:
            return False
        have, want = _parse_int(value), _parse_int(req.values[0])
        if have is None or want is None:
            return False
        return have > want if op == "Gt" else have < want
    raise ValueError(f"unknown label operator {op!r}")


def matches_node_selector_term(node: Node, term: NodeSelectorTerm) -> bool:
    """All expressions and fields of one term; an empty term matches no node (as in Kubernetes)."""
    if not term.match_expressions and not term.match_fields:
        return False
    for req in term.match_expressions:
        if not matches_requirement(label_value(node, req.key), req):
            return False
    for req in term.match_fields:
        if req.key != FIELD_NODE_NAME:
            return False
        if req.operator not in ("In", "NotIn"):
            return False
        if not matches_requirement(node.name, req):
            return False
    return True


def matches_node_selector(node: Node, selector: Mapping[str, str]) -> bool:
    """``spec.nodeSelector``: every key present with exactly that value."""
    return all(label_value(node, k) == v for k, v in selector.items())


def matches_required_node_affinity(node: Node, terms: tuple[NodeSelectorTerm, ...]) -> bool:
    """Required node affinity: terms are ORed; no terms means no constraint."""
    if not terms:
        return True
    return any(matches_node_selector_term(node, t) for t in terms)


def pod_matches_node_affinity(pod: Pod, node: Node) -> bool:
    """nodeSelector AND required node affinity (the NodeAffinity filter, also used by spread)."""
    return matches_node_selector(node, pod.node_selector) and matches_required_node_affinity(
        node, pod.required_node_affinity)


def matches_label_selector(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector: matchLabels AND matchExpressions (In/NotIn/Exists/DoesNotExist)."""
    for k, v in selector.match_labels.items():
        if labels.get(k) != v:
            return False
    return all(matches_requirement(labels.get(r.key), r) for r in selector.match_expressions)


def term_matches(term: PodAffinityTerm, owner_namespace: str, namespace: str, labels: Mapping[str, str]) -> bool:
    """Does a pod in ``namespace`` with ``labels`` match a pod (anti-)affinity term owned by a pod in
    ``owner_namespace``? (An empty ``term.namespaces`` means the owner's namespace.)"""
    namespaces = term.namespaces or (owner_namespace,)
    return namespace in namespaces and matches_label_selector(term.label_selector, labels)


def term_matches_pod(term: PodAffinityTerm, owner_namespace: str, target: Pod) -> bool:
    """Does ``target`` match a pod (anti-)affinity term owned by a pod in ``owner_namespace``?"""
    return term_matches(term, owner_namespace, target.namespace, target.labels)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """v1.Toleration.ToleratesTaint: effect (empty = all), key (empty = all), Equal/Exists."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in ("", "Equal"):
        return toleration.value == taint.value
    return toleration.operator == "Exists"


def is_tolerated(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    return any(tolerates(t, taint) for t in tolerations)


def first_untolerated(taints: Iterable[Taint], tolerations: tuple[Toleration, ...],
                      effects: tuple[str, ...] = (NO_SCHEDULE, NO_EXECUTE)) -> Taint | None:
    """The first taint with one of ``effects`` that no toleration tolerates, or None."""
    for taint in taints:
        if taint.effect in effects and not is_tolerated(tolerations, taint):
            return taint
    return None


def count_untolerated_prefer(node: Node, pod: Pod) -> int:
    """PreferNoSchedule taints not tolerated by the pod's PreferNoSchedule/empty-effect tolerations."""
    tols = tuple(t for t in pod.tolerations if t.effect in ("", PREFER_NO_SCHEDULE))
    return sum(1 for taint in node.taints
               if taint.effect == PREFER_NO_SCHEDULE and not is_tolerated(tols, taint))
