"""Compare a live trace replay's placements with the in-process run of the same seed and policy.

    agmarl up --workload openb:default --policy fgd --seed 42 --cluster-nodes openb:all --result out.json
    .venv/bin/python benchmarks/replay_parity.py --result out.json --policy fgd --seed 42 --nodes openb:all

Prints how many of the placements differ (pod for pod, arrival order) and both runs' GPU allocation at
100 % arrived.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from agmarl_cli.eval_spec import resolve_policy
from agmarl_common.core.sim import catalog
from agmarl_common.core.sim.inflation import run_inflation


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", required=True, help="the replay's result JSON (agmarl up --result)")
    ap.add_argument("--policy", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--workload", default="openb:default")
    ap.add_argument("--nodes", default="openb:all")
    args = ap.parse_args()
    nodes, pods = catalog.cluster_nodes(args.nodes), catalog.openb_pods(args.workload)
    res = run_inflation(nodes, pods, resolve_policy(args.policy, args.seed), np.random.default_rng(args.seed))
    names = [nd.name for nd in nodes]
    want = [[p.key, names[i] if i >= 0 else ""] for p, i in zip(res.pods, res.node_index)]
    live = json.loads(open(args.result).read())
    differ = [k for k, (a, b) in enumerate(zip(want, live["placements"])) if a != b]
    print(f"{args.policy} seed {args.seed}: {len(want)} pods in-process, {len(live['placements'])} live, "
          f"{len(differ) + abs(len(want) - len(live['placements']))} placements differ (first: {differ[:3]}); "
          f"GPU allocation at 100 % arrived in-process {res.allocation_curve()[100]:.2f} %, live "
          f"{live['gpu_alloc_100']:.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
