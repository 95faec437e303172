"""Candidate-pair inputs of the scheduling graph: the fragmentation a placement leaves and the pair rows.

``placement_frag_many`` gives the FGD fragmentation amount after placing pod shapes on nodes (and, for a
GPU share, the device leaving the least); ``placement_frag`` is the same for one shape, written plainly
(the reference the batched form is tested against). ``FeatureContext`` (``agmarl_common.core.features``)
memoises them per pod shape and node usage in a ``ShapeMemo`` (through ``shape_jobs`` and ``current_memos``).
``objective_gains`` is the ``reward_gain`` column. ``features.pair_features_batch`` builds the ``cand_attr``
rows (``EDGE_FEATURES``) from these. The row scales shared by node, pod and pair rows live here too. Pure
numpy; every public name is re-exported by ``agmarl_common.core.features``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState, Pod
from agmarl_common.core.scoring.rewardaware import RewardAwareConfig, score_reward_aware_batch, state_terms
from agmarl_common.core.sim.fragmentation import TargetWorkload, node_frag_amount, pod_shape

EDGE_FEATURES = ("cpu_left", "mem_left", "gpu_left", "gpu_left_frac", "frag_delta", "fgd_score", "frag_after",
                 "dev_left", "whole_left", "cpu_tight", "bestfit_left", "opens_node", "fills_gpus", "gpu_share",
                 "reward_gain")
F_EDGE = len(EDGE_FEATURES)  # 15
OBJECTIVES = ("composite", "allocation")  # what the scheduler optimises (``FeatureContext.objective``)


def check_objective(objective: str) -> str:
    """``objective`` when it is one of ``OBJECTIVES``, else ValueError naming them."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    return objective

CPU_SCALE = 128_000.0  # milli-cpu of a large node
MEM_SCALE = 1_048_576.0  # MiB of a large node
GPU_SCALE = float(MAX_GPUS * GPU_MILLI)
FRAG_SCALE = 1000.0  # fragmentation deltas are in GPU milli: one GPU = 1.0
_EARLIER = np.tri(MAX_GPUS, k=-1, dtype=bool)  # [j, j']: device j' comes before device j


def gpu_left(state: ClusterState, rows: np.ndarray) -> np.ndarray:
    """(len(rows), MAX_GPUS) milli free per device of nodes ``rows`` (0 for slots that are not GPUs)."""
    exists = np.arange(MAX_GPUS)[None, :] < state.gpu_count[rows][:, None]
    return np.where(exists, GPU_MILLI - state.gpu_used[rows], 0)


def placement_frag(shape: tuple, state: ClusterState, rows: np.ndarray, access: np.ndarray,
                   target: TargetWorkload) -> tuple[np.ndarray, np.ndarray]:
    """(fragmentation after placing a pod of ``shape`` on each node, device for a share or -1).

    A share tries every device that fits and keeps the one leaving the least fragmentation (ties: the
    lowest index); whole GPUs take the lowest-index free devices, as ``model.choose_gpus`` does."""
    cpu, milli, num, _ = shape
    cpu_left = state.cpu_cap[rows] - state.cpu_used[rows]
    left = gpu_left(state, rows)
    key = np.column_stack([cpu_left, left, access])
    _, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
    inv = np.asarray(inv).reshape(-1)
    u_cpu, u_left, u_acc = cpu_left[first], left[first], access[first]
    m = len(first)
    if 0 < milli < GPU_MILLI:
        opts = np.repeat(u_left[:, None, :], MAX_GPUS, axis=1)  # (m, G options, G devices)
        opts[:, np.arange(MAX_GPUS), np.arange(MAX_GPUS)] -= milli
        after = node_frag_amount(np.repeat(u_cpu - cpu, MAX_GPUS), opts.reshape(-1, MAX_GPUS),
                                 np.repeat(u_acc, MAX_GPUS, axis=0), target).reshape(m, MAX_GPUS)
        after = np.where(u_left >= milli, after, np.inf)
        dev = after.argmin(axis=1)
        best = after[np.arange(m), dev]
        dev = np.where(np.isfinite(best), dev, -1)
        best = np.where(np.isfinite(best), best, node_frag_amount(u_cpu - cpu, u_left, u_acc, target))
    else:
        after_left = u_left.copy()
        if milli > 0:
            free = after_left == GPU_MILLI
            after_left[free & (np.cumsum(free, axis=1) <= num)] = 0
        best = node_frag_amount(u_cpu - cpu, after_left, u_acc, target)
        dev = np.full(m, -1, np.int64)
    return best[inv], dev[inv].astype(np.int64)


FEW_ROWS = 32  # ``placement_frag_many`` looks for equal node states (``np.unique``) above this many rows


def placement_frag_many(jobs: Sequence[tuple[tuple, np.ndarray]], state: ClusterState, access: np.ndarray,
                        access_class: np.ndarray, target: TargetWorkload,
                        free: tuple[np.ndarray, np.ndarray] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """``placement_frag`` of several pod shapes at once: ``jobs`` are (shape, node rows); ``access`` (n, K)
    and ``access_class`` (n,) (equal ids = equal access rows) cover every node. One fragmentation pass
    for all shares (every device option) and one for the rest; identical (shape, node state) rows once.
    ``free``: (cpu left (n,), ``gpu_left`` (n, G)) of every node of ``state`` when the caller keeps them
    (``FeatureContext``), read instead of recomputed."""
    if not jobs:
        return []
    sizes = [len(r) for _, r in jobs]
    rows = np.concatenate([np.asarray(r, np.int64) for _, r in jobs])
    sid = np.repeat(np.arange(len(jobs)), sizes)
    best, dev = placement_frag_flat(shape_requests([sh for sh, _ in jobs]), sid, rows, state, access, access_class,
                                    target, free)
    ends = np.cumsum(sizes).tolist()
    return [(best[end - size:end], dev[end - size:end]) for size, end in zip(sizes, ends)]  # np.split, cheaper


def shape_requests(shapes: Sequence[tuple]) -> np.ndarray:
    """(S, 3) int64: the cpu milli, GPU milli and GPU count of each pod shape (``pod_shape``)."""
    return np.array([sh[:3] for sh in shapes], np.int64).reshape(-1, 3)


def placement_frag_flat(shp: np.ndarray, sid: np.ndarray, rows: np.ndarray, state: ClusterState, access: np.ndarray,
                        access_class: np.ndarray, target: TargetWorkload,
                        free: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``placement_frag_many`` of flat pairs: pair e places a pod of shape ``shp[sid[e]]`` (``shape_requests``)
    on node ``rows[e]``; returns ((E,) fragmentation after, (E,) device). A row's result does not depend on the
    other pairs (bit for bit)."""
    if free is None:
        cpu_left, left = state.cpu_cap[rows] - state.cpu_used[rows], gpu_left(state, rows)
    else:
        cpu_left, left = free[0][rows], free[1][rows]
    # a few rows are computed as they are: finding equal ones (``np.unique``) costs more than it saves; the result
    # is the same bit for bit (a row's fragmentation does not depend on its batch: ``expectation``)
    if rows.size <= FEW_ROWS:
        first = inv = np.arange(rows.size)
    else:
        key = np.ascontiguousarray(np.column_stack([sid, cpu_left, left, access_class[rows]]).astype(np.int64))
        void = key.view(np.dtype((np.void, key.itemsize * key.shape[1]))).reshape(-1)
        _, first, inv = np.unique(void, return_index=True, return_inverse=True)
        inv = np.asarray(inv).reshape(-1)
    u_sid, u_left, u_acc = sid[first], left[first], access[rows[first]]
    u_cpu = cpu_left[first] - shp[u_sid, 0]  # cpu left after the placement
    milli, num = shp[u_sid, 1], shp[u_sid, 2]
    m = len(first)
    best, dev = np.zeros(m), np.full(m, -1, np.int64)
    share = np.flatnonzero((milli > 0) & (milli < GPU_MILLI))
    rest = np.flatnonzero(~((milli > 0) & (milli < GPU_MILLI)))
    if share.size:
        ul, mm = u_left[share], milli[share]
        # options: a device that fits, the first of the devices with its free milli (the fragmentation is
        # the same whichever of equal devices takes the share, and ties go to the lowest index)
        earlier_equal = (ul[:, :, None] == ul[:, None, :]) & _EARLIER[None]
        oi, oj = np.nonzero((ul >= mm[:, None]) & ~earlier_equal.any(axis=2))
        opts = ul[oi].copy()
        opts[np.arange(oi.size), oj] -= mm[oi]
        after = np.full((share.size, MAX_GPUS), np.inf)
        after[oi, oj] = node_frag_amount(u_cpu[share][oi], opts, u_acc[share][oi], target)
        d = after.argmin(axis=1)
        b = after[np.arange(share.size), d]
        ok = np.isfinite(b)
        dev[share] = np.where(ok, d, -1)
        if not ok.all():  # no device fits: the node as it is
            miss = share[~ok]
            b[~ok] = node_frag_amount(u_cpu[miss], u_left[miss], u_acc[miss], target)
        best[share] = b
    if rest.size:
        after_left = u_left[rest].copy()
        free = after_left == GPU_MILLI
        take = free & (np.cumsum(free, axis=1) <= num[rest][:, None]) & (milli[rest] > 0)[:, None]
        after_left[take] = 0  # whole GPUs: the lowest-index free devices
        best[rest] = node_frag_amount(u_cpu[rest], after_left, u_acc[rest], target)
    return best[inv], dev[inv]


def shape_jobs(pods: Sequence[Pod], idx: np.ndarray, pod_of: np.ndarray,
               n: int) -> tuple[list[tuple[tuple, np.ndarray]], np.ndarray]:
    """Pairs (pair e places ``pods[pod_of[e]]`` on node ``idx[e]``) grouped by pod shape: (jobs, one
    (shape, ascending distinct node rows) per shape in first-seen order; (E,) each pair's cell
    ``shape number * n + node`` of an (S, n) table, the concatenation of the shapes' (n,) memo arrays)."""
    shapes: dict[tuple, int] = {}
    sid = np.array([shapes.setdefault(pod_shape(p), len(shapes)) for p in pods], np.int64)
    flat = sid[pod_of] * n + idx  # pair -> (shape, node) cell of an (S, n) table
    used = np.zeros(len(shapes) * n, bool)
    used[flat] = True
    cells = np.flatnonzero(used)  # sorted: shape by shape, nodes ascending
    cuts = np.searchsorted(cells, np.arange(1, len(shapes)) * n)
    jobs = [(shape, rows - s * n) for (shape, s), rows in zip(shapes.items(), np.split(cells, cuts))]
    return jobs, flat


MEMO_SHAPES = 256  # pod shapes a ``ShapeMemo`` holds (4 float64 / int64 values per node each); then the least recently
# used makes room


class ShapeMemo:
    """The fragmentation memo: per pod shape and node, (row version, delta, after, device) of placing a pod of
    that shape on that node, held as rows of (S, n) tables (one row per shape) so that many shapes' rows are
    checked and written in one numpy operation. ``entry(slot(shape))`` gives the shape's four (n,) arrays (views
    of its rows); a version -1 is a row never computed.

    A long-running service meets new pod shapes for ever: past ``limit`` shapes, a new one takes the row of the
    shape used least recently (its rows are computed again if it comes back: the same values). A row handed out
    since the last ``begin`` is never taken, so the views one call holds stay its own (the tables grow instead)."""

    def __init__(self, n: int, capacity: int = 16, limit: int | None = None) -> None:
        self.n = n
        self.limit = MEMO_SHAPES if limit is None else limit
        self.slots: dict[tuple, int] = {}
        self.shapes: list[tuple] = []
        self.ver = np.full((capacity, n), -1, np.int64)
        self.delta = np.zeros((capacity, n))
        self.after = np.zeros((capacity, n))
        self.dev = np.full((capacity, n), -1, np.int64)
        self.used = np.zeros(capacity, np.int64)  # the round each row was last handed out in
        self.round = 1

    def begin(self) -> None:
        """A new round of use: rows handed out before it may be taken by new shapes."""
        self.round += 1

    def slot(self, shape: tuple) -> int:
        """The shape's row in the tables (a new one the first time: the tables double when full, up to ``limit``
        shapes; past it, the row of the shape used least recently, unless every row was used this round)."""
        s = self.slots.get(shape)
        if s is None:
            lru = int(np.argmin(self.used[:len(self.shapes)])) if len(self.shapes) >= self.limit else -1
            if lru >= 0 and self.used[lru] < self.round:  # the least recently used shape's rows are dropped
                s = lru
                del self.slots[self.shapes[s]]
                self.shapes[s] = shape
                self.ver[s] = -1
            else:
                s = len(self.shapes)
                self.shapes.append(shape)
                if s == self.ver.shape[0]:
                    grow = s  # doubled
                    self.ver = np.concatenate([self.ver, np.full((grow, self.n), -1, np.int64)])
                    self.delta = np.concatenate([self.delta, np.zeros((grow, self.n))])
                    self.after = np.concatenate([self.after, np.zeros((grow, self.n))])
                    self.dev = np.concatenate([self.dev, np.full((grow, self.n), -1, np.int64)])
                    self.used = np.concatenate([self.used, np.zeros(grow, np.int64)])
            self.slots[shape] = s
        self.used[s] = self.round
        return s

    def entry(self, s: int) -> tuple[np.ndarray, ...]:
        """The four (n,) arrays of row ``s`` (views: valid until the tables grow)."""
        return self.ver[s], self.delta[s], self.after[s], self.dev[s]

    def update(self, job_slots: Sequence[int], sid: np.ndarray, rows: np.ndarray, state: ClusterState,
               version: np.ndarray, frag: np.ndarray, access: np.ndarray, access_class: np.ndarray,
               target: TargetWorkload, free: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Compute the cells (shape row ``job_slots[sid[e]]``, node ``rows[e]``) in one ``placement_frag_flat``
        pass and mark them current at ``version`` (``frag``: each node's fragmentation now)."""
        if not rows.size:
            return
        a, d = placement_frag_flat(shape_requests([self.shapes[s] for s in job_slots]), sid, rows, state, access,
                                   access_class, target, free)
        slots = np.asarray(job_slots, np.int64)[sid]
        self.after[slots, rows], self.dev[slots, rows] = a, d
        self.delta[slots, rows] = a - frag[rows]
        self.ver[slots, rows] = version[rows]


def current_memos(memo: ShapeMemo, jobs: list[tuple[tuple, np.ndarray | None]], state: ClusterState,
                  version: np.ndarray, frag: np.ndarray, access: np.ndarray, access_class: np.ndarray,
                  target: TargetWorkload,
                  free: tuple[np.ndarray, np.ndarray] | None = None) -> list[tuple[np.ndarray, ...]]:
    """The memo entry (row version, delta, after, device; (n,) arrays) of each job's pod shape, made current
    on the job's nodes (``None``: every node): a row is recomputed when its version differs from ``version``
    (the caller bumps a node's version when its usage changes; ``frag`` (n,) is each node's current
    fragmentation). All stale rows go through one ``ShapeMemo.update`` (``free``: the current free cpu and
    devices of every node, when the caller keeps them)."""
    memo.begin()
    slots = [memo.slot(shape) for shape, _ in jobs]  # every shape's row first: a table that grows leaves views behind
    memos, job_slots, stale = [], [], []
    for s, (_, idx) in zip(slots, jobs):
        entry = memo.entry(s)
        rows = np.flatnonzero(entry[0] != version) if idx is None else idx[entry[0][idx] != version[idx]]
        memos.append(entry)
        if rows.size:
            job_slots.append(s)
            stale.append(rows)
    if stale:
        one = len(stale) == 1  # the live path: one pod, one shape (no repeat, no concatenation)
        sid = np.zeros(stale[0].size, np.int64) if one else np.repeat(np.arange(len(stale)), [r.size for r in stale])
        memo.update(job_slots, sid, stale[0] if one else np.concatenate(stale), state, version, frag, access,
                    access_class, target, free)
    return memos


@lru_cache(maxsize=None)
def _config(scheme: str) -> RewardAwareConfig:
    """The reward-aware expert's default configuration under ``scheme`` (frozen: built once per scheme)."""
    return RewardAwareConfig(scheme=scheme)


def objective_state(state: ClusterState, objective: str) -> None:
    """Compute ahead what ``objective_gains`` reads of ``state`` alone (``rewardaware.state_terms``), e.g. between
    pods in the live loop; nothing under ``allocation``. The gains are the same with or without it."""
    if objective == "composite":
        state_terms(state)


def objective_gains(pods: Sequence[Pod], state: ClusterState, candidates: Sequence[np.ndarray], objective: str,
                    scheme: str = "fixed") -> np.ndarray:
    """(E,) the ``reward_gain`` column, pod-major: under the ``composite`` objective, each pod's
    reward-aware score of its candidates (``scoring.rewardaware``: the one-step change of the composite
    reward of ``scheme``, plus kube-default's preference plugins) rescaled within the pod to [-1, 0]
    (its best candidate 0, its worst -1; all 0 when they tie); 0 everywhere under ``allocation`` (the
    GPU-packing objective of the inflation protocol, which the composite reward does not measure)."""
    check_objective(objective)
    sizes = [len(c) for c in candidates]
    if objective != "composite":
        return np.zeros(int(sum(sizes)))
    cols = []
    for s in score_reward_aware_batch(pods, state, candidates, _config(scheme)):
        best = s.max() if s.size else 0.0
        spread = float(best - s.min()) if s.size else 0.0
        cols.append((s - best) / spread if spread > 1e-12 else np.zeros(s.size))
    return np.concatenate(cols) if cols else np.zeros(0)
