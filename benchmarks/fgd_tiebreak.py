"""How much of FGD's result on the paper's protocol comes from its tie-breaking.

FGD's node scores are integers (sigmoid of the fragmentation change, truncated to 0..100), so many nodes
tie; the paper's simulator gives a tie to the first node of a per-run random node order. This benchmark
runs FGD on the openb default trace (full 1,523-node cluster, ``sim.inflation.run_inflation``) with:

- ``node-order``: the paper's rule (the harness default);
- ``random``: kube-scheduler's rule (``selectHost``: uniformly among the tied nodes);
- ``gpu-left``: ties broken by an observable rule, least GPU left after placement as a share of the node's GPUs;
- ``name-hash``: ties broken by a stable order of node names (CRC-32), the same for every run;
- ``fgd-pack``: the ``fgd-pack`` policy (``policies/fgdpack.py``, the learned model's imitation teacher):
  nodes already running pods first, then the name order;
- ``cpu-spread``: ``fgd-pack`` for GPU pods, but CPU pods' ties to the node with the lowest cpu allocation
  after placement (kube-scheduler's LeastAllocated spreading): what packing CPU pods is worth here;
- ``fgd-pack-cpu``: the ``fgd-pack-cpu`` policy: ``fgd-pack`` for GPU pods, CPU-only pods' ties to nodes
  without GPUs first.

The last five add a secondary key below one score unit, so they only reorder tied nodes. ``--workloads``
runs other openb pod lists (``cpu300``, ``gpushare80``, ...; default: ``default``), ``--workers`` runs in
processes; after the tables, each variant's paired difference to ``node-order`` (FGD as the paper runs it)
per pod list, with its 95 % interval over the seeds.

    nice .venv/bin/python benchmarks/fgd_tiebreak.py --seeds 42-51 [--variants node-order,gpu-left]
    nice .venv/bin/python benchmarks/fgd_tiebreak.py --seeds 42-51 --variants node-order,fgd-pack,fgd-pack-cpu \
        --workloads default,cpu0,cpu037,cpu050,cpu072,cpu100,cpu200,cpu235,cpu250,cpu300,gpushare20,gpushare40,\
gpushare60,gpushare80,gpushare100 --workers 2
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Pod
from agmarl_common.core.policies.fgd import FgdPolicy
from agmarl_common.core.policies.fgdpack import TIE_SHARE, FgdPackCpuPolicy, FgdPackPolicy
from agmarl_common.core.stats import interval
from agmarl_common.core.sim.inflation import run_inflation
from agmarl_common.core.sim.traces import ALL_NODES, load_openb_nodes, load_openb_pods, openb_node_path, openb_pod_path

VARIANTS = ("node-order", "random", "gpu-left", "name-hash", "fgd-pack", "cpu-spread", "fgd-pack-cpu")


class FgdTieBreak(FgdPackPolicy):
    """FGD's integer scores minus a key in [0, 1), scaled by fgd-pack's ``TIE_SHARE``, that only orders tied
    nodes, by a rule only this benchmark compares: ``gpu-left``, ``name-hash`` (fgd-pack's order keys alone) or
    ``cpu-spread`` (fgd-pack for GPU pods)."""

    def __init__(self, rule: str):
        super().__init__(0)
        self.rule = rule

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        if self.rule == "cpu-spread" and pod.num_gpu > 0:
            return super().score(pod, state, candidates)
        idx = np.asarray(candidates, dtype=np.int64)
        if self.rule == "cpu-spread":
            key = (state.cpu_used[idx] + pod.cpu_milli) / np.maximum(state.cpu_cap[idx], 1)
        elif self.rule == "gpu-left":
            cap = state.gpu_count[idx] * GPU_MILLI
            free = np.clip(cap - state.gpu_used[idx].sum(axis=1), 0, None)
            key = (free - pod.gpu_milli_total) / np.maximum(cap, 1)
        else:  # name-hash
            key = self.order_keys(state)[idx]
        return FgdPolicy.score(self, pod, state, candidates) - TIE_SHARE * np.clip(key, 0.0, 1.0)


def run(variant: str, seed: int, nodes, pods) -> float:
    policy = FgdPolicy(0) if variant in ("node-order", "random") else FgdPackPolicy(0) if variant == "fgd-pack" \
        else FgdPackCpuPolicy(0) if variant == "fgd-pack-cpu" else FgdTieBreak(variant)
    tie = "random" if variant == "random" else "node-order"
    res = run_inflation(nodes, pods, policy, np.random.default_rng(seed), tie_break=tie)
    return float(res.allocation_curve()[100])


def job(args: tuple[str, str, int]) -> float:
    """One run in a worker: (pod list, variant, seed) -> GPU allocation % at 100 % arrived."""
    workload, variant, seed = args
    return run(variant, seed, load_openb_nodes(openb_node_path(ALL_NODES)), load_openb_pods(openb_pod_path(workload)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="42-51", help="A-B inclusive or a comma list")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--workloads", default="default", help="openb pod lists, comma-separated (default, cpu300, ...)")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi) + 1)) if hi and "," not in args.seeds else \
        [int(s) for s in args.seeds.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    workloads = [w for w in args.workloads.split(",") if w]
    missing = [w for w in workloads if not openb_pod_path(w).is_file()]
    if missing:
        ap.error(f"no openb pod list {missing} (files openb_pod_list_<name>.csv of the shared traces)")
    runs = [(w, v, s) for w in workloads for v in variants for s in seeds]
    t = time.monotonic()
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        results = dict(zip(runs, pool.map(job, runs)))
    n = len(load_openb_nodes(openb_node_path(ALL_NODES)))
    for w in workloads:
        print(f"\nFGD on openb {w}, {n} nodes, GPU allocation % at 100 % arrived, seeds {args.seeds}\n")
        print("| tie-break | mean | per seed |\n|---|---:|---|")
        for v in variants:
            vals = [results[(w, v, s)] for s in seeds]
            print(f"| {v} | {np.mean(vals):.2f} | {' '.join(f'{x:.2f}' for x in vals)} |")
    if "node-order" in variants and len(variants) > 1:
        others = [v for v in variants if v != "node-order"]
        print(f"\nPaired difference to node-order (FGD as the paper runs it), points, mean (95 % interval), ahead / "
              f"behind of {len(seeds)} seeds\n")
        print("| pod list | " + " | ".join(others) + " |\n|---|" + "---|" * len(others))
        for w in workloads:
            cells = []
            for v in others:
                d = [results[(w, v, s)] - results[(w, "node-order", s)] for s in seeds]
                mean, low, high = interval(d)
                cells.append(f"{mean:+.2f} ({low:+.2f} .. {high:+.2f}), {sum(x > 0 for x in d)} / "
                             f"{sum(x < 0 for x in d)}")
            print(f"| {w} | " + " | ".join(cells) + " |")
    print(f"\n{len(runs)} runs, {time.monotonic() - t:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
