"""One decision for one pending pod on the whole cluster: pure, given the state and the policies.

The state is the cluster view (every node, bound and assumed pods: what the simulator sees). This runs
the hard filter once, applies the active policy's own admission (outside shadow mode; a pod no
candidate admits stays pending), scores with the active policy and the default scoring, blends per
rollout mode, picks the node (ties to the lowest node tie order when the nodes carry one, else to the
first node, as the simulator's harnesses do) and explains why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agmarl_common.core.cluster.filters import feasible_mask, filter_node
from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.cluster.specs import TIE_ORDER_LABEL
from agmarl_common.core.policies.base import Policy, admission_reason, admitted, normalise_scores
from agmarl_common.core.sim.inflation import pick_node

TOP_SCORES = 16  # candidates whose scores a decision records (the whole list of a large cluster is too big to log)
REASONS = 5  # filtered-out nodes whose reason a decision records


@dataclass(frozen=True)
class Choice:
    node: str  # "" = no feasible node
    gpus: tuple[int, ...]
    score: float
    scores: dict[str, float]  # blended, 0..100
    model_scores: dict[str, float]
    default_scores: dict[str, float]
    explanation: dict = field(default_factory=dict)


def tie_order(state: ClusterState) -> np.ndarray | None:
    """Per-node tie order from the ``agmarl.io/tie-order`` label, or None when no node has one (nodes
    without it come last)."""
    labels = [nd.labels.get(TIE_ORDER_LABEL) for nd in state.nodes]
    if not any(v is not None for v in labels):
        return None
    big = np.iinfo(np.int64).max
    return np.array([int(v) if v is not None and str(v).isdigit() else big for v in labels], dtype=np.int64)


def best_first(values: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` of ``np.argsort(-values, kind="stable")`` without sorting everything: the entries at
    least as large as the k-th largest (ties included), sorted stably, then cut."""
    if values.size <= k or np.isnan(values).any():  # NaNs: the full sort's place for them (last)
        return np.argsort(-values, kind="stable")[:k]
    kth = np.partition(values, values.size - k)[values.size - k]
    sel = np.flatnonzero(values >= kth)
    return sel[np.argsort(-values[sel], kind="stable")[:k]]


def filter_reasons(pod: Pod, state: ClusterState, mask: np.ndarray, limit: int = REASONS) -> dict[str, str]:
    """Why the first ``limit`` filtered-out nodes were filtered out (plugin: reason)."""
    out: dict[str, str] = {}
    for i in np.flatnonzero(~mask)[:limit]:
        status = filter_node(pod, state, int(i))
        out[state.nodes[int(i)].name] = f"{status.plugin}: {status.reason}"
    return out


def blend(model: np.ndarray, default: np.ndarray, mode: str, model_weight: float) -> np.ndarray:
    """Scores the decision uses: full/canary/recommend -> model, hybrid -> weighted, shadow -> default."""
    if mode == "hybrid":
        return model_weight * model + (1.0 - model_weight) * default
    if mode == "shadow":
        return default
    return model


def decide(pod: Pod, state: ClusterState, policy: Policy, default: Policy, mode: str,
           model_weight: float, explain_model: bool = True, rank: np.ndarray | None = None) -> Choice:
    """``rank``: per-node tie order (``tie_order(state)``); None = ties to the first node."""
    mask = feasible_mask(pod, state)
    idx = np.flatnonzero(mask).astype(np.int64)
    n_out = int(mask.size - idx.size)
    if idx.size == 0:
        return Choice("", (), 0.0, {}, {}, {}, {"reason": "no feasible node", "filtered_out": n_out,
                                                "filter_reasons": filter_reasons(pod, state, mask)})
    if mode != "shadow":  # the policy decides: its own filter too (policies.base.admitted, e.g. the load cap)
        fits = idx.size
        idx = admitted(policy, pod, state, idx)
        if idx.size == 0:
            return Choice("", (), 0.0, {}, {}, {}, {"reason": "not admitted by the policy", "policy": policy.name,
                                                    "admission": admission_reason(policy, pod), "candidates": fits,
                                                    "filtered_out": n_out})
    raw = np.asarray(policy.score(pod, state, idx), dtype=np.float64)
    model = normalise_scores(raw)
    blends = mode in ("hybrid", "shadow")
    if default is policy:
        base = model
    elif blends:
        base = normalise_scores(default.score(pod, state, idx))
    else:  # the default scores only go to the log: score (and normalise among) the logged candidates only
        base = np.full(idx.size, np.nan)
    blended = blend(model, base, mode, model_weight)
    # the policy alone decides in full / canary / recommend: its own scores pick, exactly as in the simulator
    node_index = pick_node(blended if blends else raw, idx, rank)
    best = int(np.flatnonzero(idx == node_index)[0])
    gpus = policy.choose_gpus(pod, state, node_index)
    order = best_first(blended, TOP_SCORES)
    top = order[:TOP_SCORES]
    if np.isnan(base).any():
        logged = np.sort(top if (top == best).any() else np.append(top, best))  # np.union1d(top, [best]), cheaper
        base[logged] = normalise_scores(default.score(pod, state, idx[logged]))
    names = {int(k): state.nodes[int(idx[k])].name for k in top}
    names[best] = state.nodes[node_index].name
    explanation = {
        "policy": policy.name,
        "mode": mode,
        "top": [{"node": names[int(k)], "score": round(float(blended[k]), 3), "model": round(float(model[k]), 3),
                 "default": round(float(base[k]), 3)} for k in order[:3]],
        "candidates": int(idx.size),
        "filtered_out": n_out,
        "filter_reasons": filter_reasons(pod, state, mask) if n_out else {},
    }
    explain = getattr(policy, "explain", None)
    if explain_model and callable(explain):
        # a learned policy: top attention edges and feature contributions (occlusion) of its pick
        explanation["model"] = explain(pod, state, idx, top=3)
    keep = sorted(names)  # the top candidates and the chosen node, in candidate order
    return Choice(
        node=names[best], gpus=tuple(gpus or ()), score=float(blended[best]),
        scores={names[k]: round(float(blended[k]), 3) for k in keep},
        model_scores={names[k]: round(float(model[k]), 3) for k in keep},
        default_scores={names[k]: round(float(base[k]), 3) for k in keep},
        explanation=explanation,
    )
