"""Exact placement of a group of pods on a partly used cluster: one mixed-integer programme (HiGHS).

``pack_group`` answers, for a group and the cluster as it is now, where each pod goes (or nowhere),
maximising

    gain * (GPU milli placed) + 0.001 * (pods placed)
      - open_cost * (wholly free devices that receive a share)
      - short_cost * sum_n max(0, cpu_per_gpu * (wholly free devices of n after) - CPU milli left on n after)

subject to the pods in ``mandatory`` all being placed (None when they cannot all be). With no pod mandatory
and the defaults it is the knapsack that places the most GPU milli of the group (``SwitchPlacer``'s exact
overflow candidate, ``policies.joint``); with every pod mandatory the first terms are fixed and the rest is
a bin packing of the group's shares onto the fewest wholly free devices that keeps CPU beside the whole
GPUs left (tried for groups that fit; it lost to FGD, docs/evaluation.md).

The model (``sim.optimum``'s, on the residual cluster; exact for openb's shapes: pods with pod
(anti-)affinity, spread or ephemeral storage, or shares of several devices, are refused: None):
- pods with the same (cpu, memory, GPU count, milli per GPU, nodes passing the hard filter now) are one
  shape s with count c_s, of which m_s are mandatory;
- whole-GPU shapes: z[s,n] pods of s on node n; shared-GPU shapes (one GPU, < 1000 milli): y[s,n,d] pods
  on device d of n with at least the share free; CPU-only shapes: x[s,n];
  w[n,d] in {0,1}: a wholly free device of n taken whole (interchangeable: w[n,d] >= w[n,d+1]);
  o[n,d] in {0,1}: a wholly free device that receives a share;
- per device: sum_s milli_s y[s,n,d] + 1000 w[n,d] <= milli free on it; shares on a wholly free device only
  if it is opened; per node: sum_d w[n,d] = sum_s gpus_s z[s,n], and cpu, memory and pod count within
  what is left; per shape: m_s <= placed <= c_s.

The answer's binds are re-checked by whoever binds them (``joint.commit``, the harness). Pure and
deterministic: HiGHS runs single-threaded with a fixed seed and stops at ``max_nodes`` branch-and-bound
nodes, within ``rel_gap`` of its bound, or (``max_sols`` > 0) at its ``max_sols``-th improving solution
(``policies.joint.plan_whole``'s planning MIPs, large and only a heuristic's input, stop at the second);
the wall-clock ``time_limit_s`` is a backstop that the
benchmark's groups never reach (were it reached, the answer could depend on the machine's speed;
``PackResult.status`` says which limit ended the search). ``highspy`` is pinned in requirements-dev.txt
(as for ``sim.optimum``): this module and what imports it (``policies.joint``) are for the benchmarks,
not the services.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import highspy
import numpy as np

from agmarl_common.core.cluster.filters import feasible_mask
from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Pod
from agmarl_common.core.sim.batches import Bind

DEFAULT_TIME_LIMIT_S = 120.0  # a wall-clock backstop only: the node limit ends a search first on the benchmark's groups
DEFAULT_MAX_NODES = 200  # branch-and-bound nodes (deterministic, unlike the clock)
DEFAULT_REL_GAP = 1e-3  # stop within 0.1 % of the proven bound
POD_BONUS = 1e-3  # per pod placed: of two placements with the same GPU milli, the one with more pods


@dataclass(frozen=True)
class PackResult:
    binds: tuple[Bind, ...]  # (position in the group, node, devices), in group order
    milli: int  # GPU milli the binds place
    opened: int  # wholly free devices that received a share
    optimal: bool
    status: str


def modelled(pod: Pod) -> bool:
    """Whether the programme is exact for ``pod`` (no inter-pod terms, shares on one device)."""
    if pod.pod_affinity or pod.pod_anti_affinity or pod.topology_spread or pod.ephemeral_mib:
        return False
    return pod.num_gpu == 0 or pod.gpu_milli >= GPU_MILLI or pod.num_gpu == 1


class _Model:
    """Columns and rows of one programme, built incrementally (integer columns, row-wise matrix)."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.upper: list[float] = []
        self.lower_rows: list[float] = []
        self.upper_rows: list[float] = []
        self.starts, self.index, self.value = [0], [], []

    def col(self, cost: float, hi: float) -> int:
        self.cost.append(cost)
        self.upper.append(hi)
        return len(self.cost) - 1

    def row(self, lo: float, hi: float, cols: Sequence[int], vals: Sequence[float]) -> None:
        self.lower_rows.append(lo)
        self.upper_rows.append(hi)
        self.index += list(cols)
        self.value += list(vals)
        self.starts.append(len(self.index))

    def solve(self, time_limit_s: float, max_nodes: int, rel_gap: float,
              max_sols: int = 0) -> tuple[np.ndarray | None, bool, str]:
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        h.setOptionValue("random_seed", 0)
        h.setOptionValue("time_limit", float(time_limit_s))
        h.setOptionValue("mip_max_nodes", int(max_nodes))
        h.setOptionValue("mip_rel_gap", float(rel_gap))
        if max_sols > 0:
            h.setOptionValue("mip_max_improving_sols", int(max_sols))
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = len(self.cost), len(self.lower_rows)
        lp.col_cost_ = np.array(self.cost)
        lp.col_lower_ = np.zeros(len(self.cost))
        lp.col_upper_ = np.array(self.upper)
        lp.row_lower_ = np.array(self.lower_rows)
        lp.row_upper_ = np.array(self.upper_rows)
        lp.sense_ = highspy.ObjSense.kMaximize
        lp.integrality_ = [highspy.HighsVarType.kInteger] * len(self.cost)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.array(self.starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(self.index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(self.value, dtype=np.float64)
        h.passModel(lp)
        h.run()
        status = h.modelStatusToString(h.getModelStatus())
        if not h.getInfo().primal_solution_status:
            return None, False, status
        x = np.rint(np.asarray(h.getSolution().col_value)).astype(np.int64)
        return x, h.getModelStatus() == highspy.HighsModelStatus.kOptimal, status


def pack_group(group: Sequence[Pod], state: ClusterState, mandatory: Sequence[bool] | None = None,
               gain: float = 1.0, open_cost: float = 0.0, cpu_per_gpu: float = 0.0, short_cost: float = 0.0,
               time_limit_s: float = DEFAULT_TIME_LIMIT_S, max_nodes: int = DEFAULT_MAX_NODES,
               rel_gap: float = DEFAULT_REL_GAP, max_sols: int = 0) -> PackResult | None:
    """The best placement of ``group`` on ``state`` (module docstring). ``mandatory``: per pod, whether it
    must be placed (None: all). None when a pod is not ``modelled``, when the mandatory pods cannot all be
    placed, or when the solver finds no placement in time."""
    if not all(modelled(p) for p in group):
        return None
    must = [True] * len(group) if mandatory is None else [bool(b) for b in mandatory]
    members: dict[tuple, list[int]] = defaultdict(list)
    allowed: dict[tuple, np.ndarray] = {}
    for k, p in enumerate(group):
        ok = feasible_mask(p, state)
        key = (p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, ok.tobytes())
        members[key].append(k)
        allowed[key] = ok
    shapes = list(members)
    free = state.gpu_free()
    whole_free = free >= GPU_MILLI
    m = _Model()
    z: dict[tuple[int, int], int] = {}
    y: dict[tuple[int, int, int], int] = {}
    x: dict[tuple[int, int], int] = {}
    node_cols: dict[int, list[tuple[int, int]]] = defaultdict(list)  # node -> (col, shape)
    for s, key in enumerate(shapes):
        _, _, num, milli, _ = key
        c = len(members[key])
        value = POD_BONUS + gain * num * milli
        for i in np.flatnonzero(allowed[key]).tolist():
            if num == 0:
                x[s, i] = col = m.col(value, c)
                node_cols[i].append((col, s))
            elif milli >= GPU_MILLI:
                z[s, i] = col = m.col(value, c)
                node_cols[i].append((col, s))
            else:
                for d in np.flatnonzero(free[i] >= milli).tolist():
                    y[s, i, d] = col = m.col(value, c)
                    node_cols[i].append((col, s))
    w: dict[tuple[int, int], int] = {}
    o: dict[tuple[int, int], int] = {}
    share_on: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # device -> (col, milli)
    for (s, i, d), col in y.items():
        share_on[i, d].append((col, shapes[s][3]))
    smallest = min((shapes[s][3] for s, _, _ in y), default=GPU_MILLI)
    for s, key in enumerate(shapes):
        idx = [c for (t, _), c in z.items() if t == s] + [c for (t, _, _), c in y.items() if t == s] \
            + [c for (t, _), c in x.items() if t == s]
        need = float(sum(must[k] for k in members[key]))
        if need > 0 and not idx:
            return None
        if idx:
            m.row(need, float(len(members[key])), idx, [1.0] * len(idx))
    for i in range(state.n_nodes):
        entries = node_cols.get(i, [])
        if not entries:
            continue
        for left, pick in ((state.cpu_cap[i] - state.cpu_used[i], 0), (state.mem_cap[i] - state.mem_used[i], 1)):
            m.row(-highspy.kHighsInf, float(left), [c for c, _ in entries], [float(shapes[s][pick]) for _, s in entries])
        m.row(-highspy.kHighsInf, float(state.pods_cap[i] - state.pods_used[i]), [c for c, _ in entries],
              [1.0] * len(entries))
        whole = [(c, shapes[s][2]) for (s, j), c in z.items() if j == i]
        devices = np.flatnonzero(whole_free[i]).tolist()
        if whole:
            for d in devices:
                w[i, d] = m.col(0.0, 1.0)
            m.row(0.0, 0.0, [w[i, d] for d in devices] + [c for c, _ in whole],
                  [1.0] * len(devices) + [-float(g) for _, g in whole])
            for a, b in zip(devices, devices[1:]):
                m.row(0.0, highspy.kHighsInf, [w[i, a], w[i, b]], [1.0, -1.0])
        for d in range(int(state.gpu_count[i])):
            shares = share_on.get((i, d), [])
            taken = [w[i, d]] if (i, d) in w else []
            if not shares:
                continue
            m.row(-highspy.kHighsInf, float(free[i, d]), taken + [c for c, _ in shares],
                  [float(GPU_MILLI)] * len(taken) + [float(v) for _, v in shares])
            if whole_free[i, d]:
                o[i, d] = m.col(-open_cost, 1.0)
                m.row(-highspy.kHighsInf, 0.0, [c for c, _ in shares] + [o[i, d]],
                      [1.0] * len(shares) + [-float(GPU_MILLI // smallest)])
    if cpu_per_gpu > 0 and short_cost > 0:
        _cpu_short(m, state, shapes, node_cols, w, o, whole_free, cpu_per_gpu, short_cost)
    if not m.cost:
        return PackResult((), 0, 0, True, "empty") if not any(must) else None
    sol, optimal, status = m.solve(time_limit_s, max_nodes, rel_gap, max_sols)
    if sol is None:
        return None
    return _binds(group, shapes, members, must, sol, z, y, x, w, o, optimal, status)


def _cpu_short(m: _Model, state: ClusterState, shapes: list[tuple], node_cols: dict, w: dict, o: dict,
               whole_free: np.ndarray, cpu_per_gpu: float, short_cost: float) -> None:
    """short[n] >= cpu_per_gpu * (wholly free devices of n after the group) - CPU left on n after it, costing
    ``short_cost`` per CPU milli: whole GPUs left beside too little CPU for the pods that would use them."""
    for i, entries in node_cols.items():
        n_free = int(whole_free[i].sum())
        if n_free == 0:
            continue
        used = [w[i, d] for d in range(int(state.gpu_count[i])) if (i, d) in w] + \
               [o[i, d] for d in range(int(state.gpu_count[i])) if (i, d) in o]
        short = m.col(-short_cost, highspy.kHighsInf)
        left = float(state.cpu_cap[i] - state.cpu_used[i])
        m.row(cpu_per_gpu * n_free - left, highspy.kHighsInf, [short] + used + [c for c, _ in entries],
              [1.0] + [cpu_per_gpu] * len(used) + [-float(shapes[s][0]) for _, s in entries])


def _binds(group, shapes, members, must, sol, z, y, x, w, o, optimal, status) -> PackResult | None:
    """The solution as binds: each shape's placed pods (mandatory first) given out to its columns; whole-GPU
    pods of a node take the node's devices marked taken whole, in order."""
    queue = {s: sorted(members[key], key=lambda k: (not must[k], k)) for s, key in enumerate(shapes)}
    taken: dict[int, list[int]] = defaultdict(list)
    for (i, d), c in sorted(w.items()):
        if sol[c] > 0:
            taken[i].append(d)
    out: list[Bind] = []
    for (s, i), c in sorted(z.items()):
        for _ in range(int(sol[c])):
            gpus = tuple(taken[i][:shapes[s][2]])
            if len(gpus) < shapes[s][2] or not queue[s]:
                return None
            taken[i] = taken[i][shapes[s][2]:]
            out.append((queue[s].pop(0), i, gpus))
    for (s, i, d), c in sorted(y.items()):
        for _ in range(int(sol[c])):
            if not queue[s]:
                return None
            out.append((queue[s].pop(0), i, (d,)))
    for (s, i), c in sorted(x.items()):
        for _ in range(int(sol[c])):
            if not queue[s]:
                return None
            out.append((queue[s].pop(0), i, ()))
    out.sort()
    milli = sum(group[k].gpu_milli_total for k, _, _ in out)
    return PackResult(tuple(out), milli, int(sum(sol[c] for c in o.values())), optimal, status)
