"""What batch mode's batch size does to placements: every arrival of openb:default's inflation plan decided as a
backlog by ``batchcore.decide_batch``, in consecutive batches of B pods, from an empty openb cluster.

The pods are the ``--pods`` first arrivals (default all: 10,825 for openb:default, seed 42) of the inflation
plan (``sim.inflation.plan``, the nodes labelled with the replay's tie order as the services see them), the
policy briefed with the workload as ``agmarl eval`` does; each batch decides on the state the previous one
left, as the binder does with its cluster view. Printed per policy and batch size: pods placed and the GPU
allocation at the end (GPU milli bound / GPU milli of the cluster). B = 1 is deciding one pod at a time, in
arrival order. A policy with local node scores (``Policy.local_scores``) should place the same at every B.

    .venv/bin/python benchmarks/batch_placement.py --policies fgd --batch-sizes 1 16 64 256 1024
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from agmarl_common.core.cluster.state import ClusterState
from agmarl_common.core.policies.base import brief
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import catalog
from agmarl_common.core.sim.inflation import plan
from agmarl_inference.batchcore import decide_batch
from agmarl_state_collector.replay import labelled


def run(nodes: tuple, rank, workload: list, arrivals: list, policy_name: str, batch: int) -> tuple[int, float]:
    """(pods placed, GPU allocation %) after deciding ``arrivals`` in batches of ``batch``."""
    state = ClusterState.empty(labelled(nodes, rank))
    policy = get_policy(policy_name)
    brief(policy, workload)
    placed = 0
    for i in range(0, len(arrivals), batch):
        placements, state = decide_batch(arrivals[i:i + batch], state, policy)
        placed += sum(1 for p in placements if p.node)
    return placed, 100.0 * float(state.gpu_used.sum()) / float(state.gpu_count.sum() * 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="openb:all")
    ap.add_argument("--workload", default="openb:default")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--pods", type=int, default=0, help="the first N arrivals (0: all)")
    ap.add_argument("--policies", nargs="+", default=["fgd"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64, 256])
    args = ap.parse_args()
    nodes = tuple(catalog.cluster_nodes(args.nodes))
    workload = catalog.openb_pods(args.workload)
    arrivals, rank = plan(nodes, workload, np.random.default_rng(args.seed))
    arrivals = arrivals[:args.pods] if args.pods else arrivals
    print(f"batch placement: {len(arrivals)} arrivals of {args.workload} (inflation plan, seed {args.seed}) as a "
          f"backlog on {len(nodes)} nodes ({args.nodes})")
    for name in args.policies:
        for b in args.batch_sizes:
            began = time.perf_counter()
            placed, alloc = run(nodes, rank, workload, arrivals, name, b)
            print(f"  {name:16s} batch {b:5d}: {placed} / {len(arrivals)} placed, GPU allocation {alloc:.2f} % "
                  f"({time.perf_counter() - began:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
