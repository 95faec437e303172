"""Evaluation with the paper's harness: ``sim.inflation.run_inflation`` on the full openb cluster.

The learned policy runs through the one ``Policy`` interface (``rollout.LearnedPolicy``), scored by the
exported ONNX files (what is shipped) or by the torch networks; the baselines are the FGD paper's FGD and
BestFit. Metric: GPU allocation (% of capacity) when 100 % of the GPU capacity has arrived
(``InflationResult.allocation_curve()[100]``), per seed and averaged. Seeds run in worker processes.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from agmarl_common.core.features import HeteroGraph
from agmarl_common.core.policies.fgd import FGD_PAPER_POLICIES
from agmarl_common.core.sim.inflation import run_inflation
from agmarl_trainer.imitation import openb_nodes, openb_pods
from agmarl_trainer.procs import pool_worker

_MODEL_DIR: str | None = None


class IncrementalEncoder:
    """``encoder.onnx`` over a stream of states of one cluster, recomputing only what changed.

    With L GAT layers a node's embedding depends on its L-hop in-neighbourhood only. When a few node rows
    change, the rows whose embedding can change are the L-hop out-neighbourhood of the changed rows; the
    encoder runs on the subgraph induced by those rows and their L-hop in-neighbourhood (which holds every
    edge they read), and only their rows are replaced. Same numbers as a full pass up to float rounding.
    """

    def __init__(self, session, layers: int, max_share: float = 0.25):
        self.session, self.layers, self.max_share = session, layers, max_share
        self.edges: np.ndarray | None = None
        self.node_x: np.ndarray | None = None
        self.emb: np.ndarray | None = None

    def _hops(self, rows: np.ndarray, n: int, along: int) -> np.ndarray:
        mask = np.zeros(n, bool)
        mask[rows] = True
        src, dst = self.edges[0], self.edges[1]
        for _ in range(self.layers):
            frm, to = (src, dst) if along == 0 else (dst, src)
            mask[to[mask[frm]]] = True
        return mask

    def __call__(self, node_x: np.ndarray, edges: np.ndarray) -> np.ndarray:
        n = node_x.shape[0]
        same = self.edges is not None and (self.edges is edges or np.array_equal(self.edges, edges))
        if not same or self.node_x.shape != node_x.shape:
            self.edges, self.node_x = edges, node_x.copy()
            self.emb = self.session.run(None, {"node_x": node_x, "nn_edge_index": edges})[0]
            return self.emb
        changed = np.flatnonzero((self.node_x != node_x).any(axis=1))
        if changed.size == 0:
            return self.emb
        affected = self._hops(changed, n, along=0)  # rows whose embedding may change
        needed = self._hops(np.flatnonzero(affected), n, along=1)  # and every row they read
        if needed.sum() > self.max_share * n:
            self.node_x = node_x.copy()
            self.emb = self.session.run(None, {"node_x": node_x, "nn_edge_index": edges})[0]
            return self.emb
        keep = np.flatnonzero(needed)
        local = np.full(n, -1, np.int64)
        local[keep] = np.arange(keep.size)
        inside = needed[edges[0]] & needed[edges[1]]
        sub_edges = local[edges[:, inside]]
        sub = self.session.run(None, {"node_x": node_x[keep], "nn_edge_index": sub_edges})[0]
        emb = self.emb.copy()
        rows = np.flatnonzero(affected)
        emb[rows] = sub[local[rows]]
        self.node_x, self.emb = node_x.copy(), emb
        return emb


def onnx_scorer(model_dir: str | Path, incremental: bool = True):
    """Graph -> logits through ONNX Runtime (one thread, as serving runs it); node embeddings are
    updated incrementally across calls (``IncrementalEncoder``) unless ``incremental`` is False."""
    import json

    from agmarl_trainer.export import onnx_scores, onnx_sessions

    sessions = onnx_sessions(model_dir)
    if not incremental:
        return lambda g: onnx_scores(sessions, g)[1]
    manifest = Path(model_dir) / "manifest.json"
    layers = json.loads(manifest.read_text())["training"]["config"]["net"]["encoder_layers"] \
        if manifest.is_file() else 2
    encoder = IncrementalEncoder(sessions[0], layers)

    def score(g: HeteroGraph) -> np.ndarray:
        node_emb = encoder(g.node_x, g.nn_edge_index)
        return sessions[1].run(None, {"node_emb": node_emb, "node_x": g.node_x, "pod_x": g.pod_x,
                                      "cand_pod": g.cand_pod, "cand_node": g.cand_node,
                                      "cand_attr": g.cand_attr})[0]
    return score


def _policy(name: str):
    if name == "model":
        from agmarl_trainer.rollout import LearnedPolicy

        return LearnedPolicy(onnx_scorer(_MODEL_DIR))
    return FGD_PAPER_POLICIES[name](0)


def _init(model_dir: str | None) -> None:
    global _MODEL_DIR
    import torch

    torch.set_num_threads(1)
    _MODEL_DIR = model_dir


def _one(job: tuple[str, str, int, int]) -> tuple[str, str, int, float]:
    policy, workload, seed, n_nodes = job
    nodes = openb_nodes()[:n_nodes] if n_nodes else openb_nodes()
    r = run_inflation(nodes, openb_pods(workload), _policy(policy), np.random.default_rng(seed))
    return policy, workload, seed, float(r.allocation_curve()[100])


def evaluate_openb(model_dir: str | Path | None, workloads: Sequence[str], seeds: Sequence[int],
                   policies: Sequence[str] = ("model", "fgd", "bestfit"), workers: int = 2,
                   n_nodes: int = 0) -> dict[str, dict[str, dict]]:
    """{workload: {policy: {"seeds": {seed: alloc}, "mean": m}}} on the full cluster (or its first n_nodes)."""
    jobs = [(p, w, s, n_nodes) for w in workloads for p in policies for s in seeds]
    md = str(model_dir) if model_dir is not None else None
    if workers <= 1:
        _init(md)
        rows = [_one(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers, initializer=pool_worker, initargs=(_init, md)) as pool:
            rows = list(pool.map(_one, jobs))
    out: dict[str, dict[str, dict]] = {}
    for policy, workload, seed, alloc in rows:
        out.setdefault(workload, {}).setdefault(policy, {"seeds": {}})["seeds"][seed] = alloc
    for per in out.values():
        for res in per.values():
            res["mean"] = round(float(np.mean(list(res["seeds"].values()))), 3)
        if "model" in per and "fgd" in per:
            per["gap_to_fgd"] = round(per["model"]["mean"] - per["fgd"]["mean"], 3)
    return out


def _dynamic_one(job: tuple[str, str, int, int, float]) -> tuple[str, str, int, dict]:
    from agmarl_common.core.policies.registry import get_policy
    from agmarl_common.core.sim import dynamic, synthetic

    policy_name, workload, seed, n_nodes, horizon_s = job
    nodes = synthetic.synthetic_cluster(n_nodes, seed=seed)
    pods = synthetic.generate(workload, nodes, horizon_s=horizon_s, seed=seed)
    if policy_name == "model":
        policy = _policy("model")
        policy.observe_workload(pods)
    else:
        policy = get_policy(policy_name, seed) if policy_name not in FGD_PAPER_POLICIES else _policy(policy_name)
        if callable(getattr(policy, "observe_workload", None)):
            policy.observe_workload(pods)
    r = dynamic.run(policy, nodes, pods, dynamic.SimConfig(horizon_s=horizon_s), seed=seed, record_every=30.0)
    s = r.summary()
    keep = ("util_cpu_mean", "util_gpu_mean", "balance_mean", "pending_mean", "pending_time_p99_s", "bound",
            "unschedulable", "hard_violations")
    return policy_name, workload, seed, {k: round(float(s[k]), 4) for k in keep}


def evaluate_dynamic(model_dir: str | Path, workloads: Sequence[str], seeds: Sequence[int],
                     policies: Sequence[str] = ("model", "kube-default", "bestfit"), n_nodes: int = 40,
                     horizon_s: float = 1800.0, workers: int = 2) -> dict[str, dict[str, dict]]:
    """``sim.dynamic.run`` (the dynamic harness, one pod at a time) on synthetic clusters and workloads:
    {workload: {policy: mean of each summary metric over seeds}}."""
    jobs = [(p, w, s, n_nodes, horizon_s) for w in workloads for p in policies for s in seeds]
    with ProcessPoolExecutor(max_workers=max(workers, 1), initializer=pool_worker, initargs=(_init, str(model_dir))) as pool:
        rows = list(pool.map(_dynamic_one, jobs))
    out: dict[str, dict[str, dict]] = {}
    for policy, workload, _, summary in rows:
        out.setdefault(workload, {}).setdefault(policy, []).append(summary)
    return {w: {p: {k: round(float(np.mean([s[k] for s in runs])), 4) for k in runs[0]} for p, runs in per.items()}
            for w, per in out.items()}
