"""Model inputs: the heterogeneous scheduling graph, built by the same numpy code in training and serving.

``build_graph(pods, state, candidates, context) -> HeteroGraph`` turns pending pods, the cluster and each
pod's candidate nodes (after the hard filter) into the arrays the learned policy reads (the ONNX contract
in docs/model.md):

- ``node_x`` (N, F_NODE): one row per node, a function of that node alone (its capacity, usage, GPU
  devices, bound pods, its fragmentation against the target workload and ``order_key``, a stable
  hash of its name that gives near-ties one fixed order), so serving caches rows and recomputes only
  the nodes whose usage changed (``FeatureContext`` does exactly that; rows: ``features_nodes``);
- ``pod_x`` (P, F_POD): one row per pending pod;
- ``nn_edge_index`` (2, E_nn): node -> node edges within a rack (+-2 neighbours) and a zone (+-1),
  plus a self loop per node, so the degree is at most 7 whatever the cluster size. Nodes without
  zone/rack labels (the openb trace) are grouped by GPU model, their hardware pool;
- ``pp_edge_index`` (2, E_pp): pod -> pod edges between pending pods of one service (or one label set
  with affinity terms), +-2 neighbours, plus self loops; read by the training-side critic only;
- ``cand_pod``, ``cand_node`` (E,): candidate pairs, pod-major in ``candidates`` order;
- ``cand_attr`` (E, F_EDGE): what placing that pod on that node would leave (fit tightness, cpu/mem/GPU
  left, the FGD fragmentation delta with the best GPU device);
- ``cand_device`` (E,): that best device for a GPU-share pod (-1 otherwise): the device the policy binds.

Bound pods are not graph nodes: the "bound-to" relation is summarised into node features (pod count,
GPU pods, device usage), which keeps the graph at N + P vertices however many pods run (a 5,000-node
cluster holds ~100,000 bound pods) and keeps node rows independent of each other.

Pure numpy: no torch. ``FeatureContext`` carries the target workload and memoised per-node results
(derived data only: outputs depend on the arguments alone). ``build_graph`` computes the pairs of all
pods at once (``pair_features_batch``; ``pair_features`` is one pod's slice of it). What the pair rows
read (placement fragmentation, the ``reward_gain`` column, the row scales) lives in
``agmarl_common.core.features.pairs``, the node rows in ``features_nodes``, the edges in ``features_edges`` (all
re-exported here); none of them imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState, Pod, choose_gpus
from agmarl_common.core.features.edges import POD_HALF, RACK_HALF, ZONE_HALF, node_edges, pod_edges  # noqa: F401
from agmarl_common.core.features.nodes import node_feature_rows, node_order_keys  # noqa: F401  (re-exported)
from agmarl_common.core.features.pairs import (  # noqa: F401  (pair inputs: re-exported, part of this module's API)
    CPU_SCALE, EDGE_FEATURES, F_EDGE, FRAG_SCALE, GPU_SCALE, MEM_SCALE, OBJECTIVES, ShapeMemo, check_objective,
    current_memos, gpu_left, objective_gains, objective_state, placement_frag, placement_frag_many, shape_jobs)
from agmarl_common.core.sim.fragmentation import TargetWorkload, pod_shape, target_workload

ROW_MEMOS = 64  # (pod shape, cpu) entries ``FeatureContext.pair_rows`` keeps (each (n, F_EDGE) float32); then the
# least scored makes room
USES_KEPT = 256  # (pod shape, cpu) entries whose use ``FeatureContext`` counts (a service meets new ones for ever)
WARM_SHAPES = 32  # (pod shape, cpu) entries ``FeatureContext.warm`` keeps current: the most scored (openb: 94 %)

NODE_FEATURES = (
    "cpu_free", "mem_free", "gpu_free", "gpu_whole_free", "pods_free", "cpu_util", "mem_util", "gpu_util",
    "has_gpu", "gpu_count", "gpu_partial", "gpu_max_free", "frag", "frag_ratio", "target_access", "empty",
    "schedulable", "gpu_pods",
) + tuple(f"dev_free_{j}" for j in range(MAX_GPUS)) + ("order_key",)
POD_FEATURES = ("cpu", "mem", "num_gpu", "gpu_milli", "gpu_total", "is_share", "cpu_only", "is_ls", "has_spec",
                "shape_prob", "log_cpu", "objective_composite")
F_NODE = len(NODE_FEATURES)  # 27
F_POD = len(POD_FEATURES)  # 12


@dataclass(frozen=True)
class HeteroGraph:
    node_x: np.ndarray  # (N, F_NODE) float32
    pod_x: np.ndarray  # (P, F_POD) float32
    nn_edge_index: np.ndarray  # (2, E_nn) int64 node -> node, self loops included
    pp_edge_index: np.ndarray  # (2, E_pp) int64 pod -> pod, self loops included
    cand_pod: np.ndarray  # (E,) int64
    cand_node: np.ndarray  # (E,) int64
    cand_attr: np.ndarray  # (E, F_EDGE) float32
    cand_device: np.ndarray  # (E,) int64 best device of a GPU-share pod, -1 otherwise

    @property
    def n_nodes(self) -> int:
        return int(self.node_x.shape[0])

    @property
    def n_pods(self) -> int:
        return int(self.pod_x.shape[0])

    @property
    def n_cand(self) -> int:
        return int(self.cand_pod.shape[0])


# ---------------------------------------------------------------------------------------------
# Context: target workload and memoised per-node data


@dataclass
class FeatureContext:
    """The target workload fragmentation is measured against, and caches tied to one ``nodes`` tuple.

    Caches are keyed by node usage, so a stale entry is never read: a row is recomputed when any of
    the node's usage arrays differ from the snapshot it was computed from. The snapshot holds the usage
    arrays of the last state seen (``ClusterState`` is immutable: ``bind``/``unbind`` make new arrays), and
    the same arrays again mean no change. Each row has a version, bumped when it changes; the
    fragmentation memo of each pod shape (a ``ShapeMemo``), and the one-pod path's pair rows of each (pod shape,
    cpu) (``pair_rows``; a row of the ``_row_ver`` / ``_row_x`` tables per entry), record the version their rows
    were computed at: tables, so that ``warm`` checks and writes the rows of many shapes in one operation.
    """

    target: TargetWorkload
    objective: str = "composite"  # OBJECTIVES: what the scheduler optimises (pod row and ``reward_gain``)
    scheme: str = "fixed"  # the composite reward's weighting scheme (reward.SCHEMES)
    _nodes: tuple = ()
    _access: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), bool))
    _access_class: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (n,) id of the access row
    _snap: tuple = ()
    _node_x: np.ndarray = field(default_factory=lambda: np.zeros((0, F_NODE), np.float32))
    _frag: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _edges: np.ndarray | None = None
    _version: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (n,) bumped when a row changes
    _terms: dict = field(default_factory=dict)  # per-node terms the pair features read, (n,) or (n, G) each
    _pairs: ShapeMemo = field(default_factory=lambda: ShapeMemo(0))  # the fragmentation memo, per pod shape
    _rows: dict = field(default_factory=dict)  # (pod shape, cpu) -> its row in _row_ver / _row_x
    _row_ver: np.ndarray = field(default_factory=lambda: np.zeros((ROW_MEMOS, 0), np.int64))  # (ROW_MEMOS, n)
    _row_x: np.ndarray = field(default_factory=lambda: np.zeros((ROW_MEMOS, 0, F_EDGE), np.float32))  # pair rows
    _uses: dict = field(default_factory=dict)  # (pod shape, cpu) -> [pods ``pair_rows`` scored, the last]; <= USES_KEPT
    _warmed: np.ndarray | None = None  # the row versions ``warm`` last brought its entries up to
    _shape_prob: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_objective(self.objective)

    @staticmethod
    def from_workload(pods: Sequence[Pod], objective: str = "composite", scheme: str = "fixed") -> "FeatureContext":
        return FeatureContext(target_workload(pods), objective, scheme)

    def _bind_nodes(self, state: ClusterState) -> None:
        if state.nodes is self._nodes and self._node_x.shape[0] == state.n_nodes:
            return
        n = state.n_nodes
        self._nodes = state.nodes
        self._access = self.target.accessible(state.gpu_model)
        self._access_class = np.unique(self._access, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
        self._snap = ()
        self._node_x = np.zeros((n, F_NODE), np.float32)
        self._frag = np.zeros(n)
        self._version = np.zeros(n, np.int64)
        z = np.zeros(n, np.int64)
        self._terms = {"cpu_cap": np.maximum(state.cpu_cap, 1), "mem_cap": np.maximum(state.mem_cap, 1),
                       "gpu_count": state.gpu_count.copy(), "gpu_cap": state.gpu_count * GPU_MILLI,
                       "cpu_free": z.copy(), "mem_free": z.copy(), "gpu_idle": z.copy(), "whole_free": z.copy(),
                       "empty": np.zeros(n, bool), "gpu_left": np.zeros((n, MAX_GPUS), np.int64)}
        self._edges = None
        self._pairs = ShapeMemo(n)
        self._rows = {}
        self._row_ver = np.full((ROW_MEMOS, n), -1, np.int64)
        self._row_x = np.zeros((ROW_MEMOS, n, F_EDGE), np.float32)  # pages touched as rows are filled
        self._uses = {}
        self._warmed = None

    def access(self, state: ClusterState) -> np.ndarray:
        """(n, K) bool: which target shapes each node's GPU model admits."""
        self._bind_nodes(state)
        return self._access

    def node_x(self, state: ClusterState) -> np.ndarray:
        """(n, F_NODE) float32 node features, rows recomputed only where usage changed (a copy)."""
        self._refresh(state)
        return self._node_x.copy()

    def node_frag(self, state: ClusterState) -> np.ndarray:
        """(n,) fragmentation amount (GPU milli) of every node against the target (a copy)."""
        self._refresh(state)
        return self._frag.copy()

    def _refresh(self, state: ClusterState) -> None:
        self._bind_nodes(state)
        cur = (state.cpu_used, state.mem_used, state.pods_used, state.gpu_used, state.schedulable)
        if len(self._snap) == len(cur) and all(a is b for a, b in zip(cur, self._snap)):
            return  # the same arrays: nothing changed
        if not self._snap:
            rows = np.arange(state.n_nodes)
        else:
            diff = np.zeros(state.n_nodes, dtype=bool)
            for a, b in zip(cur, self._snap):
                diff[changed_rows(a, b)] = True
            rows = np.flatnonzero(diff)
        if rows.size:
            x, frag = node_feature_rows(state, rows, self._access[rows], self.target)
            self._node_x[rows] = x
            self._frag[rows] = frag
            self._version[rows] += 1
            self._refresh_terms(state, rows)
        self._snap = cur  # references: states are immutable (bind/unbind return new arrays)

    def _refresh_terms(self, state: ClusterState, rows: np.ndarray) -> None:
        t = self._terms
        left = gpu_left(state, rows)
        t["gpu_left"][rows] = left
        t["gpu_idle"][rows] = left.sum(axis=1)
        t["whole_free"][rows] = (left >= GPU_MILLI).sum(axis=1)
        t["cpu_free"][rows] = state.cpu_cap[rows] - state.cpu_used[rows]
        t["mem_free"][rows] = state.mem_cap[rows] - state.mem_used[rows]
        t["empty"][rows] = state.pods_used[rows] == 0

    def pair_terms(self, state: ClusterState) -> dict[str, np.ndarray]:
        """Per-node terms of the pair features, current for ``state`` (read-only arrays, not copies)."""
        self._refresh(state)
        return self._terms

    def nn_edges(self, state: ClusterState) -> np.ndarray:
        self._bind_nodes(state)
        if self._edges is None:
            self._edges = node_edges(state)
        return self._edges

    def shape_prob(self, pod: Pod) -> float:
        """Probability of the pod's shape in the target workload (0 when it is not a typical shape)."""
        if not self._shape_prob:
            t = self.target
            for k in range(t.size):
                key = (int(t.cpu_milli[k]), int(t.gpu_milli[k]), int(t.num_gpu[k]), "|".join(t.gpu_spec[k]))
                self._shape_prob[key] = self._shape_prob.get(key, 0.0) + float(t.prob[k])
        return self._shape_prob.get(pod_shape(pod), 0.0)

    def frag_after(self, pod: Pod, state: ClusterState, idx: np.ndarray) -> tuple[np.ndarray, ...]:
        """(delta, after, device) for placing ``pod`` on nodes ``idx``: fragmentation change and amount
        after the placement (GPU milli) and the chosen device for a share (-1 otherwise). Memoised per
        pod shape and node usage; identical node states are computed once."""
        self._refresh(state)
        (_, delta, after, dev), = self._memos([(pod_shape(pod), idx)], state)
        return delta[idx].copy(), after[idx].copy(), dev[idx].copy()

    def device_on(self, pod: Pod, state: ClusterState, i: int) -> int:
        """The device ``frag_after(pod, state, [i])`` gives when node i changed since this context last saw
        it (-1: no device fits, or not a share), computed for that node alone: the other rows and the memos
        are not refreshed (a batch arbiter asks this after each grant; the next ``_refresh`` catches up)."""
        self._bind_nodes(state)
        (_, dev), = placement_frag_many([(pod_shape(pod), np.array([i], np.int64))], state, self._access,
                                        self._access_class, self.target)
        return int(dev[0])

    def frag_after_batch(self, pods: Sequence[Pod], state: ClusterState, idx: np.ndarray,
                         pod_of: np.ndarray) -> tuple[np.ndarray, ...]:
        """``frag_after`` for many pairs at once: pair e places ``pods[pod_of[e]]`` on node ``idx[e]``.
        The stale memo rows of every pod shape are recomputed together, in one pass."""
        self._refresh(state)
        if len(pods) == 1 and (idx.size < 2 or bool((idx[1:] > idx[:-1]).all())):
            # one pod on ascending distinct nodes (the live path): its one job is (shape, idx), its cells idx
            (memo,) = self._memos([(pod_shape(pods[0]), idx)], state)
            return memo[1][idx], memo[2][idx], memo[3][idx]
        jobs, flat = shape_jobs(pods, idx, pod_of, state.n_nodes)
        memos = self._memos(jobs, state)
        return tuple(np.concatenate([m[j] for m in memos])[flat] for j in (1, 2, 3))

    def pair_rows(self, pod: Pod, state: ClusterState, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``pair_features_batch`` of one pod on ascending distinct nodes ``idx`` (the live path), but for its
        ``mem_left`` and ``reward_gain`` columns (left to the caller): ((E, F_EDGE) float32, (E,) device). The
        other columns read only the pod's shape and cpu and the node's usage, so they are memoised per (pod
        shape, cpu) and node version, as the fragmentation memo is: only the rows of nodes changed since that
        shape was last placed are computed (``_pair_columns``, the same arithmetic), the rest are read."""
        self._refresh(state)
        shape = pod_shape(pod)
        (memo,) = self._memos([(shape, idx)], state)
        key = (shape, pod.cpu_milli)
        use = self._uses.get(key)
        if use is None:
            if len(self._uses) >= USES_KEPT:  # the least scored entry without memoised rows is forgotten
                drop = min((k for k in self._uses if k not in self._rows), key=lambda k: self._uses[k][0], default=None)
                if drop is not None:
                    del self._uses[drop]
            use = self._uses[key] = [0, pod]
        use[0] += 1
        use[1] = pod
        slot = self._rows.get(key)
        if slot is None:
            if len(self._rows) >= ROW_MEMOS:  # the least scored entry makes room (the first kept of equals)
                slot = self._rows.pop(min(self._rows, key=lambda k: self._uses[k][0]))
            else:
                slot = len(self._rows)
            self._rows[key] = slot
            self._row_ver[slot] = -1
        stale = idx[self._row_ver[slot, idx] != self._version[idx]]
        if stale.size:
            self._fill_rows([key], [pod], np.zeros(stale.size, np.int64), stale)
        return self._row_x[slot, idx], memo[3][idx]

    def warm(self, state: ClusterState, keys: int = WARM_SHAPES) -> list[tuple]:
        """Bring the fragmentation memo and the memoised pair rows of the ``keys`` (pod shape, cpu) entries
        ``pair_rows`` scored most often up to ``state``: work of a cluster change done ahead of the next pod (by
        the live loop between pods, after the policy's ``prepare``), whose ``pair_rows`` then computes no row when
        its entry is among them. Only the rows that changed since the last ``warm`` are looked at (all of them the
        first time): an entry's rows were current on its candidates when it was last scored, so an older stale row
        is one of a node that was no candidate then and has not changed since (``pair_rows`` still computes any
        stale row it reads). Nothing a decision reads changes: a row is a function of the pod shape and the
        node's usage alone, whatever batch computes it (``sim.fragmentation.expectation``, ``_pair_columns``
        element by element), so a row computed here is the row ``pair_rows`` would compute, bit for bit. Returns
        the entries warmed."""
        self._refresh(state)
        top = sorted(self._uses.items(), key=lambda kv: -kv[1][0])[:keys]  # stable: ties keep first-scored order
        top = [(key, use[1]) for key, use in top if key in self._rows]  # an entry dropped with a full memo: not here
        before, self._warmed = self._warmed, self._version.copy()
        idx = np.arange(state.n_nodes) if before is None else np.flatnonzero(self._version != before)
        if not top or idx.size == 0:
            return [key for key, _ in top]
        version = self._version[idx]
        # the fragmentation memos the rows read: every stale (shape, node) cell at once
        self._pairs.begin()
        shapes = [self._pairs.slot(shape) for shape in dict.fromkeys(key[0] for key, _ in top)]
        si, ri = np.nonzero(self._pairs.ver[np.ix_(shapes, idx)] != version)
        self._pairs.update(shapes, si, idx[ri], state, *self._memo_inputs())
        # then every stale (entry, node) pair row at once
        ei, ri = np.nonzero(self._row_ver[np.ix_([self._rows[key] for key, _ in top], idx)] != version)
        if ei.size:
            self._fill_rows([key for key, _ in top], [pod for _, pod in top], ei, idx[ri])
        return [key for key, _ in top]

    def _fill_rows(self, keys: list[tuple], pods: list[Pod], pod_of: np.ndarray, rows: np.ndarray) -> None:
        """Compute the memoised pair rows (entry ``keys[pod_of[e]]``, a (pod shape, cpu) entry of ``_rows``, node
        ``rows[e]``), with ``pods[j]`` a pod of entry j, all in one ``_pair_columns`` pass, from the fragmentation
        memo (current on those cells), and mark them current. The columns go in as float64 (bools as 0.0 / 1.0)
        and are cast to float32 on assignment."""
        memo = self._pairs
        cells = np.array([memo.slots[key[0]] for key in keys], np.int64)[pod_of]
        block = np.column_stack(_pair_columns(pods, pod_of, rows, self._terms, memo.delta[cells, rows],
                                              memo.after[cells, rows], memo.dev[cells, rows]))
        slots = np.array([self._rows[key] for key in keys], np.int64)[pod_of]
        self._row_x[slots, rows, :block.shape[1]] = block
        self._row_ver[slots, rows] = self._version[rows]

    def _memos(self, jobs: list[tuple[tuple, np.ndarray | None]], state: ClusterState) -> list[tuple[np.ndarray, ...]]:
        """``current_memos`` of ``jobs`` in this context's memo (after ``_refresh``)."""
        return current_memos(self._pairs, jobs, state, *self._memo_inputs())

    def _memo_inputs(self) -> tuple:
        """What the fragmentation memo's rows are computed from (after ``_refresh``): (row versions, node
        fragmentation, access rows, access classes, target, (free cpu, free milli per device))."""
        return (self._version, self._frag, self._access, self._access_class, self.target,
                (self._terms["cpu_free"], self._terms["gpu_left"]))


# ---------------------------------------------------------------------------------------------
# Pods and candidate pairs (the pair inputs: ``features_pairs``)


def changed_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Ascending indexes of the rows (first axis) where ``a`` and ``b`` (same shape) differ: found on the flat
    arrays (a reduction along a short second axis costs numpy more than the comparison itself)."""
    flat = np.flatnonzero(a != b)
    return np.unique(flat // (a.size // a.shape[0])) if a.ndim > 1 and a.shape[0] else flat


def pod_features(pods: Sequence[Pod], context: FeatureContext) -> np.ndarray:
    """(P, F_POD) float32."""
    composite = float(context.objective == "composite")
    rows = []
    for p in pods:
        milli = p.gpu_milli if p.num_gpu > 0 else 0
        rows.append([
            p.cpu_milli / CPU_SCALE, p.memory_mib / MEM_SCALE, p.num_gpu / MAX_GPUS, milli / GPU_MILLI,
            p.num_gpu * milli / GPU_SCALE, float(p.is_gpu_share), float(p.num_gpu == 0),
            float(p.qos in ("LS", "Guaranteed")), float(bool(p.gpu_spec)), context.shape_prob(p),
            np.log1p(p.cpu_milli / 1000.0) / 5.0, composite,
        ])
    return np.asarray(rows, dtype=np.float32).reshape(len(pods), F_POD)


def pod_feature_key(pod: Pod, objective: str = "composite") -> tuple:
    """What the model's inputs read of a pod (``pod_features``, ``pair_features``): pods with equal keys
    get equal pod rows and, on the same candidate nodes, equal pair rows, hence equal scores. Under the
    composite objective the ``reward_gain`` column also reads the pod's labels, service, QoS class and
    preferences (what ``scoring.rewardaware`` scores)."""
    key = (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli if pod.num_gpu > 0 else 0, tuple(pod.gpu_spec),
           pod.qos in ("LS", "Guaranteed"))
    if objective != "composite":
        return key
    # terms hold label selectors (dicts, unhashable): keyed by their repr (equal terms, equal repr; a
    # different dict order only makes two equal pods score separately)
    return key + (pod.qos, pod.namespace, pod.service, tuple(sorted(pod.labels.items())), pod.preferred_node_affinity,
                  pod.tolerations, repr((pod.preferred_pod_affinity, pod.preferred_pod_anti_affinity,
                                         pod.topology_spread)))


def identical_pods(pods: Sequence[Pod], candidates: Sequence[np.ndarray],
                   objective: str = "composite") -> tuple[list[int], np.ndarray]:
    """(the first pod of each group of pods with equal ``pod_feature_key`` and equal candidates, (P,) the
    position of each pod's group in that list): score the first ones, then ``scores[group[k]]`` is pod k's."""
    first: dict[tuple, int] = {}
    reps: list[int] = []
    group = np.zeros(len(pods), np.int64)
    for k, (p, c) in enumerate(zip(pods, candidates)):
        key = (pod_feature_key(p, objective), np.asarray(c, np.int64).tobytes())
        if key not in first:
            first[key] = len(reps)
            reps.append(k)
        group[k] = first[key]
    return reps, group


def pair_features(pod: Pod, state: ClusterState, cand: np.ndarray,
                  context: FeatureContext) -> tuple[np.ndarray, np.ndarray]:
    """((E, F_EDGE) float32 features, (E,) device) of placing ``pod`` on each node of ``cand``: its slice
    of ``pair_features_batch``."""
    return pair_features_batch([pod], state, [np.asarray(cand, dtype=np.int64)], context)


def pair_features_batch(pods: Sequence[Pod], state: ClusterState, candidates: Sequence[np.ndarray],
                        context: FeatureContext) -> tuple[np.ndarray, np.ndarray]:
    """((E, F_EDGE) float32 features, (E,) device) of placing every pod on each of its candidates,
    concatenated pod-major, computed over all pairs at once (per-node terms once per node, fragmentation
    memo updates once per pod shape). ``candidates[k]`` must be int64 node indexes in range."""
    if len(candidates) != len(pods):
        raise ValueError(f"pair_features_batch: {len(pods)} pods but {len(candidates)} candidate arrays")
    sizes = np.array([len(c) for c in candidates], np.int64)
    idx = np.concatenate(candidates).astype(np.int64, copy=False) if len(candidates) else np.zeros(0, np.int64)
    e = idx.size
    if e == 0:
        return np.zeros((0, F_EDGE), np.float32), np.zeros(0, np.int64)
    gains = objective_gains(pods, state, candidates, context.objective, context.scheme)
    if len(pods) == 1 and (e < 2 or bool((idx[1:] > idx[:-1]).all())):
        # one pod on ascending distinct nodes (the live path): the memoised rows, then its own two columns
        out, dev = context.pair_rows(pods[0], state, idx)
        t = context.pair_terms(state)
        out[:, MEM_LEFT] = (t["mem_free"][idx] - pods[0].memory_mib) / t["mem_cap"][idx]
        out[:, -1] = gains
        return out, dev
    pod_of = np.repeat(np.arange(len(pods)), sizes)
    delta, after, dev = context.frag_after_batch(pods, state, idx, pod_of)
    out = np.empty((e, F_EDGE), np.float32)  # float64 values rounded once, as .astype(np.float32) does
    for j, col in enumerate(_pair_columns(pods, pod_of, idx, context.pair_terms(state), delta, after, dev)):
        out[:, j] = col
    out[:, -1] = gains
    return out, dev


MEM_LEFT = EDGE_FEATURES.index("mem_left")  # the one pair column that reads the pod's memory


def _pair_columns(pods: Sequence[Pod], pod_of: np.ndarray, idx: np.ndarray, t: dict[str, np.ndarray],
                  delta: np.ndarray, after: np.ndarray, dev: np.ndarray) -> list[np.ndarray]:
    """The pair columns but ``reward_gain`` (float64, ``EDGE_FEATURES`` order) of pairs e = (``pods[pod_of[e]]``,
    node ``idx[e]``): ``t``, the context's per-node terms (``pair_terms``); ``delta``, ``after``, ``dev``,
    the pairs' fragmentation results (``frag_after_batch``)."""
    e = idx.size

    def per_pair(a: np.ndarray) -> np.ndarray:
        """A per-pod (P,) integer array per pair: (E,), or its numpy scalar for one pod (the same values)."""
        return a[0] if len(pods) == 1 else a[pod_of]

    # per pod (P,): the request
    milli_p = np.array([p.gpu_milli if p.num_gpu > 0 else 0 for p in pods])
    num_p = np.array([p.num_gpu for p in pods])
    req_p = num_p * milli_p
    milli, gpu_req = per_pair(milli_p), per_pair(req_p)
    pcpu = per_pair(np.array([p.cpu_milli for p in pods]))
    # per node: usage terms kept current by the context (exact integers)
    cpu_free = t["cpu_free"][idx]
    cpu_after = cpu_free - pcpu
    mem_after = t["mem_free"][idx] - per_pair(np.array([p.memory_mib for p in pods]))
    gcap = t["gpu_cap"][idx]
    gpu_after = t["gpu_idle"][idx] - gpu_req
    dev_left = np.where(dev >= 0, t["gpu_left"][idx, np.maximum(dev, 0)] - milli, 0) / GPU_MILLI
    whole_after = t["whole_free"][idx] - per_pair(np.where(milli_p >= GPU_MILLI, num_p, 0))
    has_gpu = gcap > 0
    frag = delta / FRAG_SCALE
    return [
        cpu_after / t["cpu_cap"][idx],
        mem_after / t["mem_cap"][idx],
        gpu_after / GPU_SCALE,
        np.divide(gpu_after, gcap, out=np.zeros(e), where=has_gpu),
        np.clip(frag, -8.0, 8.0),
        1.0 / (1.0 + np.exp(frag)),
        after / GPU_SCALE,
        dev_left,
        np.where(t["gpu_count"][idx] > 0, whole_after, 0) / MAX_GPUS,
        np.divide(pcpu, cpu_free, out=np.zeros(e), where=cpu_free > 0),
        0.5 * cpu_after / CPU_SCALE + 0.5 * gpu_after / GPU_SCALE,
        t["empty"][idx],  # bools: 0.0 / 1.0 exactly
        has_gpu & (gpu_after <= 0) & (gpu_req > 0),
        np.divide(gpu_req, gcap, out=np.zeros(e), where=has_gpu),
    ]


# ---------------------------------------------------------------------------------------------
# The graph


def build_graph(pods: Sequence[Pod], state: ClusterState, candidates: Sequence[np.ndarray],
                context: FeatureContext) -> HeteroGraph:
    """The graph of pending ``pods`` on ``state``; ``candidates[k]`` are pod k's feasible node indexes."""
    if len(candidates) != len(pods):
        raise ValueError(f"build_graph: {len(pods)} pods but {len(candidates)} candidate arrays")
    node_x = context.node_x(state)
    cands = [np.asarray(c, dtype=np.int64).reshape(-1) for c in candidates]
    sizes = np.array([c.size for c in cands], np.int64)
    cand_node = np.concatenate(cands) if cands else np.zeros(0, np.int64)
    bad = (cand_node < 0) | (cand_node >= state.n_nodes)
    if bad.any():
        k = int(np.searchsorted(np.cumsum(sizes), int(np.argmax(bad)), side="right"))
        raise ValueError(f"build_graph: candidate node index out of range for pod {pods[k].key}")
    attr, dev = pair_features_batch(pods, state, cands, context)
    return HeteroGraph(
        node_x=node_x,
        pod_x=pod_features(pods, context),
        nn_edge_index=context.nn_edges(state),
        pp_edge_index=pod_edges(pods),
        cand_pod=np.repeat(np.arange(len(pods), dtype=np.int64), sizes),
        cand_node=cand_node,
        cand_attr=attr,
        cand_device=dev,
    )


def device_for(pod: Pod, state: ClusterState, node_index: int, context: FeatureContext) -> tuple[int, ...] | None:
    """GPU devices the learned policy binds ``pod`` to on ``node_index``: the least-fragmenting device for
    a share (``cand_device``), the lowest-index free devices for whole GPUs, () without GPUs."""
    if not pod.is_gpu_share:  # the node's own devices only (not every node's: this runs once a decision)
        return choose_gpus(pod, gpu_left(state, np.array([node_index]))[0]) if pod.num_gpu else ()
    _, _, dev = context.frag_after(pod, state, np.array([node_index], np.int64))
    return (int(dev[0]),) if dev[0] >= 0 else None
