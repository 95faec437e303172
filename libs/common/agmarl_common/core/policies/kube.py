"""The policies built on kube-scheduler's default scoring plugins: the default profile (``KubeDefaultPolicy``),
its resource part (``KubeResourcesPolicy``), MostAllocated and RequestedToCapacityRatio, and the framework's
weighted sum of plugins they share (``WeightedPluginsPolicy``).

The plugins themselves (pure scorers with kube-scheduler v1.36's formulas, 0..100, Go integer arithmetic)
live in ``agmarl_common.core.scoring`` (``kube_resources``, ``kube_affinity``; the profile weights and the
weighted sum in ``kube_profile``), below both the policies and the learned model's features.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.policies.base import PolicyBase
from agmarl_common.core.scoring.kube_affinity import (
    score_inter_pod_affinity,
    score_node_affinity,
    score_pod_topology_spread,
    score_taint_toleration,
)
from agmarl_common.core.scoring.kube_profile import DEFAULT_PLUGIN_WEIGHTS, Scorer, score_weighted
from agmarl_common.core.scoring.kube_resources import (
    DEFAULT_RESOURCES,
    PACKING_SHAPE,
    ResourceSpec,
    score_balanced_allocation,
    score_balanced_allocation_many,
    score_least_allocated,
    score_least_allocated_many,
    score_most_allocated,
    score_requested_to_capacity_ratio,
)

ManyScorer = Callable[[Sequence[Pod], ClusterState], np.ndarray]  # (P, n_nodes) scores of every pod on every node


def _resource_plugins_many(resources: tuple[ResourceSpec, ...]) -> dict[str, ManyScorer]:
    """The node-local resource plugins of the default profile, scoring many pods at once."""
    return {"NodeResourcesFit": lambda pods, s: score_least_allocated_many(pods, s, resources),
            "NodeResourcesBalancedAllocation": lambda pods, s: score_balanced_allocation_many(pods, s, resources)}


class WeightedPluginsPolicy(PolicyBase):
    """Sum of weight * normalised plugin score, as the scheduling framework combines score plugins.

    ``node_local`` names plugins whose score of a node does not depend on the other candidates (no
    normalisation over them), with a scorer of many pods on every node at once (``ManyScorer``:
    (P, n_nodes)); ``score_batch`` uses it and runs the other plugins pod by pod."""

    name = "weighted-plugins"

    def __init__(self, plugins: dict[str, tuple[Scorer, int]], node_local: dict[str, ManyScorer] | None = None):
        self.plugins = plugins
        self.node_local = dict(node_local or {})

    def plugin_scores(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> dict[str, np.ndarray]:
        """Each plugin's 0..100 score per candidate (for explanations)."""
        c = np.asarray(candidates, dtype=np.int64)
        return {name: scorer(pod, state, c) for name, (scorer, _) in self.plugins.items()}

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        return score_weighted(self.plugins, pod, state, candidates)

    def score_batch(self, pods: Sequence[Pod], state: ClusterState,
                    candidates_list: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``score`` of every pod against the same ``state``, equal to it pod by pod: the node-local
        plugins score all pods on all nodes in one pass, the others run per pod; sums in plugin order."""
        if len(pods) != len(candidates_list):
            raise ValueError(f"score_batch: {len(pods)} pods but {len(candidates_list)} candidate arrays")
        cands = [np.asarray(c, dtype=np.int64) for c in candidates_list]
        if type(self).score is not WeightedPluginsPolicy.score:  # a subclass scores its own way
            return [np.asarray(self.score(p, state, c), dtype=np.float64) for p, c in zip(pods, cands)]
        many = {name: f(pods, state) for name, f in self.node_local.items() if name in self.plugins} if pods else {}
        out = []
        for k, (pod, c) in enumerate(zip(pods, cands)):
            total = np.zeros(len(c), dtype=np.float64)
            for name, (scorer, weight) in self.plugins.items():
                total += weight * (many[name][k, c] if name in many else scorer(pod, state, c))
            out.append(total)
        return out


class KubeDefaultPolicy(WeightedPluginsPolicy):
    """kube-scheduler's default profile (ImageLocality aside): LeastAllocated on ``resources``."""

    name = "kube-default"

    def __init__(self, resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES,
                 weights: dict[str, int] | None = None):
        w = {**DEFAULT_PLUGIN_WEIGHTS, **(weights or {})}
        super().__init__({
            "TaintToleration": (score_taint_toleration, w["TaintToleration"]),
            "NodeAffinity": (score_node_affinity, w["NodeAffinity"]),
            "NodeResourcesFit": (lambda p, s, c: score_least_allocated(p, s, c, resources), w["NodeResourcesFit"]),
            "PodTopologySpread": (score_pod_topology_spread, w["PodTopologySpread"]),
            "InterPodAffinity": (score_inter_pod_affinity, w["InterPodAffinity"]),
            "NodeResourcesBalancedAllocation": (lambda p, s, c: score_balanced_allocation(p, s, c, resources),
                                                w["NodeResourcesBalancedAllocation"]),
        }, _resource_plugins_many(resources))


class KubeResourcesPolicy(WeightedPluginsPolicy):
    """LeastAllocated + BalancedAllocation (1:1): the baseline used until a model exists."""

    name = "kube-resources"
    local_scores = True  # LeastAllocated and BalancedAllocation read only the node (no NormalizeScore)

    def __init__(self, resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES):
        super().__init__({
            "NodeResourcesFit": (lambda p, s, c: score_least_allocated(p, s, c, resources), 1),
            "NodeResourcesBalancedAllocation": (lambda p, s, c: score_balanced_allocation(p, s, c, resources), 1),
        }, _resource_plugins_many(resources))


class MostAllocatedPolicy(PolicyBase):
    name = "most-allocated"
    local_scores = True

    def __init__(self, resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES):
        self.resources = resources

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        return score_most_allocated(pod, state, np.asarray(candidates, dtype=np.int64), self.resources)


class RequestedToCapacityRatioPolicy(PolicyBase):
    name = "rtcr"

    def __init__(self, shape: tuple[tuple[int, int], ...] = PACKING_SHAPE,
                 resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES):
        self.shape, self.resources = shape, resources

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        return score_requested_to_capacity_ratio(pod, state, np.asarray(candidates, dtype=np.int64),
                                                 self.shape, self.resources)
