"""The one policy interface: baselines and the learned model implement it, one harness runs them.

A policy scores the feasible candidate nodes of one pending pod (the hard filter has already run;
a policy never sees an infeasible node) and may pick the GPU devices on the chosen node.
Higher scores are better. Scores are on the policy's own scale; ``normalise_scores`` maps them to
kube-scheduler's 0..100 framework range when they must be compared or blended.

A policy may also filter: an optional ``admit(pod, state, candidates) -> bool mask`` (and
``admission_reason(pod) -> str``) keeps a pod off candidates that pass the hard filter (the load cap,
``policies.loadcap``). Harnesses apply it with ``admitted``; a pod no candidate admits waits.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState, Pod, choose_gpus
from agmarl_common.core.scoring.kube_resources import MAX_NODE_SCORE


@runtime_checkable
class Policy(Protocol):
    name: str

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        """Scores (float, same length as ``candidates``) for node indexes ``candidates``."""
        ...

    def choose_gpus(self, pod: Pod, state: ClusterState, node_index: int) -> tuple[int, ...] | None:
        """GPU devices for ``pod`` on ``node_index`` (() for CPU pods, None if it cannot fit)."""
        ...


class PolicyBase:
    """Default device choice and selection helpers; subclasses implement ``score``."""

    name = "base"
    # True when a node's score depends only on the pod, that node's state and the policy's fixed context
    # (no normalisation over the candidates, no other node's pods): batch mode then re-scores only the nodes
    # a batch's earlier grants changed and places as one pod at a time would (batchcore.current_ranking)
    local_scores = False

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def choose_gpus(self, pod: Pod, state: ClusterState, node_index: int) -> tuple[int, ...] | None:
        if pod.num_gpu == 0:
            return ()
        return choose_gpus(pod, gpu_free_row(state, node_index))


def gpu_free_row(state: ClusterState, i: int) -> np.ndarray:
    """``state.gpu_free()[i]`` without computing the other nodes' rows."""
    return np.where(np.arange(MAX_GPUS) < state.gpu_count[i], GPU_MILLI - state.gpu_used[i], 0)


def brief(policy: Policy, workload: Sequence[Pod] | None = None, objective: str | None = None) -> None:
    """Tell ``policy`` what a harness runs, where it asks: the workload (``observe_workload(pods)``: FGD and
    the learned policy measure fragmentation against it, as the FGD paper's simulator tells its plugins)
    and the objective the harness measures (``set_objective(name)``: the learned policy)."""
    set_objective = getattr(policy, "set_objective", None)
    if objective is not None and callable(set_objective):  # first: the workload's context is then built once
        set_objective(objective)
    observe = getattr(policy, "observe_workload", None)
    if workload is not None and callable(observe):
        observe(workload)


def admitted(policy: Policy, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """The candidates ``policy`` admits (its ``admit`` mask; all of them when it has none), in order."""
    admit = getattr(policy, "admit", None)
    candidates = np.asarray(candidates, dtype=np.int64)
    if not callable(admit) or candidates.size == 0:
        return candidates
    return candidates[np.asarray(admit(pod, state, candidates), dtype=bool)]


def admission_reason(policy: Policy, pod: Pod) -> str:
    """Why ``policy`` does not admit ``pod`` somewhere (its ``admission_reason``, or a generic text)."""
    why = getattr(policy, "admission_reason", None)
    return str(why(pod)) if callable(why) else f"not admitted by policy {getattr(policy, 'name', '?')}"


def select_node(policy: Policy, pod: Pod, state: ClusterState, candidates: np.ndarray) -> int | None:
    """The best-scoring admitted candidate (ties -> the first in ``candidates`` order), or None if none."""
    candidates = admitted(policy, pod, state, candidates)
    if len(candidates) == 0:
        return None
    scores = np.asarray(policy.score(pod, state, candidates), dtype=np.float64)
    return int(candidates[int(np.argmax(scores))])


def normalise_scores(scores: np.ndarray, max_score: int = MAX_NODE_SCORE) -> np.ndarray:
    """Min-max to 0..max_score as kube-scheduler's DefaultNormalizeScore does for reversed=False.

    kube-scheduler divides by the maximum; for scores that may be negative we shift by the minimum.
    All-equal scores map to max_score.
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return s
    lo, hi = float(s.min()), float(s.max())
    if hi == lo:
        return np.full_like(s, float(max_score))
    return (s - lo) * max_score / (hi - lo)
