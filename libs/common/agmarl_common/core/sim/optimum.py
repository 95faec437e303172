"""The offline optimum of a batch-arrival run (``sim.batches``): the most GPU milli any placement of its
pods can allocate, solved exactly as a mixed-integer programme with HiGHS (``highspy``, pinned in
requirements-dev.txt; a dev/benchmark dependency, imported only by this module).

Why one programme for the whole run: nothing departs and resources only fill up, so any feasible final
assignment of a subset of the arrived pods can be reached online by a placer that knows the future
(each group binds its part of that assignment as it arrives; with no cross-pod constraints among openb
pods the hard filter of a pod on a node depends only on the node's capacity). The best final allocation
of the run is therefore the best packing of all its pods into the empty sub-cluster: a ceiling for
every placer, sequential or joint.

The model (exact for openb's shapes; pods with pod (anti-)affinity, spread or host ports are refused):
- pods with the same (cpu, memory, GPU count, milli per GPU, allowed nodes) are one shape s with count c_s;
  "allowed nodes" is the hard filter of one such pod on the empty sub-cluster (taints, node selector,
  GPU model, capacity);
- whole-GPU shapes (1000 milli per GPU): z[s,n] in 0..c_s pods of s on node n;
  shared-GPU shapes (one GPU, < 1000 milli): y[s,n,d] in 0..c_s pods of s on device d of node n;
  w[n,d] in {0,1}: device d of n is taken whole, w[n,d] >= w[n,d+1] (devices are interchangeable);
- per device: sum_s milli_s y[s,n,d] + 1000 w[n,d] <= 1000; per node: sum_d w[n,d] = sum_s gpus_s z[s,n],
  cpu, memory and pod-count capacity; per shape: its pods placed at most c_s times;
- maximise sum_s 1000 gpus_s z + milli_s y (GPU milli placed). CPU-only pods add nothing to the objective
  and only use capacity, so the optimum leaves them out (they are not in the model): the ceiling is on GPU
  milli, not on pods placed.

HiGHS runs single-threaded with a time limit: ``Packing.optimal`` says whether it proved optimality;
otherwise ``value_milli`` is the best placement found and ``bound_milli`` a proven upper bound.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import highspy
import numpy as np

from agmarl_common.core.cluster.filters import feasible_mask
from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Node, Pod

DEFAULT_TIME_LIMIT_S = 30.0


@dataclass(frozen=True)
class Packing:
    value_milli: float  # GPU milli of the best placement found
    bound_milli: float  # proven upper bound on the optimum (HiGHS's dual bound; >= value_milli)
    optimal: bool  # proven optimal within the solver's relative gap (max_gpu_packing HiGHS's 1e-4, device_ceiling 0)
    status: str
    pods_placed: int  # GPU pods in the best placement found


def _shape(pod: Pod) -> tuple[int, int, int, int]:
    return pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli


def _check(pod: Pod) -> None:
    if pod.pod_affinity or pod.pod_anti_affinity or pod.topology_spread or pod.ephemeral_mib:
        raise ValueError(f"max_gpu_packing: {pod.key} has terms the model leaves out (affinity, spread, "
                         "ephemeral storage)")


def _incumbent(state: ClusterState, shapes: list[tuple], z: dict, y: dict, w: dict, n_cols: int) -> np.ndarray:
    """Column values of the placement in ``state`` (its GPU pods; a pod whose shape or node the model lacks
    is left out, which keeps the values feasible). Devices are renumbered per node, whole-taken ones first,
    to meet the model's device order (devices of a node are interchangeable)."""
    x = np.zeros(n_cols)
    code = {key[:4] + (i,): s for s, key in enumerate(shapes)
            for i in np.flatnonzero(np.frombuffer(key[4], dtype=bool)).tolist()}
    for i, pods in enumerate(state.bound):
        placed = [(code.get(_shape(p) + (i,)), p) for p in pods if p.num_gpu > 0]
        placed = [(s, p) for s, p in placed if s is not None]
        whole = sorted({d for _, p in placed if p.gpu_milli >= GPU_MILLI for d in p.gpu_devices})
        rest = sorted(set(range(state.nodes[i].gpu_count)) - set(whole))
        new = {d: k for k, d in enumerate(whole + rest)}
        for k in range(len(whole)):
            x[w[i, k]] = 1.0
        for s, p in placed:
            if p.gpu_milli >= GPU_MILLI:
                x[z[s, i]] += 1
            else:
                x[y[s, i, new[p.gpu_devices[0]]]] += 1
    return x


def max_gpu_packing(nodes: Sequence[Node], pods: Sequence[Pod], time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                    start: ClusterState | None = None) -> Packing:
    """The most GPU milli a placement of ``pods`` on empty ``nodes`` allocates (module docstring).

    ``start``: a final cluster a heuristic reached with these pods (its GPU pods bound on ``nodes``), given
    to the solver as its first incumbent, so the answer is never below it."""
    empty = ClusterState.empty(tuple(nodes))
    counts: Counter = Counter()
    allowed: dict[tuple, np.ndarray] = {}
    for p in pods:
        if p.num_gpu == 0 or p.gpu_milli <= 0:
            continue
        _check(p)
        ok = feasible_mask(p, empty)
        key = _shape(p) + (ok.tobytes(),)
        counts[key] += 1
        allowed[key] = ok
    h = _solver(time_limit_s)
    inf = highspy.kHighsInf
    cols: list[tuple[float, float, float, bool]] = []  # (cost, lo, hi, integer)

    def col(cost: float, hi: float) -> int:
        cols.append((cost, 0.0, hi, True))
        return len(cols) - 1

    rows: list[tuple[float, float, list[int], list[float]]] = []
    n = len(nodes)
    z: dict[tuple[int, int], int] = {}  # (shape, node) -> col
    y: dict[tuple[int, int, int], int] = {}  # (shape, node, device) -> col
    shapes = list(counts)
    for s, key in enumerate(shapes):
        cpu, mem, num, milli, _ = key
        for i in np.flatnonzero(allowed[key]):
            i = int(i)
            if milli >= GPU_MILLI:
                z[s, i] = col(float(num * GPU_MILLI), counts[key])
            else:
                for d in range(nodes[i].gpu_count):
                    y[s, i, d] = col(float(milli), counts[key])
    w = {(i, d): col(0.0, 1.0) for i in range(n) for d in range(nodes[i].gpu_count)}
    for s, key in enumerate(shapes):  # each shape's pods placed at most c_s times
        idx = [c for (t, _), c in z.items() if t == s] + [c for (t, _, _), c in y.items() if t == s]
        if idx:
            rows.append((-inf, float(counts[key]), idx, [1.0] * len(idx)))
    by_node: dict[int, list[tuple[int, tuple]]] = {i: [] for i in range(n)}
    for (s, i), c in z.items():
        by_node[i].append((c, shapes[s]))
    for (s, i, d), c in y.items():
        by_node[i].append((c, shapes[s]))
    for i, nd in enumerate(nodes):
        entries = by_node[i]
        for cap, pick in ((nd.cpu_milli, 0), (nd.memory_mib, 1)):
            rows.append((-inf, float(cap), [c for c, _ in entries], [float(k[pick]) for _, k in entries]))
        rows.append((-inf, float(nd.max_pods), [c for c, _ in entries], [1.0] * len(entries)))
        whole = [(c, shapes[s][2]) for (s, j), c in z.items() if j == i]  # sum_d w = sum_s gpus_s z
        g = nd.gpu_count
        rows.append((0.0, 0.0, [w[i, d] for d in range(g)] + [c for c, _ in whole],
                     [1.0] * g + [-float(k) for _, k in whole]))
        for d in range(g):
            shares = [(c, shapes[s][3]) for (s, j, dd), c in y.items() if j == i and dd == d]
            rows.append((-inf, float(GPU_MILLI), [w[i, d]] + [c for c, _ in shares],
                         [float(GPU_MILLI)] + [float(m) for _, m in shares]))
            if d + 1 < g:
                rows.append((0.0, inf, [w[i, d], w[i, d + 1]], [1.0, -1.0]))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(cols), len(rows)
    lp.col_cost_ = np.array([c[0] for c in cols])
    lp.col_lower_ = np.array([c[1] for c in cols])
    lp.col_upper_ = np.array([c[2] for c in cols])
    lp.row_lower_ = np.array([r[0] for r in rows])
    lp.row_upper_ = np.array([r[1] for r in rows])
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.integrality_ = [highspy.HighsVarType.kInteger] * len(cols)
    starts, index, value = [0], [], []
    for _, _, ix, vals in rows:  # row-wise matrix
        index += ix
        value += vals
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value, dtype=np.float64)
    if not cols:
        return Packing(0.0, 0.0, True, "empty", 0)
    h.passModel(lp)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = _incumbent(start, shapes, z, y, w, len(cols)).tolist()
        sol.value_valid = True
        h.setSolution(sol)
    status, optimal, x, value, bound = _solve(h, len(cols))
    placed = int(round(sum(x[c] for c in list(z.values()) + list(y.values()))))
    return Packing(value_milli=round(value, 3), bound_milli=round(bound, 3), optimal=optimal, status=status,
                   pods_placed=placed)


def device_ceiling(pods: Sequence[Pod], devices: int, must_place: int = 0,
                   time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Packing:
    """An upper bound on the GPU milli any placement of ``pods`` allocates on a cluster of ``devices`` GPUs,
    cheap at any cluster size: every device is one bin of 1000 milli and everything else is left out (CPU,
    memory, pod counts, GPU models, and which node a device is on: a k-GPU pod takes k devices anywhere, and
    may take only some of them; a pod with shares on k devices is k shares). What is left is one-dimensional
    bin packing of the shares, solved exactly as an arc-flow programme (Valerio de Carvalho 1999): positions
    on a device in steps of the shares' greatest common divisor, only those some shares can fill a device up
    to; an arc per share size and start position, a loss arc to the next position; an integer flow of d paths
    is a packing of d devices. Beside it the devices taken whole: maximise 1000 x devices taken whole + the
    milli of the shares placed, with devices taken whole + devices holding shares <= ``devices``.

    ``must_place``: the first ``must_place`` pods are all placed (per size: at least as many as they count).
    A placer that is never free to drop a pod that fits (the inflation protocol drops only a pod no node can
    take) places every pod arriving before the cluster fills; this bounds the placers that drop none of those.
    Infeasible (no such packing exists) gives ``status`` "Infeasible" and value and bound 0; a run stopped by
    ``time_limit_s`` gives HiGHS's proven bound (still a ceiling) and the best packing it found. ``pods_placed``
    counts the shares placed (whole-GPU pods are relaxed to devices and not counted).

    With every constraint it leaves out holding, ``max_gpu_packing``'s optimum is at most this (tested)."""
    firsts = [p for p in list(pods)[:must_place] if p.num_gpu > 0 and p.gpu_milli > 0]
    pods = [p for p in pods if p.num_gpu > 0 and p.gpu_milli > 0]
    shares: Counter = Counter()
    must: Counter = Counter()
    for group, counts in ((pods, shares), (firsts, must)):
        for p in group:
            if p.gpu_milli < GPU_MILLI:
                counts[p.gpu_milli] += p.num_gpu  # a share on each of its devices
    whole = sum(p.num_gpu for p in pods if p.gpu_milli >= GPU_MILLI)
    must_whole = sum(p.num_gpu for p in firsts if p.gpu_milli >= GPU_MILLI)
    step = int(np.gcd.reduce([GPU_MILLI] + list(shares)))
    size = GPU_MILLI // step
    reach = np.zeros(size + 1, bool)  # positions some shares can fill a device up to
    reach[0] = True
    for milli in sorted(shares):
        for _ in range(min(shares[milli], size // (milli // step))):
            reach[milli // step:] |= reach[:size + 1 - milli // step]
    starts = np.flatnonzero(reach[:size]).tolist()  # where a share can start (the end is no start)
    arcs = [(a, a + milli // step, milli) for milli in sorted(shares) for a in starts
            if a + milli // step <= size and reach[a + milli // step]]
    arcs += list(zip(starts, starts[1:] + [size], [0] * len(starts)))  # loss: milli left empty on a device
    n = len(arcs)
    z, w = n, n + 1  # devices holding shares, devices taken whole
    inf = highspy.kHighsInf
    h = _solver(time_limit_s)
    h.setOptionValue("mip_rel_gap", 0.0)  # a ceiling: "optimal" must mean proven, not within HiGHS's 1e-4
    lower = np.zeros(n + 2)
    upper = np.full(n + 2, inf)
    upper[z], lower[w], upper[w] = float(devices), float(must_whole), float(whole)
    cost = np.array([float(milli) for _, _, milli in arcs] + [0.0, float(GPU_MILLI)])
    h.addVars(n + 2, lower, upper)
    h.changeColsCost(n + 2, np.arange(n + 2, dtype=np.int32), cost)
    leaving: dict[int, list[int]] = {a: [] for a in starts + [size]}
    entering: dict[int, list[int]] = {a: [] for a in starts + [size]}
    for j, (a, b, _) in enumerate(arcs):
        leaving[a].append(j)
        entering[b].append(j)

    def row(lo: float, hi: float, idx: list[int], vals: list[float]) -> None:
        h.addRow(lo, hi, len(idx), np.array(idx, dtype=np.int32), np.array(vals, dtype=np.float64))

    row(0.0, 0.0, leaving[0] + [z], [1.0] * len(leaving[0]) + [-1.0])  # z devices start empty ...
    row(0.0, 0.0, entering[size] + [z], [1.0] * len(entering[size]) + [-1.0])  # ... and end full
    for a in starts[1:]:
        row(0.0, 0.0, entering[a] + leaving[a], [1.0] * len(entering[a]) + [-1.0] * len(leaving[a]))
    for milli in sorted(shares):
        idx = [j for j, (_, _, m) in enumerate(arcs) if m == milli]
        row(float(must[milli]), float(shares[milli]), idx, [1.0] * len(idx))
    row(-inf, float(devices), [z, w], [1.0, 1.0])
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    h.changeColsIntegrality(n + 2, np.arange(n + 2, dtype=np.int32),
                            np.array([highspy.HighsVarType.kInteger] * (n + 2)))
    status, optimal, x, value, bound = _solve(h, n + 2)
    if h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
        return Packing(0.0, 0.0, False, status, 0)
    placed = int(np.rint(x[:n])[[milli > 0 for _, _, milli in arcs]].sum())
    return Packing(value_milli=round(value, 3), bound_milli=round(value if optimal else bound, 3), optimal=optimal,
                   status=status, pods_placed=placed)  # optimal with a gap of 0: the value is the bound


def _solver(time_limit_s: float) -> highspy.Highs:
    """A quiet, single-threaded HiGHS stopped by ``time_limit_s``."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(time_limit_s))
    return h


def _solve(h: highspy.Highs, n_cols: int) -> tuple[str, bool, np.ndarray, float, float]:
    """Run the model in ``h``: (status, proven optimal within its relative gap, column values (zeros without a
    solution), the best value found (0 without one), the proven upper bound, never below that value)."""
    h.run()
    info = h.getInfo()
    found = bool(info.primal_solution_status)
    x = np.asarray(h.getSolution().col_value) if found else np.zeros(n_cols)
    value = float(info.objective_function_value) if found else 0.0
    optimal = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return h.modelStatusToString(h.getModelStatus()), optimal, x, value, max(value, float(info.mip_dual_bound))
