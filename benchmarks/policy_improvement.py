"""Search-improved model against its own start and the baselines on the target protocol, paired per seed.

The target of docs/model.md "Search-based improvement" (issue 12): openb inflation, default pod list, full
1,523-node cluster, GPU allocation at 100 % arrived >= 96.0 %, above the model's imitation start and above
FGD. Every (policy, seed) pair is one ``agmarl eval`` job (``agmarl_cli.eval_jobs.run_job``, the spec of
``agmarl eval --protocol inflation --workload openb:default --nodes openb:all``: tune 1.3, node-order
ties), so each figure is the one ``agmarl eval`` prints for that seed. Printed: per seed the allocation of
each policy, then per policy the mean and, paired by seed, the difference candidate - policy with a 95 %
t interval, and how many seeds the candidate is ahead on.

    nice .venv/bin/python benchmarks/policy_improvement.py --candidate model:search --start model:default \\
        [--baselines fgd,fgd-pack,bestfit] [--seeds 42-53] [--workers 2] [--json out.json] [--reuse earlier.json]

Models are ``model:<ref>`` names (signed and inside an allowed directory, as everywhere). The seeds should be
ones training never used: the search trains and selects on sub-clusters of 100-200 nodes drawn from its own
seeds, never on the full cluster.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from agmarl_cli.eval_jobs import run_job
from agmarl_cli.eval_spec import EvalSpec, parse_seeds

SPEC = EvalSpec(protocol="inflation", workload="openb:default", nodes="openb:all")
TARGET = 96.0
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 19: 2.093, 29: 2.045}


def interval(diffs: list[float]) -> tuple[float, float]:
    """(mean, 95 % t half-width) of paired differences."""
    d = np.asarray(diffs, float)
    if d.size < 2:
        return float(d.mean()), float("nan")
    t = T95.get(d.size - 1, T95[max(k for k in T95 if k <= d.size - 1)])
    return float(d.mean()), float(t * d.std(ddof=1) / math.sqrt(d.size))


def job(args: tuple[str, int]) -> tuple[str, int, float, float]:
    policy, seed = args
    t0 = time.monotonic()
    out = run_job(SPEC, policy, seed)
    return policy, seed, float(out["metrics"]["gpu_alloc_100"]), time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidate", default="model:search")
    ap.add_argument("--start", default="model:default", help="the candidate's start model")
    ap.add_argument("--baselines", default="fgd,fgd-pack")
    ap.add_argument("--seeds", default="42-53")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("--reuse", default="", help="an earlier --json of this benchmark: its (policy, seed) runs are "
                    "taken from there, by name (a model that changed since must not be reused)")
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    others = [p for p in [args.start] + args.baselines.split(",") if p]
    policies = [args.candidate] + others
    alloc: dict[tuple[str, int], float] = {}
    if args.reuse:
        old = json.loads(open(args.reuse).read())["alloc"]
        alloc = {(p, int(s)): float(a) for p, per in old.items() if p in policies for s, a in per.items()}
    jobs = [(p, s) for s in seeds for p in policies if (p, s) not in alloc]
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        rows = list(pool.map(job, jobs))
    alloc.update({(p, s): a for p, s, a, _ in rows})
    print(f"openb inflation · default pods · 1,523 nodes · GPU allocation % at 100 % arrived · seeds {args.seeds} "
          f"({len(seeds)}) · {time.monotonic() - t0:.0f} s\n")
    print("| seed | " + " | ".join(policies) + " |")
    print("|---|" + "---|" * len(policies))
    for s in seeds:
        print(f"| {s} | " + " | ".join(f"{alloc[(p, s)]:.2f}" for p in policies) + " |")
    cand = [alloc[(args.candidate, s)] for s in seeds]
    summary = {"seeds": seeds, "target": TARGET, "alloc": {p: {s: alloc[(p, s)] for s in seeds} for p in policies},
               "mean": {p: round(float(np.mean([alloc[(p, s)] for s in seeds])), 3) for p in policies}, "paired": {}}
    print(f"\n| {args.candidate} - | mean diff (pp) | 95 % CI | ahead on |\n|---|---|---|---|")
    for p in others:
        d = [c - alloc[(p, s)] for c, s in zip(cand, seeds)]
        mean, half = interval(d)
        ahead = sum(x > 0 for x in d)
        summary["paired"][p] = {"diff_mean": round(mean, 3), "ci95": round(half, 3), "ahead": ahead}
        print(f"| {p} ({summary['mean'][p]:.3f}) | {mean:+.3f} | {mean - half:+.3f} .. {mean + half:+.3f} | "
              f"{ahead}/{len(seeds)} |")
    m = summary["mean"][args.candidate]
    print(f"\n{args.candidate}: {m:.3f} % against the target {TARGET:.1f} %: "
          + ("met" if m >= TARGET else f"missed by {TARGET - m:.3f} pp"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
