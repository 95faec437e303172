"""Search-improved model against its own start and the baselines on the target protocol, paired per seed.

The target of docs/model.md "Search-based improvement" (issue 12): openb inflation, default pod list, full
1,523-node cluster, GPU allocation at 100 % arrived >= 96.0 %, above the model's imitation start and above
FGD (and, with ``--workloads``, above FGD on every shared openb pod list). Every (pod list, policy, seed)
triple is one ``agmarl eval`` job (``agmarl_cli.eval_jobs.run_job``, the spec of ``agmarl eval --protocol
inflation --workload openb:<list> --nodes openb:all``: tune 1.3, node-order ties), so each figure is the one
``agmarl eval`` prints for that seed. Printed per pod list: per seed the allocation of each policy, then per
policy the mean and, paired by seed, the difference candidate - policy with a 95 % t interval, and how many
seeds the candidate is ahead on; with several pod lists, a summary table of those differences per list.

    nice .venv/bin/python benchmarks/policy_improvement.py --candidate model:search --start model:default \\
        [--baselines fgd,fgd-pack,bestfit] [--seeds 42-53] [--workloads default,cpu300,...] [--workers 2] \\
        [--json out.json] [--reuse earlier.json] [--reuse-manifest models/default=model:default]

``--json`` holds the runs so far after every run ({"alloc": ...}, what ``--reuse`` reads: a stopped or failed
benchmark resumes from it) and the whole summary at the end.

Models are ``model:<ref>`` names (signed and inside an allowed directory, as everywhere). The seeds should be
ones training never used: the search trains and selects on sub-clusters of 100-200 nodes drawn from its own
seeds, never on the full cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from agmarl_cli.eval_jobs import run_job
from agmarl_cli.eval_spec import EvalSpec, parse_seeds
from agmarl_common.core.stats import interval

TARGET = 96.0


def job(args: tuple[str, str, int]) -> tuple[str, str, int, float, float]:
    workload, policy, seed = args
    t0 = time.monotonic()
    spec = EvalSpec(protocol="inflation", workload=f"openb:{workload}", nodes="openb:all")
    out = run_job(spec, policy, seed)
    return workload, policy, seed, float(out["metrics"]["gpu_alloc_100"]), time.monotonic() - t0


def reused(path: str, policies: list[str]) -> dict[tuple[str, str, int], float]:
    """(pod list, policy, seed) -> allocation of an earlier ``--json``: {"alloc": {list: {policy: {seed: a}}}}, or
    the older {"alloc": {policy: {seed: a}}} of the default pod list only."""
    old = json.loads(open(path).read())["alloc"]
    if old and all(isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values()) for v in old.values()):
        old = {"default": old}
    return {(w, p, int(s)): float(a) for w, per_policy in old.items() for p, per in per_policy.items()
            if p in policies for s, a in per.items()}


def nested(alloc: dict[tuple[str, str, int], float], keys) -> dict:
    """{list: {policy: {seed: a}}} of ``alloc`` at ``keys`` ((list, policy, seed), in the order given): what
    ``--json`` writes and ``--reuse`` reads."""
    out: dict = {}
    for w, p, s in keys:
        out.setdefault(w, {}).setdefault(p, {})[s] = alloc[(w, p, s)]
    return out


def save_runs(path: str, alloc: dict[tuple[str, str, int], float]) -> None:
    """The runs so far as ``--reuse`` reads them ({"alloc": {list: {policy: {seed: a}}}}), written whole and then
    renamed over ``path``, so that a stop leaves the last complete file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"alloc": nested(alloc, alloc)}, f)
    os.replace(tmp, path)


def from_manifest(arg: str, policies: list[str]) -> dict[tuple[str, str, int], float]:
    """``FOLDER=NAME``: the full-cluster evaluation in a model folder's manifest (``agmarl train --evaluate-only
    --eval-seeds ... --eval-workloads ...``, the same harness, rounded to 0.01), its model's runs named NAME
    (e.g. ``model:default``), FGD's and BestFit's as ``fgd`` and ``bestfit``."""
    folder, _, name = arg.partition("=")
    results = json.loads((Path(folder) / "manifest.json").read_text())["evaluation"]["openb_full_cluster"]["results"]
    names = {"model": name, "fgd": "fgd", "bestfit": "bestfit"}
    return {(w, names[p], int(s)): float(a) for w, per_policy in results.items() for p, runs in per_policy.items()
            if names.get(p) in policies for s, a in runs["seeds"].items()}


def paired(alloc: dict, workload: str, candidate: str, other: str, seeds: list[int]) -> tuple[float, float, int]:
    """(mean, 95 % half-width, seeds ahead) of candidate - other on one pod list."""
    d = [alloc[(workload, candidate, s)] - alloc[(workload, other, s)] for s in seeds]
    mean, _, high = interval(d)
    return mean, high - mean, sum(x > 0 for x in d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidate", default="model:search")
    ap.add_argument("--start", default="model:default", help="the candidate's start model")
    ap.add_argument("--baselines", default="fgd,fgd-pack")
    ap.add_argument("--seeds", default="42-53")
    ap.add_argument("--workloads", default="default", help="openb pod lists, comma-separated (default, cpu300, ...)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("--reuse", default="", help="an earlier --json of this benchmark: its (pod list, policy, seed) "
                    "runs are taken from there, by name (a model that changed since must not be reused)")
    ap.add_argument("--reuse-manifest", default="", metavar="FOLDER=NAME",
                    help="take runs from a model folder's full-cluster evaluation, its model named NAME")
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    workloads = [w for w in args.workloads.split(",") if w]
    others = [p for p in [args.start] + args.baselines.split(",") if p]
    policies = [args.candidate] + others
    alloc = from_manifest(args.reuse_manifest, policies) if args.reuse_manifest else {}
    alloc.update(reused(args.reuse, policies) if args.reuse else {})
    jobs = [(w, p, s) for w in workloads for s in seeds for p in policies if (w, p, s) not in alloc]
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for w, p, s, a, _ in pool.map(job, jobs):
            alloc[(w, p, s)] = a
            if args.json:  # every run as it ends: a run stopped or failed later resumes with --reuse of this file
                save_runs(args.json, alloc)
    elapsed = time.monotonic() - t0
    summary = {"seeds": seeds, "target": TARGET, "workloads": workloads,
               "alloc": nested(alloc, [(w, p, s) for w in workloads for p in policies for s in seeds]),
               "mean": {}, "paired": {}}
    for w in workloads:
        print(f"openb inflation · {w} pods · 1,523 nodes · GPU allocation % at 100 % arrived · seeds {args.seeds} "
              f"({len(seeds)})\n")
        print("| seed | " + " | ".join(policies) + " |")
        print("|---|" + "---|" * len(policies))
        for s in seeds:
            print(f"| {s} | " + " | ".join(f"{alloc[(w, p, s)]:.2f}" for p in policies) + " |")
        means = {p: round(float(np.mean([alloc[(w, p, s)] for s in seeds])), 3) for p in policies}
        summary["mean"][w], summary["paired"][w] = means, {}
        print(f"\n| {args.candidate} - | mean diff (pp) | 95 % CI | ahead on |\n|---|---|---|---|")
        for p in others:
            mean, half, ahead = paired(alloc, w, args.candidate, p, seeds)
            summary["paired"][w][p] = {"diff_mean": round(mean, 3), "ci95": round(half, 3), "ahead": ahead}
            print(f"| {p} ({means[p]:.3f}) | {mean:+.3f} | {mean - half:+.3f} .. {mean + half:+.3f} | "
                  f"{ahead}/{len(seeds)} |")
        print()
    if "default" in workloads:
        m = summary["mean"]["default"][args.candidate]
        print(f"{args.candidate} on openb default: {m:.3f} % against the target {TARGET:.1f} %: "
              + ("met" if m >= TARGET else f"missed by {TARGET - m:.3f} pp"))
    print(f"{len(jobs)} runs in {elapsed:.0f} s (the others reused)")
    if len(workloads) > 1:
        print(f"\n| pod list | {args.candidate} | " + " | ".join(f"- {p}" for p in others) + " |")
        print("|---|---:|" + "---|" * len(others))
        for w in workloads:
            cells = []
            for p in others:
                d = summary["paired"][w][p]
                cells.append(f"{d['diff_mean']:+.2f} ({d['diff_mean'] - d['ci95']:+.2f} .. "
                             f"{d['diff_mean'] + d['ci95']:+.2f}), {d['ahead']}/{len(seeds)}")
            print(f"| {w} | {summary['mean'][w][args.candidate]:.2f} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
