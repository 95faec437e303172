"""The dynamic protocol under pressure: learned policies against the heuristics and the lookahead reference.

Every policy runs `agmarl eval`'s dynamic protocol (the same jobs: ``agmarl_cli.evaluate.run_all``) on the
high-pressure synthetic workloads (``sim.synthetic.PRESSURE_VARIANTS``: steady load near capacity, GPU
fragmentation, bursts, node loss; each with its simulator settings, ``synthetic.sim_options``) on one
synthetic cluster, for seeds the trainer never used. Prints Markdown:

- per workload and policy, means over seeds: composite reward, pending-time p99, SLA violations (distinct
  LS pods seen on a node above 80 % cpu at a record point), unschedulable pods (pending past the timeout);
- for each learned policy (``model:*``) and the lookahead reference, per-seed paired differences against
  the best heuristic (the best mean reward of reward-aware, kube-default and the Trimaran plugins, chosen
  per workload and over all of them) with 95 % t intervals, over all workloads (the per-seed mean over
  workloads) and per workload;
- the issue-12 target, met or missed with the figure: reward >= +3 % over the best heuristic, and
  pending-time p99 or SLA violations >= 20 % lower, neither worse; and the share of the gap from the best
  heuristic to the lookahead reference the learned policy closes.

    nice -n 10 .venv/bin/python benchmarks/pressure_suite.py --workers 2 [--json out.json] [--cache DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from agmarl_cli.evaluate import EvalError, EvalSpec, check_spec, load_nodes, parse_policies, parse_seeds, run_all
from agmarl_common.core.policies.registry import is_model
from agmarl_common.core.sim import synthetic

WORKLOADS = tuple(synthetic.PRESSURE_VARIANTS)
HEURISTICS = ("reward-aware", "kube-default", "trimaran-lvrb", "trimaran-tlp")
REFERENCE = "lookahead"
LEARNED = ("model:default", "model:models/expert-batch")
METRICS = {"reward_mean": "reward", "pending_time_p99_s": "pending p99 s", "sla_violating_pods": "SLA viol. pods",
           "unschedulable": "unsched."}
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 14: 2.145, 16: 2.120, 19: 2.093, 24: 2.064, 29: 2.045, 39: 2.023, 59: 2.001}


def t975(df: int) -> float:
    """Student's t 97.5 % quantile, the tabulated value at or below ``df`` (conservative)."""
    return T975[max(k for k in T975 if k <= df)] if df < 120 else 1.96


def interval(diffs: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high) of a 95 % t interval of paired differences."""
    d = np.asarray(diffs, float)
    if len(d) < 2:
        return float(d.mean()), math.nan, math.nan
    half = float(t975(len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return float(d.mean()), float(d.mean()) - half, float(d.mean()) + half


def per_seed(runs: list[dict], policies: Sequence[str], seeds: Sequence[int]) -> dict[str, dict[str, np.ndarray]]:
    """policy -> metric -> (seeds,) values, in seed order."""
    by = {(r["policy"], r["seed"]): r["metrics"] for r in runs}
    return {p: {m: np.array([by[(p, s)][m] for s in seeds], float) for m in METRICS} for p in policies}


def pooled(values: dict[str, dict[str, dict[str, np.ndarray]]], policies: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    """Per seed, the mean over workloads (reward, p99) or the sum (SLA pods, unschedulable)."""
    out = {}
    for p in policies:
        out[p] = {}
        for m in METRICS:
            stack = np.stack([values[w][p][m] for w in values])
            out[p][m] = stack.mean(axis=0) if m in ("reward_mean", "pending_time_p99_s") else stack.sum(axis=0)
    return out


def best_heuristic(vals: dict[str, dict[str, np.ndarray]], heuristics: Sequence[str]) -> str:
    return max(heuristics, key=lambda p: float(vals[p]["reward_mean"].mean()))


def _rel(a: float, b: float) -> str:
    return f"{100.0 * (a - b) / b:+.1f} %" if b else ("±0 %" if a == b else "n/a (ref 0)")


def compare(vals: dict[str, dict[str, np.ndarray]], policy: str, ref: str) -> dict[str, dict[str, float]]:
    """metric -> {mean, low, high, policy, ref, rel, ahead}: ``policy`` - ``ref`` per seed."""
    out = {}
    for m in METRICS:
        d = vals[policy][m] - vals[ref][m]
        mean, lo, hi = interval(d)
        a, b = float(vals[policy][m].mean()), float(vals[ref][m].mean())
        out[m] = {"mean": mean, "low": lo, "high": hi, "policy": a, "ref": b,
                  "rel": 100.0 * (a - b) / b if b else (0.0 if a == b else math.inf),
                  "better": int((d > 0).sum() if m == "reward_mean" else (d < 0).sum()), "n": len(d)}
    return out


def comparison_lines(vals: dict[str, dict[str, np.ndarray]], policy: str, ref: str, digits: dict[str, int]) -> list[str]:
    c = compare(vals, policy, ref)
    lines = []
    for m, label in METRICS.items():
        x, k = c[m], digits[m]
        lines.append(f"  - {label}: {x['policy']:.{k}f} vs {x['ref']:.{k}f} ({_rel(x['policy'], x['ref'])}); "
                     f"paired {x['mean']:+.{k}f} (95 % CI {x['low']:+.{k}f} .. {x['high']:+.{k}f}), "
                     f"better on {x['better']}/{x['n']} seeds")
    return lines


def target_line(vals: dict[str, dict[str, np.ndarray]], policy: str, ref: str, reference: str | None) -> str:
    """The issue-12 target for ``policy`` against the best heuristic ``ref``, met or missed, and the gap share."""
    c = compare(vals, policy, ref)
    reward_ok = c["reward_mean"]["rel"] >= 3.0
    p99, sla = c["pending_time_p99_s"]["rel"], c["sla_violating_pods"]["rel"]
    tail_ok = (p99 <= -20.0 and sla <= 0.0) or (sla <= -20.0 and p99 <= 0.0)
    text = (f"**{policy}: reward {c['reward_mean']['rel']:+.2f} % (target >= +3 %: {'met' if reward_ok else 'missed'}); "
            f"pending p99 {p99:+.1f} %, SLA violations {sla:+.1f} % (target one >= 20 % lower, neither worse: "
            f"{'met' if tail_ok else 'missed'})**")
    if reference is not None and reference in vals:
        gap = float(vals[reference]["reward_mean"].mean() - vals[ref]["reward_mean"].mean())
        got = float(vals[policy]["reward_mean"].mean() - vals[ref]["reward_mean"].mean())
        text += (f"; share of the {ref} -> {reference} reward gap ({gap:+.4f}) closed: "
                 + (f"{100.0 * got / gap:.0f} %" if gap > 0 else "n/a (the reference is not ahead)"))
    return text


DIGITS = {"reward_mean": 4, "pending_time_p99_s": 1, "sla_violating_pods": 1, "unschedulable": 1}


def report(values: dict[str, dict[str, dict[str, np.ndarray]]], policies: Sequence[str]) -> str:
    lines = ["### Means over seeds\n", "| workload | policy | " + " | ".join(METRICS.values()) + " |",
             "|---|---|" + "---:|" * len(METRICS)]
    for w, vals in values.items():
        for p in sorted(policies, key=lambda q: -float(vals[q]["reward_mean"].mean())):
            cells = [f"{vals[p][m].mean():.{DIGITS[m]}f}" for m in METRICS]
            lines.append(f"| {w} | {p} | " + " | ".join(cells) + " |")
    heur = [p for p in HEURISTICS if p in policies]
    contenders = [p for p in policies if is_model(p)] + ([REFERENCE] if REFERENCE in policies else [])
    if not heur or not contenders:
        return "\n".join(lines)
    reference = REFERENCE if REFERENCE in policies else None
    pool = pooled(values, policies)
    best = best_heuristic(pool, heur)
    lines += ["", f"### All workloads (per seed: mean reward and p99 over workloads, SLA pods and unschedulable "
              f"summed); best heuristic: {best}\n"]
    for p in contenders:
        lines.append(f"- {p} - {best}:")
        lines += comparison_lines(pool, p, best, DIGITS)
        if is_model(p):
            lines.append("  - " + target_line(pool, p, best, reference))
    for w, vals in values.items():
        best_w = best_heuristic(vals, heur)
        lines += ["", f"### {w}: best heuristic {best_w}\n"]
        for p in contenders:
            lines.append(f"- {p} - {best_w}:")
            lines += comparison_lines(vals, p, best_w, DIGITS)
            if is_model(p):
                lines.append("  - " + target_line(vals, p, best_w, reference))
    return "\n".join(lines)


def offered_load(nodes, workload: str, horizon_s: float, seeds: Sequence[int]) -> tuple[float, float]:
    """(cpu, GPU) requested over the run (pod-seconds inside the horizon) / (capacity x horizon), mean over seeds."""
    cpu_cap = sum(n.cpu_milli for n in nodes) * horizon_s
    gpu_cap = sum(n.gpu_count for n in nodes) * 1000.0 * horizon_s
    cpu, gpu = [], []
    for s in seeds:
        pods = synthetic.generate(workload, list(nodes), horizon_s=horizon_s, seed=s)
        live = [min(p.duration, horizon_s - p.creation_time) for p in pods]
        cpu.append(sum(p.cpu_milli * t for p, t in zip(pods, live)) / cpu_cap)
        gpu.append(sum(p.gpu_milli_total * t for p, t in zip(pods, live)) / gpu_cap if gpu_cap else 0.0)
    return float(np.mean(cpu)), float(np.mean(gpu))


def cached_runs(spec: EvalSpec, policies: Sequence[str], seeds: Sequence[int], workers: int,
                cache: str | None) -> list[dict]:
    """``run_all``, each (policy, seed) result kept as a JSON file under ``cache`` and read back from there
    (a long run can be split or resumed: the runs are deterministic)."""
    if not cache:
        return run_all(spec, list(policies), list(seeds), workers)
    folder = Path(cache)
    folder.mkdir(parents=True, exist_ok=True)

    def path(p: str, s: int) -> Path:
        name = f"{spec.workload}_{spec.nodes}_{spec.horizon_s:g}_{p}_{s}"
        return folder / ("".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) + ".json")

    for p in policies:
        missing = [s for s in seeds if not path(p, s).exists()]
        if missing:
            for r in run_all(spec, [p], missing, workers):
                path(p, r["seed"]).write_text(json.dumps({"policy": p, "seed": r["seed"], "metrics": r["metrics"]}))
    return [json.loads(path(p, s).read_text()) for p in policies for s in seeds]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="synthetic:16", help="cluster (default synthetic:16)")
    ap.add_argument("--seeds", default="200-209", help="held-out seeds (default 200-209; training uses others)")
    ap.add_argument("--horizon", type=float, default=600.0, help="simulated seconds per run")
    ap.add_argument("--policies", default=",".join(LEARNED + HEURISTICS + (REFERENCE,)))
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"a subset of {','.join(WORKLOADS)}")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the per-seed values here")
    ap.add_argument("--cache", default=None, help="keep each run's metrics in this folder and reuse them")
    args = ap.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        policies = parse_policies(args.policies)
        workloads = tuple(w for w in args.workloads.split(",") if w)
        if not workloads or set(workloads) - set(WORKLOADS):
            raise ValueError(f"--workloads must name some of {', '.join(WORKLOADS)}, got {args.workloads!r}")
        start = time.perf_counter()
        values, loads = {}, {}
        for w in workloads:
            spec = EvalSpec(protocol="dynamic", workload=f"synthetic:{w}", nodes=args.nodes, horizon_s=args.horizon)
            check_spec(spec)
            values[w] = per_seed(cached_runs(spec, policies, seeds, args.workers, args.cache), policies, seeds)
            loads[w] = offered_load(load_nodes(spec), w, args.horizon, seeds)
    except (EvalError, ValueError, KeyError) as err:
        print(f"pressure_suite: error: {err}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - start
    print(f"## Dynamic protocol under pressure\n\n`{args.nodes}`, horizon {args.horizon:g} s, seeds {args.seeds} "
          f"({len(seeds)}), {len(policies)} policies x {len(workloads)} workloads x {len(seeds)} seeds = "
          f"{len(policies) * len(workloads) * len(seeds)} runs in {wall:.0f} s wall ({args.workers} worker(s)).\n")
    print("Requested load over the run (cpu / GPU, share of capacity x horizon, warm-up included): "
          + "; ".join(f"{w} {c:.2f} / {g:.2f}" for w, (c, g) in loads.items()) + "\n")
    print(report(values, policies))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({w: {p: {m: v.tolist() for m, v in pv.items()} for p, pv in vals.items()}
                       for w, vals in values.items()} | {"seeds": seeds}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
