"""The learned policy served by ONNX Runtime: numpy features, ``encoder.onnx`` + ``actor.onnx``, no torch.

``OnnxModelPolicy`` implements the one ``Policy`` protocol. For a pending pod it builds the graph with
``features.build_graph`` (the trainer's code), runs the encoder over the cluster's node rows and the actor
over the pod's candidate pairs (the ONNX contract in docs/model.md), and returns the logits as scores.

Serving cost is kept down by caching per cluster (one ``nodes`` tuple):
- node rows: ``FeatureContext`` recomputes only the rows whose usage changed, pair features (the
  fragmentation a placement leaves, and one pod's pair rows but its memory and ``reward_gain`` columns) are
  memoised per pod shape and node usage;
- node embeddings: ``EncoderCache`` re-runs the encoder only on the L-hop neighbourhood of the rows that
  changed (the same numbers as a full pass up to float rounding), a full pass when many rows changed;
- the actor: ``actor_head.DecomposedActor`` (the same function, its first layer split per input block)
  keeps per-node tables updated on the rows whose embedding changed, so per pod only the pairs' part runs;
  ONNX Runtime's ``actor.onnx`` itself for a graph it does not recognise (e.g. a quantised one) and when
  built with ``decompose=False``, fed only the candidate nodes' rows.
Sessions run with one intra-op and one inter-op thread (the contract: ScatterND with duplicate indexes is
wrong with more threads in ORT 1.32). Calls are serialised by a lock (the caches are shared state).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnxruntime as ort

from agmarl_common.serving import modelstore
from agmarl_common.serving.actor_head import DecomposedActor
from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.features import (EDGE_FEATURES, NODE_FEATURES, POD_FEATURES, FeatureContext, HeteroGraph, build_graph,
                                    changed_rows, check_objective, device_for, identical_pods, objective_state)
from agmarl_common.core.policies.base import PolicyBase
from agmarl_common.core.policies.registry import MODEL_PREFIX  # noqa: F401  (re-exported)
from agmarl_common.core.reward import SCHEMES
from agmarl_common.core.sim.fragmentation import TargetWorkload, pod_shape

EXPLAIN_TOP = 2  # candidates the feature contributions contrast: the pick and the runner-up
TARGET_GROWTH = (16, 64, 256, 1024)  # seen-pod counts at which an implicit target workload is rebuilt
RECENT_PODS = 4096
ALIASES = 8  # equal node tuples remembered by identity (views rebuild the tuple; the nodes stay the same)


def make_session(model: bytes | str | Path) -> ort.InferenceSession:
    """An ONNX Runtime CPU session with one intra-op and one inter-op thread."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    src = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])


def input_columns(manifest: dict, key: str, names: Sequence[str]) -> np.ndarray | None:
    """Which of this release's feature columns ``names`` a model reads, in its order (its manifest's
    ``contract[key]``): None when it reads them all as they are; a model trained before a feature was
    added reads the columns it knows. A name this release does not compute is refused (ValueError)."""
    wanted = list((manifest.get("contract") or {}).get(key) or names)
    if wanted == list(names):
        return None
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ValueError(f"model {manifest.get('version', '?')} reads {key} {unknown}, which this release does "
                         f"not compute (known: {', '.join(names)})")
    return np.array([list(names).index(w) for w in wanted], np.int64)


def top_order(values: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(-values, kind="stable")[:k]`` without sorting everything: the entries at least as large
    as the k-th largest (ties included), sorted stably, then cut."""
    if values.size <= k:
        return np.argsort(-values, kind="stable")
    kth = np.partition(values, values.size - k)[values.size - k]
    sel = np.flatnonzero(values >= kth)
    return sel[np.argsort(-values[sel], kind="stable")[:k]]


def _csr(key: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr (n+1,), edge ids sorted by ``key``): the edges of each key value, CSR style."""
    order = np.argsort(key, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(key, minlength=n), out=indptr[1:])
    return indptr, order


def _gather(rows: np.ndarray, indptr: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Edge ids of every row in ``rows`` (concatenated)."""
    starts, ends = indptr[rows], indptr[rows + 1]
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offs = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(total)
    return ids[offs]


class EncoderCache:
    """``encoder.onnx`` over successive node rows of one graph, recomputing only what changed.

    With L GAT layers a node's embedding depends on its L-hop in-neighbourhood only. When rows C change,
    the embeddings that can change are those of A = L-hop out-neighbourhood of C; the encoder runs on
    the subgraph induced by A and its L-hop in-neighbourhood (which holds every edge A's embeddings read)
    and rows A are replaced. When that subgraph exceeds ``max_share`` of the nodes, a full pass.
    ``version`` counts the changes of ``emb``; ``dirty`` holds the rows the last one changed (None after a
    full pass: any row).
    """

    def __init__(self, session: ort.InferenceSession, layers: int, max_share: float = 0.25):
        self.session, self.layers, self.max_share = session, layers, max_share
        self.edges: np.ndarray | None = None
        self.node_x: np.ndarray | None = None
        self.emb: np.ndarray | None = None
        self.full_passes = self.partial_passes = 0
        self.version = 0
        self.dirty: np.ndarray | None = None

    def _set_edges(self, edges: np.ndarray, n: int) -> None:
        self.edges = edges
        self._out = _csr(edges[0], n)
        self._in = _csr(edges[1], n)

    def _hops(self, rows: np.ndarray, csr: tuple[np.ndarray, np.ndarray], end: np.ndarray) -> np.ndarray:
        """Sorted rows within ``layers`` hops of ``rows`` along ``csr`` (``rows`` included)."""
        seen = np.zeros(csr[0].size - 1, bool)
        seen[rows] = True
        frontier = rows
        for _ in range(self.layers):
            nxt = end[_gather(frontier, *csr)]
            frontier = nxt[~seen[nxt]]
            seen[frontier] = True
        return np.flatnonzero(seen)

    def _full(self, node_x: np.ndarray) -> np.ndarray:
        self.full_passes += 1
        self.version, self.dirty = self.version + 1, None
        self.node_x = node_x.copy()
        self.emb = self.session.run(None, {"node_x": node_x, "nn_edge_index": self.edges})[0]
        return self.emb

    def __call__(self, node_x: np.ndarray, edges: np.ndarray) -> np.ndarray:
        n = node_x.shape[0]
        if self.edges is None or (self.edges is not edges and not np.array_equal(self.edges, edges)) \
                or self.node_x is None or self.node_x.shape != node_x.shape:
            self._set_edges(edges, n)
            return self._full(node_x)
        if self.node_x.tobytes() == node_x.tobytes():  # one memcmp (the usual case: ``prepare`` ran first)
            return self.emb
        changed = changed_rows(self.node_x, node_x)
        if changed.size == 0:  # equal values in other bytes (0.0 and -0.0)
            return self.emb
        affected = self._hops(changed, self._out, self.edges[1])  # rows whose embedding may change
        needed = self._hops(affected, self._in, self.edges[0])  # and every row they read
        if needed.size > self.max_share * n:
            return self._full(node_x)
        self.partial_passes += 1
        self.version, self.dirty = self.version + 1, affected
        mask = np.zeros(n, bool)
        mask[needed] = True
        eids = _gather(needed, *self._in)  # edges into needed rows ...
        eids = eids[mask[self.edges[0, eids]]]  # ... from needed rows: the induced subgraph
        local = np.full(n, -1, np.int64)
        local[needed] = np.arange(needed.size)
        sub = self.session.run(None, {"node_x": node_x[needed], "nn_edge_index": local[self.edges[:, eids]]})[0]
        self.emb = self.emb.copy()
        self.emb[affected] = sub[local[affected]]
        self.node_x = node_x.copy()
        return self.emb


class OnnxModelPolicy(PolicyBase):
    """The learned policy behind the ``Policy`` protocol; scores are the actor's logits (higher is better).

    The FGD target workload features are measured against comes from ``observe_workload(pods)``; without
    it, from the pods the policy has seen (bound pods of the first state and every pod scored), rebuilt as
    that sample grows (``TARGET_GROWTH``). ``objective`` (``features.OBJECTIVES``; ``set_objective``) is
    what the model is asked to optimise: the composite reward (default) or GPU allocation (the inflation
    protocol); ``scheme`` (``reward.SCHEMES``) weights the composite reward's ``reward_gain`` input. The
    model is fed the feature columns its manifest names (``input_columns``). ``decompose``: score pairs
    with ``DecomposedActor`` when the actor graph allows it (else, and with False, ``actor.onnx`` as is)."""

    def __init__(self, artifact: modelstore.ModelArtifact, max_share: float = 0.25, objective: str = "composite",
                 scheme: str = "fixed", decompose: bool = True):
        check_objective(objective)
        if scheme not in SCHEMES:
            raise ValueError(f"unknown reward scheme {scheme!r}; known: {', '.join(SCHEMES)}")
        self.objective, self.scheme = objective, scheme
        self.artifact = artifact
        self.version = artifact.version
        self.name = f"{MODEL_PREFIX}{artifact.version}"
        self.manifest = artifact.manifest
        self.encoder = make_session(artifact.files[modelstore.ENCODER_FILE])
        self.actor = make_session(artifact.files[modelstore.ACTOR_FILE])
        self.head = DecomposedActor.from_onnx(artifact.files[modelstore.ACTOR_FILE], self.actor) if decompose else None
        self.max_share = max_share
        self._lock = threading.RLock()
        self._observed = False
        self._recent: deque[Pod] = deque(maxlen=RECENT_PODS)
        self._seen = 0
        self._context: FeatureContext | None = None
        self._nodes: tuple = ()
        self._node_key: tuple = ()
        self._ref: ClusterState | None = None
        self._aliases: dict[int, tuple] = {}  # id -> a nodes tuple found equal to ``_nodes`` (kept alive here)
        self._cache = EncoderCache(self.encoder, artifact.layers, max_share)
        self._devices: tuple = (None, None, {})  # (context, state, pod shape -> (n,) device) of the last batch
        specs = {"node": NODE_FEATURES, "pod": POD_FEATURES, "edge": EDGE_FEATURES}
        self._cols = {k: input_columns(self.manifest, f"{k}_features", names) for k, names in specs.items()}
        self._names = {k: list(names) if self._cols[k] is None else [names[j] for j in self._cols[k]]
                       for k, names in specs.items()}
        # the inputs an explanation's occlusion names: the pair's edge features, then the node's
        self._occluded = [f"edge.{f}" for f in self._names["edge"]] + [f"node.{f}" for f in self._names["node"]]

    @staticmethod
    def from_dir(path: str | Path, trust: modelstore.ModelTrust | None = None) -> "OnnxModelPolicy":
        """The model of a signed folder (``trust``: ``modelstore.trust_from_environment()`` when None)."""
        return OnnxModelPolicy(modelstore.load_dir(path, trust=trust or modelstore.trust_from_environment()))

    # --- context ---------------------------------------------------------------------------------

    def observe_workload(self, pods: Sequence[Pod]) -> None:
        with self._lock:
            self._observed = True
            self._new_context(FeatureContext.from_workload(pods, self.objective, self.scheme))

    def target_workload(self) -> TargetWorkload | None:
        """The target workload its features measure fragmentation against (observed or implicit); None before
        the first pod."""
        with self._lock:
            return self._context.target if self._context is not None else None

    def set_objective(self, objective: str) -> None:
        """Optimise ``objective`` from now on (``features.OBJECTIVES``)."""
        check_objective(objective)
        with self._lock:
            if objective != self.objective:
                self.objective = objective
                if self._context is not None:
                    self._new_context(FeatureContext(self._context.target, objective, self.scheme))

    def _new_context(self, context: FeatureContext) -> None:
        self._context = context
        self._nodes, self._node_key = (), ()
        self._aliases = {}
        self._cache = EncoderCache(self.encoder, self.artifact.layers, self.max_share)
        if self.head is not None:
            self.head.nodes = self.head.table()

    def _note(self, pods: Sequence[Pod], state: ClusterState) -> None:
        """Grow the implicit target workload (when none was observed)."""
        if self._observed:
            return
        if self._context is None:
            self._recent.extend(p for ps in state.bound for p in ps)
        self._recent.extend(pods)
        before, self._seen = self._seen, self._seen + len(pods)
        if self._context is None or any(before < g <= self._seen for g in TARGET_GROWTH) \
                or self._seen // TARGET_GROWTH[-1] > before // TARGET_GROWTH[-1]:
            self._new_context(FeatureContext.from_workload(list(self._recent), self.objective, self.scheme))

    @staticmethod
    def _key(state: ClusterState) -> tuple:
        return tuple((nd.name, nd.zone, nd.rack, nd.gpu_model) for nd in state.nodes)

    def _canonical(self, state: ClusterState) -> ClusterState:
        """``state`` on the cached ``nodes`` tuple when it describes the same nodes (the caches are keyed
        by that tuple's identity); another cluster resets the caches."""
        if state.nodes is self._nodes:
            return state
        if self._aliases.get(id(state.nodes)) is state.nodes:  # an equal tuple already compared: no 2nd walk
            return replace(state, nodes=self._nodes)
        key = self._key(state)
        ref = self._ref
        same = ref is not None and key == self._node_key and all(
            np.array_equal(getattr(state, a), getattr(ref, a)) for a in ("cpu_cap", "mem_cap", "pods_cap", "gpu_count"))
        if not same:
            if self._nodes:
                self._new_context(FeatureContext(self._context.target, self.objective, self.scheme))
            self._nodes, self._node_key, self._ref, self._aliases = state.nodes, key, state, {}
            return state
        if len(self._aliases) >= ALIASES:
            self._aliases.clear()
        self._aliases[id(state.nodes)] = state.nodes
        return replace(state, nodes=self._nodes)

    # --- running the model -----------------------------------------------------------------------

    def graph(self, pods: Sequence[Pod], state: ClusterState, candidates: Sequence[np.ndarray]) -> HeteroGraph:
        """The model's input graph (``features.build_graph`` with this policy's context)."""
        with self._lock:
            self._note(pods, state)
            state = self._canonical(state)
            return self._inputs(build_graph(pods, state, [np.asarray(c, np.int64) for c in candidates], self._context))

    def _inputs(self, g: HeteroGraph) -> HeteroGraph:
        """``g`` with the feature columns this model reads (the same graph when it reads them all)."""
        node, pod, edge = self._cols["node"], self._cols["pod"], self._cols["edge"]
        if node is None and pod is None and edge is None:
            return g
        return replace(g, node_x=g.node_x if node is None else np.ascontiguousarray(g.node_x[:, node]),
                       pod_x=g.pod_x if pod is None else np.ascontiguousarray(g.pod_x[:, pod]),
                       cand_attr=g.cand_attr if edge is None else np.ascontiguousarray(g.cand_attr[:, edge]))

    def node_embeddings(self, g: HeteroGraph) -> np.ndarray:
        with self._lock:
            return self._cache(g.node_x, g.nn_edge_index)

    def run_actor(self, node_emb: np.ndarray, g: HeteroGraph) -> tuple[np.ndarray, np.ndarray]:
        """(logits (E,), attention (E,)), feeding only the candidate nodes' rows when they are few."""
        node_x, cand_node = g.node_x, g.cand_node
        if g.n_cand and g.n_cand < g.n_nodes // 2:
            uniq, cand_node = np.unique(g.cand_node, return_inverse=True)
            node_emb, node_x = node_emb[uniq], node_x[uniq]
            cand_node = cand_node.astype(np.int64).reshape(-1)
        logits, attention = self.actor.run(None, {
            "node_emb": node_emb, "node_x": node_x, "pod_x": g.pod_x, "cand_pod": g.cand_pod,
            "cand_node": cand_node, "cand_attr": g.cand_attr})
        return logits, attention

    def forward(self, g: HeteroGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(node_emb, logits, attention) of a graph, as ``export.onnx_scores`` computes them (to float32
        rounding with the decomposed actor)."""
        with self._lock:
            cache = self._cache
            emb = cache(g.node_x, g.nn_edge_index)
            if self.head is None:
                logits, attention = self.run_actor(emb, g)
            else:
                tables = self.head.nodes.update(emb, g.node_x, (id(cache), cache.version), cache.dirty)
                logits, attention = self.head.run(tables, g.pod_x, g.cand_pod, g.cand_node, g.cand_attr)
            return emb, logits, attention

    def prepare(self, state: ClusterState) -> None:
        """Bring the per-node caches up to ``state`` ahead of the next pod: node features, node embeddings
        and the actor's node tables (what a pod's ``score`` would otherwise recompute first). Nothing else
        changes: the next ``score`` on this state gives the same scores, only sooner. A no-op before the
        policy has a feature context (the first pod or ``observe_workload`` makes one)."""
        with self._lock:
            if self._context is None:
                return
            state = self._canonical(state)
            node_x = self._context.node_x(state)
            cols = self._cols["node"]
            node_x = node_x if cols is None else np.ascontiguousarray(node_x[:, cols])
            cache = self._cache
            emb = cache(node_x, self._context.nn_edges(state))
            if self.head is not None:
                self.head.nodes.update(emb, node_x, (id(cache), cache.version), cache.dirty)
            objective_state(state, self._context.objective)  # the reward_gain column's per-state terms

    def warm(self, state: ClusterState) -> None:
        """After ``prepare``, when nothing waits: the pair rows (fragmentation included) of the pod shapes scored
        most often, brought up to ``state`` (``FeatureContext.warm``), so that the next pod of one of them computes
        none. Work ahead of need (rows of shapes that may not come next), so the loop skips it when busy; the
        scores are the same with or without it."""
        with self._lock:
            if self._context is not None:
                self._context.warm(self._canonical(state))

    # --- the Policy protocol ---------------------------------------------------------------------

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        if len(candidates) == 0:
            return np.zeros(0)
        with self._lock:
            g = self.graph([pod], state, [candidates])
            emb, logits, attention = self.forward(g)
            # the decision that follows may ask why (``explain``): it reads this pass instead of running it again
            self._last = (pod, state, np.asarray(candidates, np.int64).tobytes(), g, emb, logits, attention)
            return logits.astype(np.float64)

    def score_batch(self, pods: Sequence[Pod], state: ClusterState,
                    candidates_list: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Scores of every pod against the same ``state`` (one graph, one encoder and one actor pass).
        Pods with the same model inputs (``features.identical_pods``: equal feature key and candidates,
        e.g. replicas of one workload) are scored once and get copies of the same scores; every pod still
        counts for the implicit target workload."""
        if len(pods) != len(candidates_list):
            raise ValueError(f"score_batch: {len(pods)} pods but {len(candidates_list)} candidate arrays")
        if not pods:
            return []
        with self._lock:
            self._note(pods, state)
            reps, group = identical_pods(pods, candidates_list, self._context.objective)
            canonical = self._canonical(state)
            g = self._inputs(build_graph([pods[k] for k in reps], canonical,
                                         [np.asarray(candidates_list[k], np.int64) for k in reps], self._context))
            self._remember_devices([pods[k] for k in reps], canonical, g)
            logits = self.forward(g)[1].astype(np.float64)
        scores = np.split(logits, np.cumsum([len(candidates_list[k]) for k in reps])[:-1])
        return [scores[j].copy() for j in group]

    def choose_gpus(self, pod: Pod, state: ClusterState, node_index: int) -> tuple[int, ...] | None:
        with self._lock:
            if self._context is None:
                self._note([pod], state)
            state = self._canonical(state)
            known = self._batch_device(pod, state, node_index) if pod.is_gpu_share else -2
            if known == -2:
                return device_for(pod, state, node_index, self._context)
            return (known,) if known >= 0 else None

    def _remember_devices(self, pods: Sequence[Pod], state: ClusterState, g: HeteroGraph) -> None:
        """Keep the GPU share devices of the last ``score_batch`` graph (``cand_device``, per pod shape and
        node): ``device_for`` gives the same device while the node's usage and the context are unchanged
        (``_batch_device``)."""
        by_shape: dict[tuple, np.ndarray] = {}
        bounds = np.cumsum(np.bincount(g.cand_pod, minlength=len(pods)))
        for k, p in enumerate(pods):
            if p.is_gpu_share:
                row = by_shape.setdefault(pod_shape(p), np.full(state.n_nodes, -2, np.int64))
                lo = bounds[k - 1] if k else 0
                row[g.cand_node[lo:bounds[k]]] = g.cand_device[lo:bounds[k]]
        self._devices = (self._context, state, by_shape)

    def _batch_device(self, pod: Pod, state: ClusterState, i: int) -> int:
        """``device_for``'s device (-1: none fits) for a share pod on node i of a state that follows the last
        ``score_batch``: its graph's device while node i is as it was then, else computed for node i alone
        (``FeatureContext.device_on``, what ``device_for`` recomputes for a changed node); -2 when the last
        batch does not apply (another context or cluster, a pod shape or node it did not score)."""
        context, ref, by_shape = self._devices
        fits = ref is not None and context is self._context and ref.nodes is state.nodes
        row = by_shape.get(pod_shape(pod)) if fits else None
        if row is None or row[i] == -2:
            return -2
        if state is not ref and (state.cpu_used[i] != ref.cpu_used[i] or state.mem_used[i] != ref.mem_used[i]
                                 or state.pods_used[i] != ref.pods_used[i]
                                 or state.schedulable[i] != ref.schedulable[i]
                                 or not np.array_equal(state.gpu_used[i], ref.gpu_used[i])):
            return self._context.device_on(pod, state, i)
        return int(row[i])

    # --- explanations ----------------------------------------------------------------------------

    def explain(self, pod: Pod, state: ClusterState, candidates: np.ndarray, top: int = 5) -> dict[str, Any]:
        """Why the model prefers its pick: the candidates with the most attention (with their logits) and,
        for the best candidate, each feature's contribution to its margin over the runner-up: the drop of
        the pick's logit when that feature (edge feature of the pair, or node feature as the actor reads it)
        is set to its mean over the pick and the runner-up (``EXPLAIN_TOP``), the actor run on those two
        candidates (occlusion; node embeddings are left as they are). One actor call of
        ``EXPLAIN_TOP * (1 + features)`` pairs, whatever the number of candidates."""
        cand = np.asarray(candidates, np.int64)
        if cand.size == 0:
            return {"policy": self.name, "model_version": self.version, "candidates": 0}
        with self._lock:
            last = getattr(self, "_last", None)
            if last is not None and last[0] is pod and last[1] is state and last[2] == cand.tobytes():
                g, emb, logits, attention = last[3:]  # the pass ``score`` just ran for this very decision
            else:
                g = self.graph([pod], state, [cand])
                emb, logits, attention = self.forward(g)
            order = top_order(attention, top)
            best = int(np.argmax(logits))
            contributions = self._occlusion(emb, g, logits)
        ranked = sorted(contributions.items(), key=lambda kv: -abs(kv[1]))[:top]
        nodes = state.nodes
        return {
            "policy": self.name, "model_version": self.version, "candidates": int(cand.size),
            "chosen": nodes[int(cand[best])].name, "chosen_logit": round(float(logits[best]), 4),
            "attention": [{"node": nodes[int(cand[k])].name, "attention": round(float(attention[k]), 4),
                           "logit": round(float(logits[k]), 4)} for k in order],
            "feature_contributions": [{"feature": f, "contribution": round(v, 4)} for f, v in ranked],
        }

    def _occlusion(self, emb: np.ndarray, g: HeteroGraph, logits: np.ndarray) -> dict[str, float]:
        """{feature: the best candidate's logit with its inputs minus its logit with that feature set to
        the mean over the ``EXPLAIN_TOP`` best candidates}. A feature equal on all of them is left as it
        is by that mean: its contribution is exactly 0 and is not run. The others are one copy of those
        candidates each, each copy its own pod, in one actor call."""
        keep = top_order(logits, EXPLAIN_TOP)  # best first
        nodes = g.cand_node[keep]
        k = keep.size
        names = self._occluded
        fe = len(self._names["edge"])
        base = np.concatenate([g.cand_attr[keep], g.node_x[nodes]], axis=1)  # (k, fe + fn): the pairs' inputs
        varies = np.flatnonzero((base != base[0]).any(axis=0))  # features an occlusion changes
        out = dict.fromkeys(names, 0.0)
        if varies.size == 0:
            return out
        copies = 1 + varies.size  # copy 0: as scored; copy 1 + c: feature varies[c] set to its mean
        x = base[None].repeat(copies, axis=0)  # (copies, k, fe + fn)
        x[1 + np.arange(varies.size), :, varies] = base[:, varies].mean(axis=0)[:, None]
        x = x.reshape(copies * k, base.shape[1])
        logit, _ = self.actor.run(None, {
            "node_emb": emb[nodes][None].repeat(copies, axis=0).reshape(copies * k, -1),
            "node_x": np.ascontiguousarray(x[:, fe:]), "pod_x": g.pod_x.repeat(copies, axis=0),
            "cand_pod": np.arange(copies, dtype=np.int64).repeat(k),
            "cand_node": np.arange(copies * k, dtype=np.int64), "cand_attr": np.ascontiguousarray(x[:, :fe])})
        logit = logit.reshape(copies, k)[:, 0]
        out.update(zip((names[j] for j in varies), (logit[0] - logit[1:]).astype(np.float64).tolist()))
        return out


def resolve_model_policy(ref: str, seed: int = 0) -> OnnxModelPolicy:
    """``model:<ref>`` for the policy registry: ``default``, a model folder or a version on disk
    (``modelstore.load_local``), signed by a key trusted in this process's environment and, for a folder,
    inside an allowed directory (``modelstore.trust_from_environment``); KeyError when there is none,
    ModelIntegrityError when it is unsigned, untrusted, tampered with or not allowed."""
    return OnnxModelPolicy(modelstore.load_local(ref, trust=modelstore.trust_from_environment()))
