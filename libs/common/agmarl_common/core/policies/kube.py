"""kube-scheduler's default scoring plugins with their real formulas, and the policies built on them.

Faithful to kube-scheduler v1.36 (BalancedAllocation scores the change in balance the pod makes,
since v1.36.0, kubernetes PR #135573); checked plugin by plugin against placements and per-plugin
scores recorded from a real v1.36 scheduler (``agmarl fidelity kube``, docs/kube-fidelity.md).

Each ``score_*`` is a pure function ``(pod, state, candidates) -> (len(candidates),) float`` of
0..100 scores, already normalised the way the plugin's NormalizeScore does it over the candidate
(filtered) nodes. Integer arithmetic follows the Go code (int64 truncation, math.Round where Go
rounds), so a score here equals kube-scheduler's for the same cluster.

Sources (kubernetes pkg/scheduler/framework/plugins): noderesources/{least_allocated,
most_allocated, requested_to_capacity_ratio, balanced_allocation, resource_allocation}.go,
tainttoleration, nodeaffinity, podtopologyspread/scoring.go, interpodaffinity/scoring.go,
helper.DefaultNormalizeScore and helper.BuildBrokenLinearFunction.

Not modelled: ImageLocality (the model has no images; it scores 0 on every node when nodes report
no ``status.images``), DynamicResources scoring (no resource claims), the system-default spread
constraints (they need the pod's owning Service/ReplicaSet), VolumeBinding scoring. The final
score is sum(weight * plugin score) over the plugins, as the framework sums them.

The scorers live in ``policies.kube_resources`` (resource allocation) and ``policies.kube_affinity``
(taints, node affinity, topology spread, inter-pod affinity); this module re-exports them and
holds the policies that combine them.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.policies.base import PolicyBase
from agmarl_common.core.policies.kube_affinity import (
    HARD_POD_AFFINITY_WEIGHT,
    score_inter_pod_affinity,
    score_node_affinity,
    score_pod_topology_spread,
    score_taint_toleration,
)
from agmarl_common.core.policies.kube_resources import (
    CPU,
    DEFAULT_MEMORY_REQUEST_MIB,
    DEFAULT_MILLI_CPU_REQUEST,
    DEFAULT_RESOURCES,
    GPU,
    MEMORY,
    PACKING_SHAPE,
    WITH_GPU,
    ResourceSpec,
    balance_score,
    broken_linear,
    default_normalize,
    pod_request,
    resource_request_and_allocatable,
    score_balanced_allocation,
    score_balanced_allocation_many,
    score_least_allocated,
    score_least_allocated_many,
    score_most_allocated,
    score_requested_to_capacity_ratio,
    zero_request_counts,
)

__all__ = [
    "CPU", "DEFAULT_MEMORY_REQUEST_MIB", "DEFAULT_MILLI_CPU_REQUEST", "DEFAULT_PLUGIN_WEIGHTS", "DEFAULT_RESOURCES",
    "GPU", "HARD_POD_AFFINITY_WEIGHT", "MEMORY", "PACKING_SHAPE", "WITH_GPU", "KubeDefaultPolicy",
    "KubeResourcesPolicy", "MostAllocatedPolicy", "RequestedToCapacityRatioPolicy", "ResourceSpec", "Scorer",
    "WeightedPluginsPolicy", "balance_score", "broken_linear", "default_normalize", "pod_request",
    "resource_request_and_allocatable",
    "score_balanced_allocation", "score_inter_pod_affinity", "score_least_allocated", "score_most_allocated",
    "score_node_affinity", "score_pod_topology_spread", "score_requested_to_capacity_ratio",
    "score_taint_toleration", "zero_request_counts",
]

Scorer = Callable[[Pod, ClusterState, np.ndarray], np.ndarray]
ManyScorer = Callable[[Sequence[Pod], ClusterState], np.ndarray]  # (P, n_nodes) scores of every pod on every node


def _resource_plugins_many(resources: tuple[ResourceSpec, ...]) -> dict[str, ManyScorer]:
    """The node-local resource plugins of the default profile, scoring many pods at once."""
    return {"NodeResourcesFit": lambda pods, s: score_least_allocated_many(pods, s, resources),
            "NodeResourcesBalancedAllocation": lambda pods, s: score_balanced_allocation_many(pods, s, resources)}


DEFAULT_PLUGIN_WEIGHTS: dict[str, int] = {  # kube-scheduler v1 default profile score weights
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "NodeResourcesFit": 1,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesBalancedAllocation": 1,
}


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
        total = np.zeros(len(candidates), dtype=np.float64)
        for name, s in self.plugin_scores(pod, state, candidates).items():
            total += self.plugins[name][1] * s
        return total

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

    def __init__(self, resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES):
        super().__init__({
            "NodeResourcesFit": (lambda p, s, c: score_least_allocated(p, s, c, resources), 1),
            "NodeResourcesBalancedAllocation": (lambda p, s, c: score_balanced_allocation(p, s, c, resources), 1),
        }, _resource_plugins_many(resources))


class MostAllocatedPolicy(PolicyBase):
    name = "most-allocated"

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
