"""kube-scheduler's default scoring plugins with their real formulas, and the policies built on them.

Each ``score_*`` is a pure function ``(pod, state, candidates) -> (len(candidates),) float`` of
0..100 scores, already normalised the way the plugin's NormalizeScore does it over the candidate
(filtered) nodes. Integer arithmetic follows the Go code (int64 truncation, math.Round where Go
rounds), so a score here equals kube-scheduler's for the same cluster.

Sources (kubernetes pkg/scheduler/framework/plugins): noderesources/{least_allocated,
most_allocated, requested_to_capacity_ratio, balanced_allocation, resource_allocation}.go,
tainttoleration, nodeaffinity, podtopologyspread/scoring.go, interpodaffinity/scoring.go,
helper.DefaultNormalizeScore and helper.BuildBrokenLinearFunction.

Not modelled: ImageLocality (no images), the system-default spread constraints (they need the
pod's owning Service/ReplicaSet), VolumeBinding scoring.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from agmarl_common.cluster.model import GPU_MILLI, HOSTNAME_LABEL, ClusterState, Pod, pod_index
from agmarl_common.cluster.selectors import (
    count_untolerated_prefer,
    label_value,
    matches_label_selector,
    matches_node_selector_term,
    pod_matches_node_affinity,
    term_matches_pod,
)
from agmarl_common.policies.base import MAX_NODE_SCORE, PolicyBase

DEFAULT_MILLI_CPU_REQUEST = 100  # schedutil.DefaultMilliCPURequest
DEFAULT_MEMORY_REQUEST_MIB = 200  # schedutil.DefaultMemoryRequest (200 * 1024 * 1024 bytes)
HARD_POD_AFFINITY_WEIGHT = 1  # InterPodAffinityArgs.hardPodAffinityWeight default
CPU, MEMORY, GPU = "cpu", "memory", "nvidia.com/gpu"

Scorer = Callable[[Pod, ClusterState, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class ResourceSpec:
    name: str  # cpu | memory | nvidia.com/gpu
    weight: int = 1


DEFAULT_RESOURCES = (ResourceSpec(CPU), ResourceSpec(MEMORY))
WITH_GPU = DEFAULT_RESOURCES + (ResourceSpec(GPU),)
PACKING_SHAPE = ((0, 0), (100, 10))  # (utilization %, score 0..10), MaxCustomPriorityScore = 10


# ---------------------------------------------------------------------------------------------
# Normalisation helpers (helper.DefaultNormalizeScore)


def default_normalize(raw: np.ndarray, reverse: bool = False) -> np.ndarray:
    """max-count scaling to 0..100 with int64 truncation; all-zero -> 0 (or 100 when reversed)."""
    raw = np.asarray(raw, dtype=np.int64)
    top = int(raw.max()) if raw.size else 0
    if top == 0:
        return np.full(raw.shape, MAX_NODE_SCORE if reverse else 0, dtype=np.float64)
    s = MAX_NODE_SCORE * raw // top
    return (MAX_NODE_SCORE - s if reverse else s).astype(np.float64)


def _go_round(x: np.ndarray) -> np.ndarray:
    """math.Round: half away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _go_div(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """int64 division truncating toward zero, as Go does."""
    q = np.abs(a) // np.abs(b)
    return np.sign(a) * np.sign(b) * q


# ---------------------------------------------------------------------------------------------
# Resource allocation scorers


def zero_request_counts(state: ClusterState, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bound pods with no cpu / no memory request per candidate (they count as defaults).

    Read from the state's pod index (kept current by bind/unbind), not by scanning every pod.
    """
    idx = pod_index(state)
    c = np.asarray(candidates, dtype=np.int64)
    return idx.zero_cpu[c].astype(np.int64), idx.zero_mem[c].astype(np.int64)


def resource_request_and_allocatable(pod: Pod, state: ClusterState, candidates: np.ndarray, name: str,
                                     non_zero: bool, zero_counts: tuple[np.ndarray, np.ndarray] | None = None
                                     ) -> tuple[np.ndarray, np.ndarray]:
    """(requested including the pod, allocatable) per candidate, as resourceAllocationScorer sees them.

    ``non_zero`` uses kube-scheduler's defaults for pods without requests (100m cpu, 200 MiB), as
    NodeResourcesFit scoring does; BalancedAllocation uses the plain requests. An extended
    resource (GPU) the pod does not request reports allocatable 0 so that it is skipped.
    ``zero_counts`` (from ``zero_request_counts``) saves recounting when several resources are scored.
    """
    c = np.asarray(candidates, dtype=np.int64)
    if non_zero and zero_counts is None and name in (CPU, MEMORY):
        zero_counts = zero_request_counts(state, c)
    if name == CPU:
        used, alloc, req = state.cpu_used[c].copy(), state.cpu_cap[c], pod.cpu_milli
        if non_zero:
            used += DEFAULT_MILLI_CPU_REQUEST * zero_counts[0]
            req = req or DEFAULT_MILLI_CPU_REQUEST
    elif name == MEMORY:
        used, alloc, req = state.mem_used[c].copy(), state.mem_cap[c], pod.memory_mib
        if non_zero:
            used += DEFAULT_MEMORY_REQUEST_MIB * zero_counts[1]
            req = req or DEFAULT_MEMORY_REQUEST_MIB
    elif name == GPU:
        req = pod.gpu_milli_total if pod.is_gpu_share else pod.num_gpu * GPU_MILLI
        if req == 0:
            return np.zeros(len(c), np.int64), np.zeros(len(c), np.int64)
        used, alloc = state.gpu_used[c].sum(axis=1), state.gpu_count[c] * GPU_MILLI
    else:
        raise ValueError(f"unknown resource {name!r}")
    return used + req, np.asarray(alloc, dtype=np.int64)


def _weighted(pod, state, candidates, resources, per_resource, non_zero: bool) -> np.ndarray:
    """sum(score * weight) // sum(weight) over resources the node has (allocatable > 0)."""
    total = np.zeros(len(candidates), dtype=np.int64)
    wsum = np.zeros(len(candidates), dtype=np.int64)
    zero = zero_request_counts(state, candidates) if non_zero else None
    for spec in resources:
        req, alloc = resource_request_and_allocatable(pod, state, candidates, spec.name, non_zero, zero)
        has = alloc > 0
        s = per_resource(req, np.where(has, alloc, 1))
        total += np.where(has, s * spec.weight, 0)
        wsum += np.where(has, spec.weight, 0)
    return np.where(wsum > 0, total // np.maximum(wsum, 1), 0).astype(np.float64)


def score_least_allocated(pod: Pod, state: ClusterState, candidates: np.ndarray,
                          resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES) -> np.ndarray:
    """NodeResourcesFit LeastAllocated: (alloc - req) * 100 / alloc per resource (0 if over)."""
    return _weighted(pod, state, candidates, resources,
                     lambda r, a: np.where(r > a, 0, (a - r) * MAX_NODE_SCORE // a), non_zero=True)


def score_most_allocated(pod: Pod, state: ClusterState, candidates: np.ndarray,
                         resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES) -> np.ndarray:
    """NodeResourcesFit MostAllocated: min(req, alloc) * 100 / alloc per resource."""
    return _weighted(pod, state, candidates, resources,
                     lambda r, a: np.minimum(r, a) * MAX_NODE_SCORE // a, non_zero=True)


def broken_linear(shape: tuple[tuple[int, int], ...], p: np.ndarray) -> np.ndarray:
    """helper.BuildBrokenLinearFunction over int64 utilisations ``p`` (scores already 0..100)."""
    p = np.asarray(p, dtype=np.int64)
    out = np.full(p.shape, shape[-1][1], dtype=np.int64)
    done = np.zeros(p.shape, dtype=bool)
    for k, (u, s) in enumerate(shape):
        hit = ~done & (p <= u)
        if k == 0:
            out[hit] = s
        else:
            u0, s0 = shape[k - 1]
            out[hit] = s0 + _go_div((s - s0) * (p[hit] - u0), u - u0)
        done |= hit
    return out


def score_requested_to_capacity_ratio(pod: Pod, state: ClusterState, candidates: np.ndarray,
                                      shape: tuple[tuple[int, int], ...] = PACKING_SHAPE,
                                      resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES) -> np.ndarray:
    """RequestedToCapacityRatio: shape points (utilisation %, score 0..10) scaled to 0..100; only
    resources with a positive score enter the weighted mean, which is rounded (as in the Go code)."""
    pts = tuple((int(u), int(s) * (MAX_NODE_SCORE // 10)) for u, s in shape)
    total = np.zeros(len(candidates), dtype=np.int64)
    wsum = np.zeros(len(candidates), dtype=np.int64)
    zero = zero_request_counts(state, candidates)
    for spec in resources:
        req, alloc = resource_request_and_allocatable(pod, state, candidates, spec.name, True, zero)
        safe = np.maximum(alloc, 1)
        util = np.where(req >= alloc, 100, np.where(req <= 0, 0, req * 100 // safe))
        s = broken_linear(pts, util)
        use = (alloc > 0) & (s > 0)
        total += np.where(use, s * spec.weight, 0)
        wsum += np.where(use, spec.weight, 0)
    return np.where(wsum > 0, _go_round(total / np.maximum(wsum, 1)), 0).astype(np.float64)


def score_balanced_allocation(pod: Pod, state: ClusterState, candidates: np.ndarray,
                              resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES) -> np.ndarray:
    """NodeResourcesBalancedAllocation: (1 - std of requested/allocatable fractions) * 100.

    Two resources: std = |f0 - f1| / 2; more: population std. Fractions are capped at 1 and use
    plain requests; best-effort pods (no request for any listed resource) are skipped (all 0)."""
    fracs, has = [], []
    for spec in resources:
        req, alloc = resource_request_and_allocatable(pod, state, candidates, spec.name, non_zero=False)
        fracs.append(np.minimum(req / np.maximum(alloc, 1), 1.0))
        has.append(alloc > 0)
    pod_req = {CPU: pod.cpu_milli, MEMORY: pod.memory_mib, GPU: pod.num_gpu * pod.gpu_milli}
    if all(pod_req[s.name] == 0 for s in resources):
        return np.zeros(len(candidates), dtype=np.float64)
    f, h = np.array(fracs).reshape(len(resources), -1), np.array(has).reshape(len(resources), -1)
    n = h.sum(axis=0)
    mean = np.where(n > 0, (f * h).sum(axis=0) / np.maximum(n, 1), 0.0)
    std = np.sqrt(((f - mean) ** 2 * h).sum(axis=0) / np.maximum(n, 1))
    spread = np.where(h, f, -np.inf).max(axis=0) - np.where(h, f, np.inf).min(axis=0)
    std = np.where(n == 2, np.abs(spread) / 2, np.where(n > 2, std, 0.0))  # Go's exact two-resource form
    return np.trunc((1.0 - std) * MAX_NODE_SCORE)


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


# ---------------------------------------------------------------------------------------------
# Policies

DEFAULT_PLUGIN_WEIGHTS: dict[str, int] = {  # kube-scheduler v1 default profile score weights
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "NodeResourcesFit": 1,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesBalancedAllocation": 1,
}


class WeightedPluginsPolicy(PolicyBase):
    """Sum of weight * normalised plugin score, as the scheduling framework combines score plugins."""

    name = "weighted-plugins"

    def __init__(self, plugins: dict[str, tuple[Scorer, int]]):
        self.plugins = plugins

    def plugin_scores(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> dict[str, np.ndarray]:
        """Each plugin's 0..100 score per candidate (for explanations)."""
        c = np.asarray(candidates, dtype=np.int64)
        return {name: scorer(pod, state, c) for name, (scorer, _) in self.plugins.items()}

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        total = np.zeros(len(candidates), dtype=np.float64)
        for name, s in self.plugin_scores(pod, state, candidates).items():
            total += self.plugins[name][1] * s
        return total


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
        })


class KubeResourcesPolicy(WeightedPluginsPolicy):
    """LeastAllocated + BalancedAllocation (1:1): the baseline used until a model exists."""

    name = "kube-resources"

    def __init__(self, resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES):
        super().__init__({
            "NodeResourcesFit": (lambda p, s, c: score_least_allocated(p, s, c, resources), 1),
            "NodeResourcesBalancedAllocation": (lambda p, s, c: score_balanced_allocation(p, s, c, resources), 1),
        })


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
