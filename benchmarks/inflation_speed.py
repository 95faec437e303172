"""How long one openb inflation run takes on one core, per policy.

Usage: .venv/bin/python benchmarks/inflation_speed.py [--workload default] [--nodes all|gpu] [--seed 42]
Prints seconds (process CPU time and wall) for each policy on the 1,523-node openb cluster.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim.inflation import run_inflation
from agmarl_common.core.sim.traces import ALL_NODES, GPU_NODES, load_openb_nodes, load_openb_pods, openb_node_path, \
    openb_pod_path

POLICIES = ("random", "dotprod", "gpu-clustering", "gpu-packing", "bestfit", "fgd")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workload", default="default")
    ap.add_argument("--nodes", choices=("all", "gpu"), default="all")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    nodes = load_openb_nodes(openb_node_path(ALL_NODES if args.nodes == "all" else GPU_NODES))
    pods = load_openb_pods(openb_pod_path(args.workload))
    print(f"openb {args.workload}: {len(nodes)} nodes, {len(pods)} pods in the list, seed {args.seed}")
    print("| policy | arrivals | cpu s | wall s | GPU alloc @100 % |")
    print("|---|---:|---:|---:|---:|")
    for name in args.policies.split(","):
        policy = get_policy(name, args.seed)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = run_inflation(nodes, pods, policy, np.random.default_rng(args.seed))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        print(f"| {name} | {len(result.pods)} | {cpu:.2f} | {wall:.2f} | {result.allocation_curve()[100]:.2f} |")


if __name__ == "__main__":
    main()
