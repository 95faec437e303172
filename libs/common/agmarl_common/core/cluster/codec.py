"""Plain-dict conversion of the cluster model (for the wire). Tuples of dataclasses and mappings
round-trip exactly. Import these through ``agmarl_common.core.cluster.model``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from functools import lru_cache
from typing import Any

from agmarl_common.core.cluster.specs import (
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
)
from agmarl_common.core.cluster.state import ClusterState, state_with_bound


_TYPES: dict[str, type] = {}


def _register(*classes: type) -> None:
    for c in classes:
        _TYPES[c.__name__] = c


_register(Taint, Toleration, LabelRequirement, NodeSelectorTerm, PreferredSchedulingTerm, LabelSelector,
          PodAffinityTerm, WeightedPodAffinityTerm, TopologySpreadConstraint, Node, Pod)

_NESTED: dict[tuple[str, str], type] = {
    ("Node", "taints"): Taint,
    ("Pod", "tolerations"): Toleration,
    ("Pod", "required_node_affinity"): NodeSelectorTerm,
    ("Pod", "preferred_node_affinity"): PreferredSchedulingTerm,
    ("Pod", "pod_affinity"): PodAffinityTerm,
    ("Pod", "pod_anti_affinity"): PodAffinityTerm,
    ("Pod", "preferred_pod_affinity"): WeightedPodAffinityTerm,
    ("Pod", "preferred_pod_anti_affinity"): WeightedPodAffinityTerm,
    ("Pod", "topology_spread"): TopologySpreadConstraint,
    ("NodeSelectorTerm", "match_expressions"): LabelRequirement,
    ("NodeSelectorTerm", "match_fields"): LabelRequirement,
    ("PreferredSchedulingTerm", "preference"): NodeSelectorTerm,
    ("LabelSelector", "match_expressions"): LabelRequirement,
    ("PodAffinityTerm", "label_selector"): LabelSelector,
    ("WeightedPodAffinityTerm", "term"): PodAffinityTerm,
    ("TopologySpreadConstraint", "label_selector"): LabelSelector,
}


_PLAIN = frozenset((str, int, float, bool, type(None)))  # returned as they are


@lru_cache(maxsize=None)
def _defaults(cls: type) -> tuple[tuple[str, Any], ...] | None:
    """(name, default or MISSING) of each field of dataclass ``cls`` (a default factory called once: compared
    against, never handed out); None when ``cls`` is not a dataclass."""
    if not is_dataclass(cls):
        return None
    return tuple((f.name, f.default if f.default is not MISSING else
                  f.default_factory() if f.default_factory is not MISSING else MISSING) for f in fields(cls))


def to_dict(obj: Any) -> Any:
    """Dataclass -> plain dict/list/scalars, omitting fields equal to their defaults."""
    spec = _defaults(type(obj))
    if spec is not None:
        out = {}
        for name, default in spec:
            v = getattr(obj, name)
            if default is not MISSING and v == default:
                continue
            out[name] = v if type(v) in _PLAIN else to_dict(v)
        return out
    if isinstance(obj, (tuple, list)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


@lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """(every field's name, the names of the fields typed as a mapping) of dataclass ``cls``."""
    return frozenset(f.name for f in fields(cls)), frozenset(f.name for f in fields(cls) if "Mapping" in str(f.type))


def from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """Inverse of ``to_dict``; raises TypeError/ValueError on unknown fields or bad shapes."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}: expected a mapping, got {type(data).__name__}")
    names, mappings = _field_names(cls)
    unknown = data.keys() - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        nested = _NESTED.get((cls.__name__, key))
        if nested is not None:
            if isinstance(value, Mapping):
                kwargs[key] = from_dict(nested, value)
            else:
                kwargs[key] = tuple(from_dict(nested, v) for v in value)
        elif isinstance(value, list):
            kwargs[key] = tuple(value)
        else:
            kwargs[key] = value
        if key in mappings and not isinstance(kwargs[key], Mapping):
            raise TypeError(f"{cls.__name__}.{key}: expected a mapping")
    return cls(**kwargs)


def node_from_dict(data: Mapping[str, Any]) -> Node:
    return from_dict(Node, data)


def pod_from_dict(data: Mapping[str, Any]) -> Pod:
    return from_dict(Pod, data)


def state_to_dict(state: ClusterState) -> dict[str, Any]:
    """Nodes and bound pods (with their GPU devices); usage is recomputed on load."""
    return {"nodes": [to_dict(n) for n in state.nodes],
            "bound": [[to_dict(p) for p in pods] for pods in state.bound]}


def state_from_dict(data: Mapping[str, Any]) -> ClusterState:
    """Inverse of ``state_to_dict``. ``model.state_from_dict`` (``compact.state_from_dict``) also decodes the
    compact forms built on this module."""
    nodes = tuple(node_from_dict(n) for n in data["nodes"])
    bound = [tuple(pod_from_dict(p) for p in pods) for pods in data.get("bound", [[] for _ in nodes])]
    return state_with_bound(nodes, bound)
