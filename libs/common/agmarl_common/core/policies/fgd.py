"""The six policies of the FGD paper's evaluation (Weng et al., USENIX ATC'23, Fig. 9).

Scores follow the paper simulator's score plugins, integer truncation included (it decides ties,
and kube-scheduler breaks ties at random, which the harness does too). Only the policy's own plugin
scores a node; the hard filter has already run. Device choice inside a node:
Random picks a random fitting device for a GPU share; FGD picks the device that minimises the
fragmentation increase; the others use the default tightest fit (``model.choose_gpus``). Whole-GPU
pods always take the lowest-index free devices.

Resource vectors use the pod's non-zero CPU request (100m when it asks 0) and GPU milli;
``MAX_SPEC_CPU`` / ``MAX_SPEC_GPU`` are the simulator's normalisers (128 cores, 8 GPUs).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState, Pod, choose_gpus
from agmarl_common.core.policies.base import Policy, PolicyBase
from agmarl_common.core.scoring.kube_resources import MAX_NODE_SCORE
from agmarl_common.core.sim.fragmentation import TargetWorkload, node_frag_amount, pod_shape, target_workload

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


def _cpu_left(state: ClusterState, idx: np.ndarray) -> np.ndarray:
    return state.cpu_cap[idx] - state.cpu_used[idx]


def _gpu_left(state: ClusterState, idx: np.ndarray) -> np.ndarray:
    exists = np.arange(MAX_GPUS)[None, :] < state.gpu_count[idx][:, None]
    return np.where(exists, GPU_MILLI - state.gpu_used[idx], 0)


def normalise_like_simulator(scores: np.ndarray) -> np.ndarray:
    """The simulator's NormalizeScore: integer min-max to 0..100, all-equal -> 0."""
    s = np.asarray(scores, dtype=np.int64)
    if s.size == 0:
        return s
    lo, hi = int(s.min()), int(s.max())
    if hi == lo:
        return np.zeros_like(s)
    return (s - lo) * MAX_NODE_SCORE // (hi - lo)


class RandomPolicy(PolicyBase):
    """One feasible node chosen uniformly at random; a share goes to a random fitting device."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        s = np.zeros(len(candidates), dtype=np.float64)
        if len(candidates):
            s[int(self.rng.integers(len(candidates)))] = MAX_NODE_SCORE
        return s

    def choose_gpus(self, pod: Pod, state: ClusterState, node_index: int) -> tuple[int, ...] | None:
        if not pod.is_gpu_share:
            return super().choose_gpus(pod, state, node_index)
        ok = np.flatnonzero(state.gpu_free()[node_index] >= pod.gpu_milli)
        return (int(self.rng.choice(ok)),) if ok.size else None


class DotProdPolicy(PolicyBase):
    """Tetris-style alignment: 100 * (1 - <free, request> / 2) on (cpu, total GPU) / max spec."""

    name = "dotprod"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        idx = np.asarray(candidates, dtype=np.int64)
        cpu, milli, num, _ = pod_shape(pod)
        cpu_left = _cpu_left(state, idx)
        gpu_left = _gpu_left(state, idx).sum(axis=1)
        dot = (cpu_left / MAX_SPEC_CPU) * (cpu / MAX_SPEC_CPU)
        dot = dot + (gpu_left / MAX_SPEC_GPU) * (milli * num / MAX_SPEC_GPU)
        s = np.trunc(MAX_NODE_SCORE * (1.0 - dot / 2))
        return np.where(cpu_left < cpu, 0.0, s)


class BestFitPolicy(PolicyBase):
    """Least leftover: 100 * (1 - (0.5 (cpu_free - cpu) / 128 cores + 0.5 (gpu_free - gpu) / 8 GPUs)),
    then the simulator's min-max normalisation."""

    name = "bestfit"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        idx = np.asarray(candidates, dtype=np.int64)
        cpu, milli, num, _ = pod_shape(pod)
        s = (_cpu_left(state, idx) - cpu) / MAX_SPEC_CPU * 0.5
        s = s + (_gpu_left(state, idx).sum(axis=1) - milli * num) / MAX_SPEC_GPU * 0.5
        raw = np.trunc((1.0 - s) * MAX_NODE_SCORE).astype(np.int64)
        return normalise_like_simulator(raw).astype(np.float64)


class GpuPackingPolicy(PolicyBase):
    """Prefer shared GPUs, then free GPUs on used nodes, then idle nodes (CPU pods: all 0)."""

    name = "gpu-packing"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        idx = np.asarray(candidates, dtype=np.int64)
        _, milli, num, _ = pod_shape(pod)
        if milli <= 0:
            return np.zeros(len(idx))
        left = _gpu_left(state, idx)
        exists = np.arange(MAX_GPUS)[None, :] < state.gpu_count[idx][:, None]
        n_free = ((left == GPU_MILLI) & exists).sum(axis=1)
        all_free = n_free == state.gpu_count[idx]
        s_idle = np.maximum(MAX_NODE_SCORE // 3 - n_free, n_free)
        if milli < GPU_MILLI:  # a share uses the tightest fitting device
            tight = np.where(left >= milli, left, GPU_MILLI + 1).min(axis=1)
            s_used = np.where(tight == GPU_MILLI, max(MAX_NODE_SCORE // 2 - 1, MAX_NODE_SCORE // 3),
                              np.maximum(MAX_NODE_SCORE - (tight * 100 // GPU_MILLI) // 10, MAX_NODE_SCORE // 2))
        else:  # whole GPUs: only fully free devices fit
            s_used = np.full(len(idx), max(MAX_NODE_SCORE // 2 - num, MAX_NODE_SCORE // 3))
        return np.where(all_free, s_idle, s_used).astype(np.float64)


def gpu_tag(pod: Pod) -> str:
    """The simulator's GPU affinity tag: no-gpu, share-gpu or '<n>-gpu'."""
    if pod.num_gpu == 0 or pod.gpu_milli <= 0:
        return "no-gpu"
    return "share-gpu" if pod.is_gpu_share else f"{pod.num_gpu}-gpu"


class GpuClusteringPolicy(PolicyBase):
    """Co-locate pods with the same GPU tag: same-tag-only nodes > mixed nodes with the tag >
    empty nodes > others, each band ordered by GPU usage (CPU pods: all 0)."""

    name = "gpu-clustering"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._nodes: tuple = ()
        self._snap: tuple[np.ndarray, ...] = ()
        self._tags: list[dict[str, int]] = []

    def _sync(self, state: ClusterState) -> None:
        """Per-node tag counts, recomputed only for nodes whose usage changed."""
        cur = (state.pods_used, state.cpu_used, state.mem_used, state.gpu_used)
        if state.nodes is not self._nodes or not self._snap:
            self._nodes, self._tags = state.nodes, [{} for _ in state.nodes]
            dirty = np.arange(state.n_nodes)
        else:
            diff = np.zeros(state.n_nodes, dtype=bool)
            for a, b in zip(cur, self._snap):
                d = a != b
                diff |= d.any(axis=1) if d.ndim == 2 else d
            dirty = np.flatnonzero(diff)
        for i in dirty:
            tags: dict[str, int] = {}
            for p in state.bound[i]:
                t = gpu_tag(p)
                if t != "no-gpu":
                    tags[t] = tags.get(t, 0) + 1
            self._tags[i] = tags
        self._snap = tuple(a.copy() for a in cur)

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        idx = np.asarray(candidates, dtype=np.int64)
        tag = gpu_tag(pod)
        if tag == "no-gpu":
            return np.zeros(len(idx))
        self._sync(state)
        used = MAX_NODE_SCORE // 4 * (MAX_SPEC_GPU - _gpu_left(state, idx).sum(axis=1)) // MAX_SPEC_GPU
        same = np.array([self._tags[i].get(tag, 0) > 0 for i in idx], dtype=bool)
        n_tags = np.array([len(self._tags[i]) for i in idx], dtype=np.int64)
        band = np.where(same, np.where(n_tags == 1, 75, 50), np.where(n_tags == 0, 25, 0))
        return (used + band).astype(np.float64)


class FgdPolicy(PolicyBase):
    """Fragmentation gradient descent: the node (and device) whose placement grows the expected
    fragmentation the least; score = trunc(100 * sigmoid((F(before) - F(after)) / 1000)).

    The target workload comes from ``observe_workload`` (or the constructor). Node scores are
    memoised per pod shape and recomputed only for nodes whose usage changed, and for identical
    node states once.
    """

    name = "fgd"
    local_scores = True  # a node's score: its own fragmentation before and after (fgd-pack adds a node key)

    def __init__(self, seed: int = 0, target: TargetWorkload | None = None):
        self.seed = seed
        self.target = target
        self._reset(())

    def observe_workload(self, pods: Sequence[Pod]) -> None:
        self.target = target_workload(pods)
        self._reset(())

    def use_target(self, target: TargetWorkload) -> None:
        """Measure fragmentation against ``target`` from now on (the memo is kept while it is the same)."""
        if target is not self.target:
            self.target = target
            self._reset(())

    def _reset(self, nodes: tuple) -> None:
        self._nodes = nodes
        self._model_code = np.zeros(0, np.int64)
        self._access = np.zeros((0, 0), bool)
        self._cache: dict[tuple, tuple[np.ndarray, ...]] = {}

    def _prepare(self, state: ClusterState) -> None:
        if self.target is None:
            raise ValueError("FgdPolicy needs a target workload: call observe_workload(pods) first")
        if state.nodes is not self._nodes:
            self._reset(state.nodes)
            models = [str(m) for m in state.gpu_model]
            uniq = sorted(set(models))
            self._model_code = np.array([uniq.index(m) for m in models], dtype=np.int64)
            self._access = self.target.accessible(state.gpu_model)

    def _entry(self, shape: tuple, state: ClusterState) -> tuple[np.ndarray, ...]:
        n = state.n_nodes
        if shape not in self._cache:
            self._cache[shape] = (np.full(n, -1, np.int64), np.full((n, MAX_GPUS), -1, np.int64),
                                  np.zeros(n, np.float64), np.full(n, -1, np.int64))
        return self._cache[shape]

    def _compute(self, shape: tuple, state: ClusterState, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(score, share device or -1) for node indexes ``rows``; identical node states once."""
        cpu, milli, num, _ = shape
        cpu_left = _cpu_left(state, rows)
        left = _gpu_left(state, rows)
        key = np.column_stack([cpu_left, left, self._model_code[rows]])
        uniq, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
        u_rows, u_cpu, u_left = rows[first], cpu_left[first], left[first]
        acc = self._access[u_rows]
        before = node_frag_amount(u_cpu, u_left, acc, self.target)
        if 0 < milli < GPU_MILLI:  # a share: try every device that fits
            m = len(u_rows)
            after_left = np.repeat(u_left[:, None, :], MAX_GPUS, axis=1)  # (m, G options, G devices)
            after_left[:, np.arange(MAX_GPUS), np.arange(MAX_GPUS)] -= milli
            after = node_frag_amount(np.repeat(u_cpu - cpu, MAX_GPUS), after_left.reshape(-1, MAX_GPUS),
                                     np.repeat(acc, MAX_GPUS, axis=0), self.target).reshape(m, MAX_GPUS)
            s = np.trunc(1.0 / (1.0 + np.exp(-(before[:, None] - after) / 1000)) * MAX_NODE_SCORE)
            s = np.where(u_left >= milli, s, -1.0)
            dev, score = s.argmax(axis=1), s.max(axis=1)
        else:
            after_left = u_left.copy()
            if milli > 0:  # whole GPUs: the lowest-index free devices
                free = after_left == GPU_MILLI
                take = free & (np.cumsum(free, axis=1) <= num)
                after_left[take] = 0
            after = node_frag_amount(u_cpu - cpu, after_left, acc, self.target)
            score = np.trunc(1.0 / (1.0 + np.exp(-(before - after) / 1000)) * MAX_NODE_SCORE)
            dev = np.full(len(u_rows), -1)
        inv = np.asarray(inv).reshape(-1)
        return score[inv], dev[inv]

    def _scores(self, pod: Pod, state: ClusterState, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._prepare(state)
        shape = pod_shape(pod)
        snap_cpu, snap_gpu, score, dev = self._entry(shape, state)
        stale = (snap_cpu[idx] != state.cpu_used[idx]) | (snap_gpu[idx] != state.gpu_used[idx]).any(axis=1)
        rows = idx[stale]
        if rows.size:
            score[rows], dev[rows] = self._compute(shape, state, rows)
            snap_cpu[rows], snap_gpu[rows] = state.cpu_used[rows], state.gpu_used[rows]
        return score[idx], dev[idx]

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        idx = np.asarray(candidates, dtype=np.int64)
        if idx.size == 0:
            return np.zeros(0)
        return self._scores(pod, state, idx)[0].copy()

    def choose_gpus(self, pod: Pod, state: ClusterState, node_index: int) -> tuple[int, ...] | None:
        if not pod.is_gpu_share:
            return choose_gpus(pod, state.gpu_free()[node_index])
        _, dev = self._scores(pod, state, np.array([node_index], dtype=np.int64))
        return (int(dev[0]),) if dev[0] >= 0 else None


FGD_PAPER_POLICIES: dict[str, Callable[[int], Policy]] = {
    "random": RandomPolicy,
    "dotprod": DotProdPolicy,
    "gpu-clustering": GpuClusteringPolicy,
    "gpu-packing": GpuPackingPolicy,
    "bestfit": BestFitPolicy,
    "fgd": FgdPolicy,
}


def _register() -> None:
    from agmarl_common.core.policies.registry import register_policy  # noqa: PLC0415 - the registry imports us lazily

    for name, factory in FGD_PAPER_POLICIES.items():
        register_policy(name, factory, replace=True)


_register()
