"""Speed of the learned policy's ``reward_gain`` input: reward-aware scores of a batch of pending pods,
pod by pod (``RewardAwarePolicy.score``, the per-state terms recomputed for every pod) against
``score_batch`` (per-state terms once, gains vectorised over all pairs), on the openb cluster filled
as ``agmarl bench latency`` fills it. Prints CPU milliseconds per batch (min and median over repeats:
the min is the least disturbed by other processes on a shared machine) and checks both give the same
scores.

    .venv/bin/python benchmarks/reward_gain_speed.py [--nodes 1523] [--batch 64] [--batches 40] [--repeats 7]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from agmarl_cli.bench import cluster_nodes, filled_state
from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.policies.rewardaware import RewardAwarePolicy
from agmarl_common.core.sim import traces


def timed(fn, batches, repeats: int) -> tuple[float, float, list]:
    per = []
    out = []
    for _ in range(repeats):
        t0 = time.thread_time()
        out = [fn(pods, cands) for pods, cands in batches]
        per.append((time.thread_time() - t0) / len(batches) * 1e3)
    return min(per), float(np.median(per)), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1523)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    nodes = cluster_nodes(args.nodes)
    workload = traces.load_openb_pods(traces.openb_pod_path("default"))
    state = filled_state(nodes, workload, 2 * args.nodes, rng)
    batches = []
    for b in range(args.batches):
        pods = [replace(workload[int(rng.integers(len(workload)))], name=f"b{b}-{k}") for k in range(args.batch)]
        cands = [feasible_nodes(p, state) for p in pods]
        batches.append(([p for p, c in zip(pods, cands) if c.size], [c for c in cands if c.size]))
    policy = RewardAwarePolicy()
    per_pod = timed(lambda pods, cands: [policy.score(p, state, c) for p, c in zip(pods, cands)], batches, args.repeats)
    batched = timed(lambda pods, cands: policy.score_batch(pods, state, cands), batches, args.repeats)
    diff = max(float(np.abs(a - b).max()) for x, y in zip(per_pod[2], batched[2]) for a, b in zip(x, y) if a.size)
    pairs = np.mean([sum(c.size for c in cands) for _, cands in batches])
    print(f"reward-aware scores of {args.batch} pending pods on {args.nodes} nodes ({pairs:.0f} candidate pairs per "
          f"batch), CPU ms per batch over {args.repeats} repeats of {args.batches} batches:")
    print(f"  pod by pod (score):  min {per_pod[0]:.2f}  median {per_pod[1]:.2f}")
    print(f"  batched (score_batch): min {batched[0]:.2f}  median {batched[1]:.2f}")
    print(f"  max |difference| {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
