"""The extender's decision core, pure functions: a policy's scores decomposed into plugin terms,
0..100 -> 0..10 extender scores, the mode's blend, the explanation of a decision, and why a node
fails the hard filter (classified as kube-scheduler does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from agmarl_common.core.cluster.filters import (
    FilterStatus,
    filter_node,
    fits_node_selector,
    fits_node_unschedulable,
    fits_resources,
    fits_taints,
)
from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.policies.base import Policy, normalise_scores
from agmarl_inference.extender_wire import MAX_EXTENDER_SCORE

# failures kube-scheduler marks UnschedulableAndUnresolvable (preemption cannot help)
_UNRESOLVABLE = ("NodeUnschedulable", "TaintToleration", "NodeAffinity")
_UNRESOLVABLE_REASONS = ("gpu_spec", "missing required label", "didn't match pod affinity rules")
_DETAILED_REASONS = 32  # failing nodes that get the full (cluster-wide) filter for their reason


@dataclass(frozen=True)
class Scored:
    """0..100 scores of one policy and each term's additive share in them (for explanations)."""

    norm: np.ndarray
    contributions: dict[str, np.ndarray]  # sum over terms == norm - constant
    raw_terms: dict[str, np.ndarray] = field(default_factory=dict)  # plugin scores 0..100


def score_policy(policy: Policy, pod: Pod, state: ClusterState, idx: np.ndarray) -> Scored:
    """normalise_scores(policy.score(...)), decomposed into plugin terms when the policy is a sum
    of weighted plugins (WeightedPluginsPolicy), else one term named after the policy."""
    plugin_scores = getattr(policy, "plugin_scores", None)
    plugins = getattr(policy, "plugins", None)
    if callable(plugin_scores) and isinstance(plugins, dict):
        terms = plugin_scores(pod, state, idx)
        weighted = {k: plugins[k][1] * np.asarray(v, dtype=np.float64) for k, v in terms.items()}
        raw = np.sum(list(weighted.values()), axis=0) if weighted else np.zeros(len(idx))
    else:
        raw, terms, weighted = np.asarray(policy.score(pod, state, idx), dtype=np.float64), {}, {}
    norm = normalise_scores(raw)
    span = float(raw.max() - raw.min()) if raw.size else 0.0
    scale = 100.0 / span if span > 0 else 0.0
    contributions = {k: v * scale for k, v in weighted.items()} if weighted else {policy.name: norm}
    return Scored(norm, contributions, {k: np.asarray(v, dtype=np.float64) for k, v in terms.items()})


def to_extender_scores(scores: np.ndarray) -> list[int]:
    """0..100 -> kube-scheduler extender scores 0..10 (rounded half up, clipped)."""
    return np.clip(np.floor(np.asarray(scores, dtype=np.float64) / 10.0 + 0.5), 0,
                   MAX_EXTENDER_SCORE).astype(np.int64).tolist()


def blend_weights(mode: str, opted_in: bool, model_weight: float) -> tuple[float, float]:
    """(model, default) weights of the placement kube-scheduler ends up making, for the log:
    hybrid blends; full/recommend/opted-in canary follow the model; shadow and other canary pods
    follow the default scores."""
    if mode == "hybrid":
        return model_weight, 1.0 - model_weight
    if mode == "shadow" or (mode == "canary" and not opted_in):
        return 0.0, 1.0
    return 1.0, 0.0


def returned_kind(mode: str, opted_in: bool, fallback: str) -> str:
    """What the extender answers: "neutral" (all equal), "model" or "default" scores."""
    if mode == "shadow" or (mode == "canary" and not opted_in):
        return "neutral"
    return "default" if fallback else "model"


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` (or more) indexes of ``np.argsort(-values, kind="stable")``, without sorting them all:
    every value at or above the k-th largest, in that order."""
    if values.size <= k:
        return np.argsort(-values, kind="stable")
    kth = np.partition(values, values.size - k)[values.size - k]
    ahead = np.flatnonzero(values >= kth)
    if ahead.size < k:  # NaN among the values: the full order puts them last
        return np.argsort(-values, kind="stable")
    return ahead[np.argsort(-values[ahead], kind="stable")]


def explain(names: Sequence[str], model: Scored | None, default: Scored, weights: tuple[float, float],
            returned: list[int], top_k: int = 3) -> dict[str, Any]:
    """Top nodes with their plugin terms, and the terms that separate the winner from the runner-up
    (each term's signed share in blended[best] - blended[second]; they sum to that difference)."""
    wm, wd = weights if model is not None else (0.0, 1.0)
    parts = {f"default.{k}": wd * v for k, v in default.contributions.items()}
    if model is not None:
        parts.update({f"model.{k}": wm * v for k, v in model.contributions.items()})
    blended = wd * default.norm + (wm * model.norm if model is not None else 0.0)
    order = _top(blended, max(top_k, 2))
    top = []
    for k in order[:top_k]:
        entry = {"node": names[k], "blended": round(float(blended[k]), 3), "default": round(float(default.norm[k]), 3),
                 "returned": returned[k],
                 "terms": {f"default.{t}": round(float(v[k]), 3) for t, v in default.raw_terms.items()}}
        if model is not None:
            entry["model"] = round(float(model.norm[k]), 3)
            entry["terms"].update({f"model.{t}": round(float(v[k]), 3) for t, v in model.raw_terms.items()})
        top.append(entry)
    drivers = []
    if len(order) >= 2:
        best, second = order[0], order[1]
        drivers = sorted(({"term": t, "delta": round(float(v[best] - v[second]), 3)} for t, v in parts.items()),
                         key=lambda d: -abs(d["delta"]))
    return {"top": top, "drivers": drivers, "margin": round(float(blended[order[0]] - blended[order[1]]), 3)
            if len(order) >= 2 else 0.0}


def failure(status: FilterStatus) -> tuple[str, bool]:
    """(reason text, unresolvable?) as kube-scheduler would classify the plugin's status."""
    unresolvable = status.plugin in _UNRESOLVABLE or any(r in status.reason for r in _UNRESOLVABLE_REASONS)
    return f"{status.plugin}: {status.reason}", unresolvable


def failed_reasons(pod: Pod, state: ClusterState, failing: list[int]) -> dict[int, FilterStatus]:
    """Why each failing node fails: the cheap per-node checks first; the cluster-wide ones (spread,
    pod affinity) in full only for the first _DETAILED_REASONS nodes that need them."""
    out: dict[int, FilterStatus] = {}
    detailed = 0
    selectors = bool(pod.node_selector or pod.required_node_affinity)
    for i in failing:
        node = state.nodes[i]
        if selectors or node.taints or node.unschedulable or not node.ready:
            node_only = (fits_node_unschedulable(pod, node), fits_taints(pod, node), fits_node_selector(pod, node))
            status = next((s for s in node_only if not s.ok), None) or fits_resources(pod, state, i)
        else:  # the node-only checks cannot fail here
            status = fits_resources(pod, state, i)
        if status.ok:
            if detailed < _DETAILED_REASONS:
                detailed += 1
                status = filter_node(pod, state, i)
            if status.ok:
                status = FilterStatus(False, "InterPodAffinity",
                                      "node(s) didn't match pod topology spread constraints or pod affinity rules")
        out[i] = status
    return out
