"""One decision for one pending pod: pure, given the policies.

The candidate nodes arrive already filtered by graph-builder; this re-checks resources as a final
guard (the cache could be a little behind), applies the active policy's own admission (outside shadow
mode; a pod no candidate admits stays pending), scores with the active policy and the default scoring,
blends per rollout mode, picks the node and explains why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agmarl_common.cluster.filters import fits_resources_mask
from agmarl_common.cluster.model import ClusterState, Pod
from agmarl_common.policies.base import Policy, admission_reason, admitted, normalise_scores


@dataclass(frozen=True)
class Choice:
    node: str  # "" = no feasible node
    gpus: tuple[int, ...]
    score: float
    scores: dict[str, float]  # blended, 0..100
    model_scores: dict[str, float]
    default_scores: dict[str, float]
    explanation: dict = field(default_factory=dict)


def guard(pod: Pod, state: ClusterState) -> np.ndarray:
    """Candidate indexes that still fit (resources and GPU) in the given candidate state: the nodes where
    ``fits_resources(pod, state, i).ok`` (which includes ``fits_gpu``), computed over all nodes at once
    by the hard filter's own bulk form of that check."""
    return np.flatnonzero(fits_resources_mask(pod, state)).astype(np.int64)


def blend(model: np.ndarray, default: np.ndarray, mode: str, model_weight: float) -> np.ndarray:
    """Scores the decision uses: full/canary/recommend -> model, hybrid -> weighted, shadow -> default."""
    if mode == "hybrid":
        return model_weight * model + (1.0 - model_weight) * default
    if mode == "shadow":
        return default
    return model


def decide(pod: Pod, state: ClusterState, policy: Policy, default: Policy, mode: str,
           model_weight: float, reasons: dict[str, str] | None = None, explain_model: bool = True) -> Choice:
    idx = guard(pod, state)
    if idx.size == 0:
        return Choice("", (), 0.0, {}, {}, {}, {"reason": "no feasible node", "filtered_out": dict(reasons or {})})
    if mode != "shadow":  # the policy decides: its own filter too (policies.base.admitted, e.g. the load cap)
        fits = idx.size
        idx = admitted(policy, pod, state, idx)
        if idx.size == 0:
            return Choice("", (), 0.0, {}, {}, {}, {"reason": "not admitted by the policy", "policy": policy.name,
                                                    "admission": admission_reason(policy, pod), "candidates": fits,
                                                    "filtered_out": len(reasons or {})})
    names = [state.nodes[i].name for i in idx]
    model = normalise_scores(policy.score(pod, state, idx))
    base = model if default is policy else normalise_scores(default.score(pod, state, idx))
    blended = blend(model, base, mode, model_weight)
    best = int(np.argmax(blended))
    node_index = int(idx[best])
    gpus = policy.choose_gpus(pod, state, node_index)
    order = np.argsort(-blended, kind="stable")[:3]
    explanation = {
        "policy": policy.name,
        "mode": mode,
        "top": [{"node": names[k], "score": round(float(blended[k]), 3), "model": round(float(model[k]), 3),
                 "default": round(float(base[k]), 3)} for k in order],
        "candidates": len(names),
        "filtered_out": len(reasons or {}),
        "filter_reasons": dict(list((reasons or {}).items())[:5]),
    }
    explain = getattr(policy, "explain", None)
    if explain_model and callable(explain):
        # a learned policy: top attention edges and feature contributions (occlusion) of its pick
        explanation["model"] = explain(pod, state, idx, top=3)
    return Choice(
        node=names[best], gpus=tuple(gpus or ()), score=float(blended[best]),
        scores={n: round(float(s), 3) for n, s in zip(names, blended)},
        model_scores={n: round(float(s), 3) for n, s in zip(names, model)},
        default_scores={n: round(float(s), 3) for n, s in zip(names, base)},
        explanation=explanation,
    )
