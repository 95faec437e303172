"""The dynamic synthetic suite: baselines (and any model:* policy) on the composite reward.

Every policy runs the dynamic protocol of `agmarl eval` on each synthetic workload (diurnal,
burst, batch_online_mix, affinity_heavy) on one synthetic cluster, for a few seeds; the same
harness, the same seeds, the same cluster, so the comparison is like for like. Prints Markdown:
the composite reward (agmarl_common.core.reward, mean over the record points of a run) per policy and
workload, the hard-constraint violations (must be 0), the paired comparison of one policy (``--paired``;
by default the first ``model:*`` policy) with every other, seed by seed (the mean over the workloads of each
seed's reward: its difference, the 95 % t interval of the mean difference by ``core.stats.interval``, and
how many seeds and runs it is ahead in), then each workload's full `agmarl eval` table.
The reward-aware expert (``policies.rewardaware``, the reward's own marginal gains) runs with the
baselines by default.

    nice .venv/bin/python benchmarks/dynamic_suite.py --workers 2 [--extra model:latest] [--json out.json]
    # the README's issue-4 setting: one workload, 50 nodes, 1800 s, seeds 42-43
    nice .venv/bin/python benchmarks/dynamic_suite.py --workloads batch_online_mix --nodes synthetic:50 \
        --horizon 1800 --seeds 42-43 --policies kube-default,trimaran-lvrb,trimaran-tlp,reward-aware
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from agmarl_common.core.policies.registry import is_model
from agmarl_common.core.stats import interval

from agmarl_cli.evaluate import (EvalError, EvalSpec, aggregate, check_spec, load_nodes, markdown_table,
                                 parse_policies, parse_seeds, run_all)

WORKLOADS = ("diurnal", "burst", "batch_online_mix", "affinity_heavy")
BASELINES = ("kube-default", "kube-resources", "trimaran-tlp", "trimaran-lvrb", "koord-loadaware",
             "most-allocated", "bestfit", "fgd")
EXPERTS = ("reward-aware",)


def suite(nodes: str, policies: list[str], seeds: list[int], horizon_s: float, workers: int,
          workloads: tuple[str, ...] = WORKLOADS) -> dict[str, dict]:
    """workload -> the `agmarl eval` report of the dynamic protocol on it."""
    reports = {}
    for w in workloads:
        spec = EvalSpec(protocol="dynamic", workload=f"synthetic:{w}", nodes=nodes, horizon_s=horizon_s)
        check_spec(spec)
        runs = run_all(spec, policies, seeds, workers)
        reports[w] = aggregate(spec, runs, policies, seeds, len(load_nodes(spec)))
    return reports


def _cell(entry: dict, key: str, digits: int = 3) -> str:
    m = entry["metrics"][key]
    return f"{m['mean']:.{digits}f} ± {m['std']:.{digits}f}"


def summary_tables(reports: dict[str, dict], policies: list[str]) -> str:
    """Reward per policy x workload (+ the mean over workloads, and the rank by it), then violations."""
    workloads = list(reports)
    head = "| policy | " + " | ".join(workloads) + " | mean |"
    sep = "|---" * (len(workloads) + 2) + "|"
    means = {p: float(np.mean([reports[w]["policies"][p]["metrics"]["reward_mean"]["mean"] for w in workloads]))
             for p in policies}
    lines = ["### Composite reward (mean over the run; mean ± std over seeds; higher is better)\n", head, sep]
    for p in sorted(policies, key=lambda q: -means[q]):
        cells = [_cell(reports[w]["policies"][p], "reward_mean") for w in workloads]
        lines.append(f"| {p} | " + " | ".join(cells) + f" | **{means[p]:.3f}** |")
    lines += ["", "### Hard-constraint violations (worst record point, summed over seeds; must be 0)\n",
              head.replace(" mean |", " total |"), sep]
    for p in policies:
        counts = [sum(r["metrics"]["hard_violations"] for r in reports[w]["policies"][p]["runs"]) for w in workloads]
        lines.append(f"| {p} | " + " | ".join(f"{c:g}" for c in counts) + f" | {sum(counts):g} |")
    return "\n".join(lines)


def seed_rewards(reports: dict[str, dict], policy: str) -> dict[int, list[float]]:
    """seed -> the policy's mean reward of that seed's run on each workload (in the reports' order)."""
    out: dict[int, list[float]] = {}
    for rep in reports.values():
        for run in rep["policies"][policy]["runs"]:
            out.setdefault(int(run["seed"]), []).append(float(run["metrics"]["reward_mean"]))
    return out


def paired_table(reports: dict[str, dict], policies: list[str], subject: str) -> str:
    """``subject`` against every other policy, paired by seed: the difference of the seed's reward (mean over
    the workloads), its 95 % t interval over the seeds, seeds ahead, and runs (seed x workload) ahead."""
    mine = seed_rewards(reports, subject)
    lines = [f"### Paired by seed: {subject} minus each policy (composite reward, mean over the workloads of a "
             "seed; 95 % t interval over the seeds)\n",
             "| minus | mean difference | 95 % CI | seeds ahead | runs ahead |", "|---|---:|---|---:|---:|"]
    for other in policies:
        if other == subject:
            continue
        theirs = seed_rewards(reports, other)
        seeds = sorted(set(mine) & set(theirs))
        diffs = [float(np.mean(mine[k])) - float(np.mean(theirs[k])) for k in seeds]
        runs = [a - b for k in seeds for a, b in zip(mine[k], theirs[k])]
        mean, low, high = interval(diffs)
        ci = "n/a (one seed)" if np.isnan(low) else f"{low:+.4f} .. {high:+.4f}"
        lines.append(f"| {other} | {mean:+.4f} | {ci} | {sum(d > 0 for d in diffs)}/{len(diffs)} | "
                     f"{sum(d > 0 for d in runs)}/{len(runs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="synthetic:60", help="cluster (default synthetic:60)")
    ap.add_argument("--seeds", default="42-44")
    ap.add_argument("--horizon", type=float, default=3600.0, help="simulated seconds per run")
    ap.add_argument("--policies", default=",".join(BASELINES + EXPERTS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"a subset of {','.join(WORKLOADS)}")
    ap.add_argument("--extra", default="", help="more policies, e.g. model:latest")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--paired", default="", help="the policy compared seed by seed with every other "
                    "(default: the first model:* policy; none: no paired table)")
    ap.add_argument("--json", default=None, help="write every workload's report here")
    args = ap.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        policies = parse_policies(",".join(x for x in (args.policies, args.extra) if x))
        workloads = tuple(w for w in args.workloads.split(",") if w)
        if not workloads or set(workloads) - set(WORKLOADS):
            raise ValueError(f"--workloads must name some of {', '.join(WORKLOADS)}, got {args.workloads!r}")
        subject = args.paired or next((p for p in policies if is_model(p)), "")
        if subject and subject != "none" and subject not in policies:
            raise ValueError(f"--paired {subject!r} is not among the policies run")
        start = time.perf_counter()
        reports = suite(args.nodes, policies, seeds, args.horizon, args.workers, workloads)
    except (EvalError, ValueError, KeyError) as err:
        print(f"dynamic_suite: error: {err}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - start
    n_nodes = next(iter(reports.values()))["n_nodes"]
    print(f"## Dynamic synthetic suite\n\n{n_nodes}-node synthetic cluster (`{args.nodes}`), horizon "
          f"{args.horizon:g} s, seeds {args.seeds}, {len(policies)} policies x {len(workloads)} workloads x "
          f"{len(seeds)} seeds = {len(policies) * len(workloads) * len(seeds)} runs in {wall:.0f} s wall "
          f"({args.workers} worker(s)).\n")
    print(summary_tables(reports, policies))
    if subject and subject != "none":
        print("\n" + paired_table(reports, policies, subject))
    for w, rep in reports.items():
        print(f"\n### synthetic:{w}\n")
        print(markdown_table(rep))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
