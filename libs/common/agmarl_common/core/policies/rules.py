"""Placement rules: fixed orderings a policy's scores are put through, as wrappers of any policy.

``cpu-first:<policy>``: a pod that asks no GPU goes to a node without GPUs whenever one is a candidate. FGD
scores a CPU-only pod by the fragmentation its placement adds, 0 on a node without GPUs and on every GPU node
whose devices stay usable, so those tie; a tie rule that prefers busy nodes (``fgd-pack``, the learned default
model's teacher) then spends the CPU of GPU nodes that GPU pods arriving later need. On the openb pod lists
whose CPU-only pods ask the most (cpu250, cpu300) that cost the model 0.3-1.6 points of GPU allocation against
FGD. ``fgd-pack-cpu`` (policies/fgdpack.py) is this rule on FGD's ties.

``fgd-shares:<policy>``: a GPU share (a pod asking part of one GPU) goes to one of the nodes FGD scores best;
the wrapped policy chooses among them. Where nearly every GPU pod is a share (openb gpushare80 / gpushare100)
the learned model's own choices among shares left it 0.04-0.14 points behind FGD; among FGD's ties (its scores
are integers: many nodes tie) its choices are kept. FGD measures fragmentation against the wrapped policy's
target workload when it has one (``target_workload()``: the learned policy's, observed or implicit), else
against the workload a harness tells it (``observe_workload``).

Both rules serve GPU allocation, and are in force only under that objective (``set_objective``, as the learned
policy is told it: the inflation protocol and ``AGMARL_OBJECTIVE=allocation``); under the composite objective the
wrapped policy's scores stand. Packing CPU-only pods off the GPU nodes is what GPU allocation pays for and what
the composite reward (balance, SLA) does not: on the dynamic synthetic suite ``cpu-first:model:default`` in
force scored 0.750 against the model's 0.841 (docs/model.md "Placement rules"). A heuristic that is never told
an objective is treated as allocation's (the rule is in force).

A rule only reorders: every candidate keeps a finite score, the ones a rule puts last stay below the others in
their own order (a harness that needs the full ranking still gets one), and a pod the rule does not concern
is scored by the wrapped policy unchanged. It never makes a pod wait (the candidates have passed the hard
filter, and the wrapped policy's own admission is kept). GPU devices are the wrapped policy's. Rules compose:
``fgd-shares:cpu-first:model:default`` (docs/model.md "Placement rules"). A wrapped policy that explains itself
(the learned one) keeps its explanation, and each rule adds whether it reordered the pod's candidates and how
(``explanation["rules"]``): the model's own pick there is what it preferred before the rules.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.policies.base import Policy
from agmarl_common.core.policies.fgd import FgdPolicy

ALLOCATION = "allocation"  # features.OBJECTIVES: the objective the rules serve
CPU_FIRST = "cpu-first:"
FGD_SHARES = "fgd-shares:"


def put_last(scores: np.ndarray, last: np.ndarray) -> np.ndarray:
    """``scores`` with the candidates of mask ``last`` below all others, each group in its own order; unchanged
    when ``last`` selects none or all."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0 or not last.any() or last.all():
        return s
    out = s.copy()
    out[last] = s[last] - (s.max() - s.min()) - 1.0
    return out


def cpu_nodes_first(pod: Pod, state: ClusterState, candidates: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """``scores`` (of ``candidates``) with every GPU node last when ``pod`` asks no GPU and some candidate has
    no GPU; otherwise unchanged."""
    if pod.num_gpu > 0:
        return np.asarray(scores, dtype=np.float64)
    return put_last(scores, state.gpu_count[np.asarray(candidates, dtype=np.int64)] > 0)


def fgd_best_for_shares(pod: Pod, state: ClusterState, candidates: np.ndarray, scores: np.ndarray,
                        fgd: FgdPolicy) -> np.ndarray:
    """``scores`` with every node FGD scores below its best last when ``pod`` is a GPU share; otherwise
    unchanged."""
    if not pod.is_gpu_share or len(candidates) == 0:
        return np.asarray(scores, dtype=np.float64)
    f = fgd.score(pod, state, candidates)
    return put_last(scores, f < f.max())


class RulePolicy:
    """``policy`` with one placement rule applied to its scores (``score`` and ``score_batch``) while the objective
    is one the rule serves (``objectives``); everything else is delegated to it. Subclasses define ``prefix`` and
    ``rule``."""

    prefix = ""
    objectives: tuple[str, ...] = (ALLOCATION,)  # under another objective the wrapped policy's scores stand

    def __init__(self, policy: Policy):
        self.policy = policy
        self.name = self.prefix + policy.name
        self._objective: str | None = None

    def set_objective(self, objective: str) -> None:
        """Serve ``objective`` from now on (the wrapped policy is told it too, when it has objectives)."""
        self._objective = objective
        inner = getattr(self.policy, "set_objective", None)
        if callable(inner):
            inner(objective)

    @property
    def objective(self) -> str:
        """What it was told (``set_objective``), else the wrapped policy's objective, else allocation (a heuristic
        has none: the rule is in force)."""
        return self._objective or getattr(self.policy, "objective", None) or ALLOCATION

    def in_force(self) -> bool:
        return self.objective in self.objectives

    @property
    def local_scores(self) -> bool:
        """In force, a rule moves a node's score by the spread of all the candidates' scores, not by the node's
        own (batch mode then scores every candidate again rather than only the nodes a batch's earlier grants
        changed); otherwise the wrapped policy's scores, and their locality, stand."""
        return not self.in_force() and bool(getattr(self.policy, "local_scores", False))

    def rule(self, pod: Pod, state: ClusterState, candidates: np.ndarray, scores: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def note(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> str:
        """How the rule reorders ``pod``'s candidates, "" when it leaves them as the wrapped policy scores them."""
        raise NotImplementedError

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        scores = self.policy.score(pod, state, candidates)
        return self.rule(pod, state, candidates, scores) if self.in_force() else scores

    def choose_gpus(self, pod: Pod, state: ClusterState, node_index: int) -> tuple[int, ...] | None:
        return self.policy.choose_gpus(pod, state, node_index)

    def __getattr__(self, attr: str) -> Any:  # set_objective, explain, prepare, admit, ...
        if attr == "policy":
            raise AttributeError(attr)
        value = getattr(self.policy, attr)
        if attr == "score_batch":
            return self._batch(value)
        return self._explain(value) if attr == "explain" else value

    def _explain(self, inner: Any) -> Any:
        def explain(pod: Pod, state: ClusterState, candidates: np.ndarray, *args: Any, **kwargs: Any) -> dict:
            out = dict(inner(pod, state, candidates, *args, **kwargs))
            if not self.in_force():
                out["rules"] = [*out.get("rules", []), {"rule": self.prefix[:-1], "applied": False,
                                                        "why": f"not in force under the {self.objective} objective "
                                                               f"(it serves {', '.join(self.objectives)})"}]
                return out
            why = self.note(pod, state, np.asarray(candidates, dtype=np.int64))
            out["rules"] = [*out.get("rules", []), {"rule": self.prefix[:-1], "applied": bool(why), "why": why}]
            return out
        return explain

    def _batch(self, inner: Any) -> Any:
        def score_batch(pods: Sequence[Pod], state: ClusterState, candidates_list: Sequence[np.ndarray],
                        *args: Any, **kwargs: Any) -> list[np.ndarray]:
            scored = inner(pods, state, candidates_list, *args, **kwargs)
            if not self.in_force():
                return scored
            return [self.rule(p, state, c, s) for p, c, s in zip(pods, candidates_list, scored)]
        return score_batch


class CpuFirstPolicy(RulePolicy):
    """``cpu-first:<policy>`` (module docstring)."""

    prefix = CPU_FIRST

    def rule(self, pod: Pod, state: ClusterState, candidates: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return cpu_nodes_first(pod, state, candidates, scores)

    def note(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> str:
        gpu = state.gpu_count[candidates] > 0
        if pod.num_gpu > 0 or not gpu.any() or gpu.all():
            return ""
        return (f"a CPU-only pod: the {int((~gpu).sum())} candidates without GPUs first, "
                f"the {int(gpu.sum())} with GPUs last")


class FgdSharesPolicy(RulePolicy):
    """``fgd-shares:<policy>`` (module docstring)."""

    prefix = FGD_SHARES

    def __init__(self, policy: Policy, seed: int = 0):
        super().__init__(policy)
        self.fgd = FgdPolicy(seed)

    def observe_workload(self, pods: Sequence[Pod]) -> None:
        self.fgd.observe_workload(pods)
        observe = getattr(self.policy, "observe_workload", None)
        if callable(observe):
            observe(pods)

    def rule(self, pod: Pod, state: ClusterState, candidates: np.ndarray, scores: np.ndarray) -> np.ndarray:
        target = getattr(self.policy, "target_workload", None)
        if callable(target) and (t := target()) is not None:
            self.fgd.use_target(t)
        return fgd_best_for_shares(pod, state, candidates, scores, self.fgd)

    def note(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> str:
        if not pod.is_gpu_share or candidates.size == 0 or self.fgd.target is None:
            return ""
        f = self.fgd.score(pod, state, candidates)
        best = int((f == f.max()).sum())
        if best == candidates.size:
            return ""
        return (f"a GPU share: among the {best} candidates FGD scores best ({f.max():.0f}), "
                f"the {candidates.size - best} others last")


def wrap_cpu_first(policy: Policy, seed: int = 0) -> CpuFirstPolicy:
    """``cpu-first:<policy>`` (``registry.WRAPPERS``)."""
    return CpuFirstPolicy(policy)


def wrap_fgd_shares(policy: Policy, seed: int = 0) -> FgdSharesPolicy:
    """``fgd-shares:<policy>`` (``registry.WRAPPERS``)."""
    return FgdSharesPolicy(policy, seed)
