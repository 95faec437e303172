"""kube-scheduler's resource scoring plugins (NodeResourcesFit LeastAllocated / MostAllocated /
RequestedToCapacityRatio, NodeResourcesBalancedAllocation), the framework's score range
(``MAX_NODE_SCORE``) and the normalisation helpers the kube scorers share; conventions (pure, 0..100, Go
integer arithmetic) and sources are in ``agmarl_common.core.scoring``'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Pod, pod_index

MAX_NODE_SCORE = 100  # framework.MaxNodeScore: a score plugin's range is 0..100
DEFAULT_MILLI_CPU_REQUEST = 100  # schedutil.DefaultMilliCPURequest
DEFAULT_MEMORY_REQUEST_MIB = 200  # schedutil.DefaultMemoryRequest (200 * 1024 * 1024 bytes)
CPU, MEMORY, GPU = "cpu", "memory", "nvidia.com/gpu"


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


def pod_request(pod: Pod, name: str) -> int:
    """The pod's plain request of resource ``name`` (milli-cpu, MiB, GPU milli), no defaults."""
    if name == CPU:
        return pod.cpu_milli
    if name == MEMORY:
        return pod.memory_mib
    if name == GPU:
        return pod.gpu_milli_total if pod.is_gpu_share else pod.num_gpu * GPU_MILLI
    raise ValueError(f"unknown resource {name!r}")


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
        req = pod_request(pod, GPU)
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


def _requests_many(pods: Sequence[Pod], name: str, non_zero: bool) -> np.ndarray:
    """(P, 1) int64: each pod's request of ``name`` as ``resource_request_and_allocatable`` adds it."""
    req = np.array([pod_request(p, name) for p in pods], dtype=np.int64)
    if non_zero and name in (CPU, MEMORY):
        req = np.where(req == 0, DEFAULT_MILLI_CPU_REQUEST if name == CPU else DEFAULT_MEMORY_REQUEST_MIB, req)
    return req[:, None]


def request_and_allocatable_many(pods: Sequence[Pod], state: ClusterState, name: str, non_zero: bool,
                                 zero_counts: tuple[np.ndarray, np.ndarray] | None = None
                                 ) -> tuple[np.ndarray, np.ndarray]:
    """``resource_request_and_allocatable`` of every pod on every node at once: (P, n) requested
    including the pod, and allocatable ((n,), or (P, n) for GPUs: 0 in the rows of pods without GPUs)."""
    req = _requests_many(pods, name, non_zero)
    if name == CPU:
        used = state.cpu_used + (DEFAULT_MILLI_CPU_REQUEST * zero_counts[0] if non_zero else 0)
        return used[None, :] + req, np.asarray(state.cpu_cap, dtype=np.int64)
    if name == MEMORY:
        used = state.mem_used + (DEFAULT_MEMORY_REQUEST_MIB * zero_counts[1] if non_zero else 0)
        return used[None, :] + req, np.asarray(state.mem_cap, dtype=np.int64)
    if name == GPU:
        asks = req > 0
        used = state.gpu_used.sum(axis=1)[None, :] + req
        alloc = (state.gpu_count * GPU_MILLI).astype(np.int64)[None, :]
        return np.where(asks, used, 0), np.where(asks, alloc, 0)
    raise ValueError(f"unknown resource {name!r}")


def _zero_counts_all(state: ClusterState) -> tuple[np.ndarray, np.ndarray]:
    return zero_request_counts(state, np.arange(state.n_nodes, dtype=np.int64))


def _weighted_many(pods, state, resources, per_resource, non_zero: bool) -> np.ndarray:
    """``_weighted`` of every pod on every node: (P, n) float64."""
    total = np.zeros((len(pods), state.n_nodes), dtype=np.int64)
    wsum = np.zeros((len(pods), state.n_nodes), dtype=np.int64)
    zero = _zero_counts_all(state) if non_zero else None
    for spec in resources:
        req, alloc = request_and_allocatable_many(pods, state, spec.name, non_zero, zero)
        has = alloc > 0
        s = per_resource(req, np.where(has, alloc, 1))
        total += np.where(has, s * spec.weight, 0)
        wsum += np.where(has, spec.weight, 0)
    return np.where(wsum > 0, total // np.maximum(wsum, 1), 0).astype(np.float64)


def _least(r: np.ndarray, a: np.ndarray) -> np.ndarray:
    return np.where(r > a, 0, (a - r) * MAX_NODE_SCORE // a)


def score_least_allocated(pod: Pod, state: ClusterState, candidates: np.ndarray,
                          resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES) -> np.ndarray:
    """NodeResourcesFit LeastAllocated: (alloc - req) * 100 / alloc per resource (0 if over)."""
    return _weighted(pod, state, candidates, resources, _least, non_zero=True)


def _by_request(pods: Sequence[Pod], resources: tuple[ResourceSpec, ...], many) -> np.ndarray:
    """``many(distinct pods)`` expanded to every pod: pods asking the same amounts of ``resources``
    (replicas, common shapes) get the same node-local resource scores, computed once."""
    keys = [tuple(pod_request(p, s.name) for s in resources) for p in pods]
    first: dict[tuple, int] = {}
    for k, key in enumerate(keys):
        first.setdefault(key, k)
    if len(first) == len(pods):
        return many(pods)
    row = {key: j for j, key in enumerate(first)}
    return many([pods[k] for k in first.values()])[[row[key] for key in keys]]


def score_least_allocated_many(pods: Sequence[Pod], state: ClusterState,
                               resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES) -> np.ndarray:
    """(P, n): ``score_least_allocated`` of every pod on every node (the score of a node does not depend
    on the other candidates, so row k read at pod k's candidates is its score)."""
    return _by_request(pods, resources, lambda ps: _weighted_many(ps, state, resources, _least, non_zero=True))


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


def balance_score(fractions: np.ndarray, present: np.ndarray) -> np.ndarray:
    """int64((1 - std) * 100) of the requested/allocatable fractions, per column (node).

    ``fractions`` (resources, nodes) or (pods, resources, nodes) are already capped at 1; only
    ``present`` resources count.
    Two resources: std = |(f0 - f1) / 2|; more: population std; fewer: std 0 (score 100).
    """
    f, h = np.asarray(fractions, dtype=np.float64), np.asarray(present, dtype=bool)
    ax = -2  # resources: (resources, nodes), or (pods, resources, nodes) for many pods at once
    if f.shape[ax] == 2 and h.all():  # cpu and memory on nodes that have both (the usual case): the same
        # numbers with fewer array passes (max - min of two values is their absolute difference, exactly)
        return np.trunc((1.0 - np.abs(f[..., 0, :] - f[..., 1, :]) / 2) * MAX_NODE_SCORE).astype(np.int64)
    n = h.sum(axis=ax)
    std = np.zeros(n.shape)
    if (n > 2).any():
        mean = np.where(n > 0, (f * h).sum(axis=ax) / np.maximum(n, 1), 0.0)
        std = np.sqrt(((f - np.expand_dims(mean, ax)) ** 2 * h).sum(axis=ax) / np.maximum(n, 1))
    spread = np.where(h, f, -np.inf).max(axis=ax) - np.where(h, f, np.inf).min(axis=ax)
    std = np.where(n == 2, np.abs(spread) / 2, np.where(n > 2, std, 0.0))  # Go's exact two-resource form
    return np.trunc((1.0 - std) * MAX_NODE_SCORE).astype(np.int64)


def score_balanced_allocation(pod: Pod, state: ClusterState, candidates: np.ndarray,
                              resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES) -> np.ndarray:
    """NodeResourcesBalancedAllocation as of v1.36: the change in balance the pod makes.

    with = balance_score(fractions with the pod), without = balance_score(fractions of the node as
    it is); score = 50 + (50 + with - without) // 2 (Go int64; both lie in 50..100, so the result
    does too: 75 for no change, towards 100 when the pod improves the balance, towards 50 when it
    worsens it). Fractions use plain requests (no non-zero defaults) and are capped at 1; a resource
    the node lacks (allocatable 0) or an extended resource the pod does not request is left out of
    both. Best-effort pods (no request for any listed resource) are skipped: all 0.
    """
    c = np.asarray(candidates, dtype=np.int64)
    if len(c) == 0 or all(pod_request(pod, s.name) == 0 for s in resources):
        return np.zeros(len(c), dtype=np.float64)
    with_pod, without_pod, has = [], [], []
    for spec in resources:
        req, alloc = resource_request_and_allocatable(pod, state, c, spec.name, non_zero=False)
        safe = np.maximum(alloc, 1)
        with_pod.append(np.minimum(req / safe, 1.0))
        without_pod.append(np.minimum((req - pod_request(pod, spec.name)) / safe, 1.0))
        has.append(alloc > 0)
    shape = (len(resources), len(c))
    h = np.array(has).reshape(shape)
    # with and without the pod in one call (balance_score's (pods, resources, nodes) form: the same numbers)
    s_with, s_without = balance_score(np.array([with_pod, without_pod]).reshape((2,) + shape), h)
    half = MAX_NODE_SCORE // 2
    return (half + (half + s_with - s_without) // 2).astype(np.float64)


def score_balanced_allocation_many(pods: Sequence[Pod], state: ClusterState,
                                   resources: tuple[ResourceSpec, ...] = DEFAULT_RESOURCES) -> np.ndarray:
    """(P, n): ``score_balanced_allocation`` of every pod on every node (node by node, as that is)."""
    if not pods:
        return np.zeros((0, state.n_nodes), dtype=np.float64)
    return _by_request(pods, resources, lambda ps: _balanced_many(ps, state, resources))


def _balanced_many(pods: Sequence[Pod], state: ClusterState, resources: tuple[ResourceSpec, ...]) -> np.ndarray:
    with_pod, without_pod, has = [], [], []
    for spec in resources:
        req, alloc = request_and_allocatable_many(pods, state, spec.name, non_zero=False)
        alloc = np.broadcast_to(alloc, req.shape)
        safe = np.maximum(alloc, 1)
        with_pod.append(np.minimum(req / safe, 1.0))
        without_pod.append(np.minimum((req - _requests_many(pods, spec.name, False)) / safe, 1.0))
        has.append(alloc > 0)
    h = np.stack(has, axis=1)  # (P, resources, n)
    s_with = balance_score(np.stack(with_pod, axis=1), h)
    s_without = balance_score(np.stack(without_pod, axis=1), h)
    half = MAX_NODE_SCORE // 2
    best_effort = np.array([all(pod_request(p, s.name) == 0 for s in resources) for p in pods])[:, None]
    return np.where(best_effort, 0, half + (half + s_with - s_without) // 2).astype(np.float64)
