"""kube-scheduler's label, taint and topology scoring plugins: TaintToleration, NodeAffinity,
PodTopologySpread (ScheduleAnyway) and InterPodAffinity; conventions (pure, 0..100, Go integer
arithmetic) are in ``agmarl_common.core.scoring``'s docstring.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from agmarl_common.core.cluster.model import HOSTNAME_LABEL, ClusterState, Pod
from agmarl_common.core.cluster.selectors import (
    count_untolerated_prefer,
    label_value,
    matches_label_selector,
    matches_node_selector_term,
    pod_matches_node_affinity,
    term_matches_pod,
)
from agmarl_common.core.scoring.kube_resources import MAX_NODE_SCORE, _go_round, default_normalize

HARD_POD_AFFINITY_WEIGHT = 1  # InterPodAffinityArgs.hardPodAffinityWeight default


# ---------------------------------------------------------------------------------------------
# Label / taint scorers


def score_taint_toleration(pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """Untolerated PreferNoSchedule taints per node, reversed DefaultNormalizeScore."""
    raw = np.zeros(len(candidates), dtype=np.int64)
    tainted = state.tainted[candidates] if state.tainted.shape[0] == state.n_nodes else np.ones(len(candidates), bool)
    for k in np.flatnonzero(tainted):
        raw[k] = count_untolerated_prefer(state.nodes[candidates[k]], pod)
    return default_normalize(raw, reverse=True)


def score_node_affinity(pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """Sum of the weights of matching preferred node-affinity terms, DefaultNormalizeScore."""
    if not pod.preferred_node_affinity:
        return np.zeros(len(candidates), dtype=np.float64)
    raw = np.array([sum(t.weight for t in pod.preferred_node_affinity
                        if matches_node_selector_term(state.nodes[i], t.preference)) for i in candidates],
                   dtype=np.int64)
    return default_normalize(raw)


# ---------------------------------------------------------------------------------------------
# PodTopologySpread (ScheduleAnyway)


def score_pod_topology_spread(pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """PodTopologySpread scoring over the ScheduleAnyway constraints (fewer matching pods = better).

    raw(node) = round(sum_c cnt_c * log(size_c + 2) + maxSkew_c - 1); candidates lacking a key
    score 0; others 100 * (max + min - raw) / max (100 when max is 0)."""
    cons = tuple(c for c in pod.topology_spread if c.when_unsatisfiable == "ScheduleAnyway")
    out = np.zeros(len(candidates), dtype=np.float64)
    if not cons or len(candidates) == 0:
        return out
    keys = [c.topology_key for c in cons]
    ignored = np.array([any(label_value(state.nodes[i], k) is None for k in keys) for i in candidates])
    counts: list[dict[str, int]] = [dict() for _ in cons]
    for i, skip in zip(candidates, ignored):
        if not skip:
            for c, cnt in zip(cons, counts):
                if c.topology_key != HOSTNAME_LABEL:
                    cnt.setdefault(label_value(state.nodes[i], c.topology_key), 0)
    n_ok = int((~ignored).sum())
    weights = [math.log((n_ok if c.topology_key == HOSTNAME_LABEL else len(cnt)) + 2) for c, cnt in zip(cons, counts)]

    def matching(j: int, c) -> int:
        return sum(1 for q in state.bound[j]
                   if q.namespace == pod.namespace and matches_label_selector(c.label_selector, q.labels))

    for j, node in enumerate(state.nodes):
        if any(label_value(node, k) is None for k in keys) or not pod_matches_node_affinity(pod, node):
            continue
        for c, cnt in zip(cons, counts):
            v = label_value(node, c.topology_key)
            if c.topology_key != HOSTNAME_LABEL and v in cnt:
                cnt[v] += matching(j, c)
    raw = np.zeros(len(candidates), dtype=np.int64)
    for k, i in enumerate(candidates):
        if ignored[k]:
            continue
        total = 0.0
        for c, cnt, w in zip(cons, counts, weights):
            n = matching(int(i), c) if c.topology_key == HOSTNAME_LABEL else cnt[label_value(state.nodes[i], c.topology_key)]
            total += n * w + (c.max_skew - 1)
        raw[k] = int(_go_round(np.array(total)))
    if n_ok == 0:
        return out
    lo, hi = int(raw[~ignored].min()), int(raw[~ignored].max())
    if hi == 0:
        return np.where(ignored, 0.0, float(MAX_NODE_SCORE))
    return np.where(ignored, 0, MAX_NODE_SCORE * (hi + lo - raw) // hi).astype(np.float64)


# ---------------------------------------------------------------------------------------------
# InterPodAffinity (preferred terms, and existing pods' terms towards the incoming pod)


def _inter_pod_topology_scores(pod: Pod, state: ClusterState) -> dict[str, dict[str, int]]:
    ts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add(term, owner_ns, target, node, weight):
        v = label_value(node, term.topology_key)
        if v is not None and term_matches_pod(term, owner_ns, target):
            ts[term.topology_key][v] += weight

    incoming = bool(pod.preferred_pod_affinity or pod.preferred_pod_anti_affinity)
    nodes = range(state.n_nodes)
    if not incoming and state.affinity_pods.shape[0] == state.n_nodes:
        nodes = np.flatnonzero(state.affinity_pods)
    for j in nodes:
        node = state.nodes[j]
        for q in state.bound[j]:
            for wt in pod.preferred_pod_affinity:
                add(wt.term, pod.namespace, q, node, wt.weight)
            for wt in pod.preferred_pod_anti_affinity:
                add(wt.term, pod.namespace, q, node, -wt.weight)
            for t in q.pod_affinity:
                add(t, q.namespace, pod, node, HARD_POD_AFFINITY_WEIGHT)
            for wt in q.preferred_pod_affinity:
                add(wt.term, q.namespace, pod, node, wt.weight)
            for wt in q.preferred_pod_anti_affinity:
                add(wt.term, q.namespace, pod, node, -wt.weight)
    return ts


def score_inter_pod_affinity(pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """Sum of topology scores of the node's domains, min-max normalised (float, truncated)."""
    ts = _inter_pod_topology_scores(pod, state)
    if not ts:
        return np.zeros(len(candidates), dtype=np.float64)
    raw = np.array([sum(vals.get(label_value(state.nodes[i], key), 0) for key, vals in ts.items()
                        if label_value(state.nodes[i], key) is not None) for i in candidates], dtype=np.int64)
    if raw.size == 0:
        return raw.astype(np.float64)
    lo, hi = int(raw.min()), int(raw.max())
    if hi - lo <= 0:
        return np.zeros(len(candidates), dtype=np.float64)
    return np.trunc(MAX_NODE_SCORE * ((raw - lo) / (hi - lo)))
