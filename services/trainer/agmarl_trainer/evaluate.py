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

from agmarl_common.features import HeteroGraph
from agmarl_common.policies.fgd import FGD_PAPER_POLICIES
from agmarl_common.sim.inflation import run_inflation
from agmarl_trainer.imitation import openb_nodes, openb_pods

_MODEL_DIR: str | None = None


def onnx_scorer(model_dir: str | Path):
    """Graph -> logits through ONNX Runtime (one thread, as serving runs it)."""
    from agmarl_trainer.export import onnx_scores, onnx_sessions

    sessions = onnx_sessions(model_dir)

    def score(g: HeteroGraph) -> np.ndarray:
        return onnx_scores(sessions, g)[1]
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
        with ProcessPoolExecutor(max_workers=workers, initializer=_init, initargs=(md,)) as pool:
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
