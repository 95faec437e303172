"""kube-scheduler's default scoring profile: the plugin weights, the framework's weighted sum of plugin
scores, and the share of it that expresses preferences rather than resources (``score_preferences``).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.scoring.kube_affinity import (
    score_inter_pod_affinity,
    score_node_affinity,
    score_pod_topology_spread,
    score_taint_toleration,
)

Scorer = Callable[[Pod, ClusterState, np.ndarray], np.ndarray]

DEFAULT_PLUGIN_WEIGHTS: dict[str, int] = {  # kube-scheduler v1 default profile score weights
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "NodeResourcesFit": 1,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesBalancedAllocation": 1,
}
PREFERENCE_PLUGINS: dict[str, Scorer] = {  # kube-default's scoring plugins that express preferences, not resources
    "NodeAffinity": score_node_affinity,
    "InterPodAffinity": score_inter_pod_affinity,
    "PodTopologySpread": score_pod_topology_spread,
    "TaintToleration": score_taint_toleration,
}


def score_weighted(plugins: Mapping[str, tuple[Scorer, int]], pod: Pod, state: ClusterState,
                   candidates: np.ndarray) -> np.ndarray:
    """sum(weight * plugin score) per candidate, added in plugin order, as the scheduling framework
    combines score plugins (``plugins``: name -> (scorer, weight))."""
    c = np.asarray(candidates, dtype=np.int64)
    total = np.zeros(len(c), dtype=np.float64)
    for scorer, weight in plugins.values():
        total += weight * scorer(pod, state, c)
    return total


def score_preferences(pod: Pod, state: ClusterState, candidates: np.ndarray,
                      weights: Mapping[str, int] = DEFAULT_PLUGIN_WEIGHTS) -> np.ndarray:
    """kube-default's preference plugins, weighted as in its profile, as a mean in 0..100."""
    plugins = {name: (scorer, weights[name]) for name, scorer in PREFERENCE_PLUGINS.items() if weights.get(name, 0)}
    wsum = sum(w for _, w in plugins.values())
    total = score_weighted(plugins, pod, state, candidates)
    return total / wsum if wsum else total
