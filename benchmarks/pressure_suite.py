"""The dynamic protocol under pressure: learned policies against the heuristics, and the headroom placement has.

Every policy runs `agmarl eval`'s dynamic protocol (the same jobs: ``agmarl_cli.evaluate.run_all``) on the
high-pressure synthetic workloads (``sim.synthetic.PRESSURE_VARIANTS``: steady load near capacity, GPU
fragmentation, bursts, node loss; each with its simulator settings, ``synthetic.sim_options``) on one
synthetic cluster, for seeds the trainer never used. Prints Markdown:

- the requested load per resource (cpu, memory, GPU) over the runs;
- per workload and policy, means over seeds: composite reward, pending-time p99, SLA violations (distinct
  LS pods seen on a node above 80 % cpu at a record point), unschedulable pods (pending past the timeout);
- the headroom: each reference against the best heuristic (the best mean reward of reward-aware,
  kube-default and the Trimaran plugins, chosen over all workloads and per workload), paired per seed with
  95 % t intervals. Placement references (``REFERENCES``, ``sim.lookahead``: rollouts on the simulator that
  see its next ticks, arrivals included; 3 candidates x 2 ticks, 8 x 2, 3 x 8) and an admission reference
  (``ADMISSION``: ``capped:reward-aware`` holds pods back instead of placing them, which the composite reward
  scores differently); and where the best heuristic and the upper reference (the placement reference with
  the best mean reward) lose composite points, component by component;
- for each learned policy (``model:*``), per-seed paired differences against the best heuristic, and the
  issue-12 target, met or missed with the figure: reward >= +3 % over the best heuristic, and pending-time
  p99 or SLA violations >= 20 % lower, neither worse; and the share of the gap from the best heuristic to
  the upper reference it closes.

    nice -n 19 .venv/bin/python benchmarks/pressure_suite.py --workers 2 [--json out.json] [--cache DIR]
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

from agmarl_cli.evaluate import (EvalError, EvalSpec, check_spec, dynamic_job, load_nodes, load_workload,
                                 parse_policies, parse_seeds, run_all)
from agmarl_common.core.policies.registry import get_policy, is_model
from agmarl_common.core.reward import RewardWeights
from agmarl_common.core.sim import synthetic
from agmarl_common.core.stats import interval

WORKLOADS = tuple(synthetic.PRESSURE_VARIANTS)
HEURISTICS = ("reward-aware", "kube-default", "trimaran-lvrb", "trimaran-tlp")
REFERENCES = ("lookahead", "lookahead-wide", "lookahead-deep")  # placement references (rollouts see the future)
ADMISSION = ("capped:reward-aware",)  # holds pods back: not a placement, reported for what it trades
LEARNED = ("model:default", "model:models/expert-batch")
METRICS = {"reward_mean": "reward", "pending_time_p99_s": "pending p99 s", "sla_violating_pods": "SLA viol. pods",
           "unschedulable": "unsched."}
# composite points lost per component: weight x (1 - component mean); the SLA weight is split over its four terms
_W = RewardWeights()
LOSS_TERMS = {"utilisation": _W.utilisation, "balance": _W.balance, "pending": _W.sla / 4, "wait": _W.sla / 4,
              "failed": _W.sla / 4, "ls_ok": _W.sla / 4}


def per_seed(runs: list[dict], policies: Sequence[str], seeds: Sequence[int]) -> dict[str, dict[str, np.ndarray]]:
    """policy -> metric -> (seeds,) values, in seed order (``METRICS`` and the reward components of ``LOSS_TERMS``)."""
    by = {(r["policy"], r["seed"]): r["metrics"] for r in runs}
    keys = list(METRICS) + [f"reward_{c}_mean" for c in LOSS_TERMS]
    return {p: {m: np.array([by[(p, s)].get(m, math.nan) for s in seeds], float) for m in keys} for p in policies}


def losses(vals: dict[str, np.ndarray]) -> dict[str, float]:
    """Composite points a policy loses per component (mean over seeds): weight x (1 - component)."""
    return {c: w * (1.0 - float(np.mean(vals[f"reward_{c}_mean"]))) for c, w in LOSS_TERMS.items()}


def pooled(values: dict[str, dict[str, dict[str, np.ndarray]]], policies: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    """Per seed, the mean over workloads (reward, p99) or the sum (SLA pods, unschedulable)."""
    out = {}
    for p in policies:
        out[p] = {}
        for m in METRICS:
            stack = np.stack([values[w][p][m] for w in values])
            out[p][m] = stack.mean(axis=0) if m in ("reward_mean", "pending_time_p99_s") else stack.sum(axis=0)
        for c in LOSS_TERMS:
            out[p][f"reward_{c}_mean"] = np.stack([values[w][p][f"reward_{c}_mean"] for w in values]).mean(axis=0)
    return out


def best_heuristic(vals: dict[str, dict[str, np.ndarray]], heuristics: Sequence[str]) -> str:
    """The policy of ``heuristics`` (or of any group) with the highest mean reward."""
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


def target_line(vals: dict[str, dict[str, np.ndarray]], policy: str, ref: str, references: Sequence[str | None]) -> str:
    """The issue-12 target for ``policy`` against the best heuristic ``ref``, met or missed, and the share of
    the gap to each of ``references`` it closes."""
    c = compare(vals, policy, ref)
    reward_ok = c["reward_mean"]["rel"] >= 3.0
    p99, sla = c["pending_time_p99_s"]["rel"], c["sla_violating_pods"]["rel"]
    tail_ok = (p99 <= -20.0 and sla <= 0.0) or (sla <= -20.0 and p99 <= 0.0)
    text = (f"**{policy}: reward {c['reward_mean']['rel']:+.2f} % (target >= +3 %: {'met' if reward_ok else 'missed'}); "
            f"pending p99 {p99:+.1f} %, SLA violations {sla:+.1f} % (target one >= 20 % lower, neither worse: "
            f"{'met' if tail_ok else 'missed'})**")
    for reference in references:
        if reference is None or reference not in vals:
            continue
        gap = float(vals[reference]["reward_mean"].mean() - vals[ref]["reward_mean"].mean())
        got = float(vals[policy]["reward_mean"].mean() - vals[ref]["reward_mean"].mean())
        text += (f"; share of the {ref} -> {reference} reward gap ({gap:+.4f}) closed: "
                 + (f"{100.0 * got / gap:.0f} %" if gap > 0 else "n/a (the reference is not ahead)"))
    return text


DIGITS = {"reward_mean": 4, "pending_time_p99_s": 1, "sla_violating_pods": 1, "unschedulable": 1}


BEST_OF = "best-of-references"  # per seed, the placement reference with the best reward there (chosen after the fact)


def with_best_of(vals: dict[str, dict[str, np.ndarray]], refs: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    """``vals`` plus ``BEST_OF``: on each seed, every metric of the reference with the best reward on that seed
    (an oracle choice among the references, biased up; only with two or more references)."""
    if len(refs) < 2:
        return vals
    pick = np.argmax(np.stack([vals[r]["reward_mean"] for r in refs]), axis=0)  # (seeds,)
    cols = np.arange(len(pick))
    return vals | {BEST_OF: {m: np.stack([vals[r][m] for r in refs])[pick, cols] for m in vals[refs[0]]}}


def headroom_row(vals: dict[str, dict[str, np.ndarray]], workload: str, upper: str, best: str) -> str:
    """One row of the headroom table: ``upper`` - ``best`` (reward with its CI, p99, SLA, unschedulable)."""
    c = compare(vals, upper, best)
    r = c["reward_mean"]
    return (f"| {workload} | {best} | {upper} | {r['mean']:+.4f} ({r['rel']:+.2f} %; CI {r['low']:+.4f} .. "
            f"{r['high']:+.4f}; {r['better']}/{r['n']}) | {c['pending_time_p99_s']['rel']:+.1f} % | "
            f"{c['sla_violating_pods']['rel']:+.1f} % | {c['unschedulable']['mean']:+.1f} |")


def loss_row(vals: dict[str, dict[str, np.ndarray]], workload: str, policy: str) -> str:
    lost = losses(vals[policy])
    return f"| {workload} | {policy} | " + " | ".join(f"{v:.4f}" for v in lost.values()) + f" | {sum(lost.values()):.4f} |"


def _groups(policies: Sequence[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """(heuristics, placement references, admission references, learned policies) among ``policies``."""
    return ([p for p in HEURISTICS if p in policies], [p for p in REFERENCES if p in policies],
            [p for p in (BEST_OF,) + ADMISSION if p in policies], [p for p in policies if is_model(p)])


def headroom(values: dict[str, dict[str, dict[str, np.ndarray]]], pool: dict[str, dict[str, np.ndarray]],
             policies: Sequence[str]) -> list[str]:
    """Per workload and over all: every reference (placement and admission) against the best heuristic, and
    where the best heuristic and the upper reference lose composite points."""
    heur, refs, adm, _ = _groups(policies)
    lines = ["", "### Headroom: references against the best heuristic (paired per seed, 95 % t intervals; p99 and "
             "SLA: change of the mean; unschedulable: paired mean)\n",
             "| workload | best heuristic | reference | reward | pending p99 | SLA viol. | unsched. |",
             "|---|---|---|---|---:|---:|---:|"]
    rows = [("all", pool)] + list(values.items())
    for w, vals in rows:
        best = best_heuristic(vals, heur)
        lines += [headroom_row(vals, w, r, best) for r in refs + adm]
    lines += ["", "Composite points lost per component (weight x (1 - component), mean over seeds; constraints and "
              "business lose none here):\n",
              "| workload | policy | " + " | ".join(LOSS_TERMS) + " | total |",
              "|---|---|" + "---:|" * (len(LOSS_TERMS) + 1)]
    for w, vals in values.items():
        best = best_heuristic(vals, heur)
        upper = best_heuristic(vals, refs) if refs else best
        lines += [loss_row(vals, w, p) for p in dict.fromkeys([best, upper] + adm)]
    return lines


def report(values: dict[str, dict[str, dict[str, np.ndarray]]], policies: Sequence[str]) -> str:
    lines = ["### Means over seeds\n", "| workload | policy | " + " | ".join(METRICS.values()) + " |",
             "|---|---|" + "---:|" * len(METRICS)]
    for w, vals in values.items():
        for p in sorted(policies, key=lambda q: -float(vals[q]["reward_mean"].mean())):
            cells = [f"{vals[p][m].mean():.{DIGITS[m]}f}" for m in METRICS]
            lines.append(f"| {w} | {p} | " + " | ".join(cells) + " |")
    heur, refs, adm, learned = _groups(policies)
    if not heur:
        return "\n".join(lines)
    pool = pooled(values, policies)
    if refs or adm:
        lines += headroom(values, pool, policies)
    # the upper reference: the placement reference with the best mean reward (over all workloads / per workload)
    for w, vals in [("all workloads (per seed: mean reward and p99 over workloads, SLA pods and unschedulable "
                     "summed)", pool)] + list(values.items()):
        best = best_heuristic(vals, heur)
        upper = best_heuristic(vals, refs) if refs else None
        lines += ["", f"### {w}: best heuristic {best}, upper reference {upper}\n"]
        for p in learned:
            lines.append(f"- {p} - {best}:")
            lines += comparison_lines(vals, p, best, DIGITS)
            lines.append("  - " + target_line(vals, p, best, [upper, BEST_OF]))
    return "\n".join(lines)


def offered_load(nodes, workload: str, horizon_s: float, seeds: Sequence[int]) -> tuple[float, float, float]:
    """(cpu, memory, GPU) requested over the run (pod-seconds inside the horizon) / (capacity x horizon), mean
    over seeds."""
    caps = (sum(n.cpu_milli for n in nodes) * horizon_s, sum(n.memory_mib for n in nodes) * horizon_s,
            sum(n.gpu_count for n in nodes) * 1000.0 * horizon_s)
    shares = []
    for s in seeds:
        pods = synthetic.generate(workload, list(nodes), horizon_s=horizon_s, seed=s)
        live = [min(p.duration, horizon_s - p.creation_time) for p in pods]
        asked = [sum(getattr(p, f) * t for p, t in zip(pods, live))
                 for f in ("cpu_milli", "memory_mib", "gpu_milli_total")]
        shares.append([a / c if c else 0.0 for a, c in zip(asked, caps)])
    cpu, mem, gpu = np.mean(shares, axis=0)
    return float(cpu), float(mem), float(gpu)


class CandidateCount:
    """``policy`` unchanged, counting the feasible candidates of every placement it scores."""

    def __init__(self, policy):
        self.policy, self.name, self.counts = policy, policy.name, []

    def score(self, pod, state, candidates):
        self.counts.append(len(candidates))
        return self.policy.score(pod, state, candidates)

    def choose_gpus(self, pod, state, node_index):
        return self.policy.choose_gpus(pod, state, node_index)


def placement_freedom(spec: EvalSpec, seeds: Sequence[int], policy: str = "reward-aware") -> tuple[float, float, int]:
    """How much choice placement has: over ``policy``'s runs, the share of its placements with one feasible
    node only, the mean number of feasible nodes, and the placements counted."""
    nodes, counts = load_nodes(spec), []
    for s in seeds:
        counter = CandidateCount(get_policy(policy, s))
        dynamic_job(spec, nodes, load_workload(spec, nodes, s), counter, s)  # the job `agmarl eval` runs
        counts += counter.counts
    c = np.asarray(counts, float)
    return float((c == 1).mean()) if c.size else math.nan, float(c.mean()) if c.size else math.nan, int(c.size)


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
    ap.add_argument("--policies", default=",".join(LEARNED + HEURISTICS + REFERENCES + ADMISSION))
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"a subset of {','.join(WORKLOADS)}")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the per-seed values here")
    ap.add_argument("--cache", default=None, help="keep each run's metrics in this folder and reuse them")
    ap.add_argument("--freedom", action="store_true",
                    help="also count reward-aware's feasible candidates per placement (runs it again, ~1 s a run)")
    args = ap.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        policies = parse_policies(args.policies)
        workloads = tuple(w for w in args.workloads.split(",") if w)
        if not workloads or set(workloads) - set(WORKLOADS):
            raise ValueError(f"--workloads must name some of {', '.join(WORKLOADS)}, got {args.workloads!r}")
        start = time.perf_counter()
        values, loads, freedom = {}, {}, {}
        for w in workloads:
            spec = EvalSpec(protocol="dynamic", workload=f"synthetic:{w}", nodes=args.nodes, horizon_s=args.horizon)
            check_spec(spec)
            values[w] = with_best_of(per_seed(cached_runs(spec, policies, seeds, args.workers, args.cache), policies,
                                              seeds), [p for p in REFERENCES if p in policies])
            loads[w] = offered_load(load_nodes(spec), w, args.horizon, seeds)
            if args.freedom:
                freedom[w] = placement_freedom(spec, seeds)
    except (EvalError, ValueError, KeyError) as err:
        print(f"pressure_suite: error: {err}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - start
    print(f"## Dynamic protocol under pressure\n\n`{args.nodes}`, horizon {args.horizon:g} s, seeds {args.seeds} "
          f"({len(seeds)}), {len(policies)} policies x {len(workloads)} workloads x {len(seeds)} seeds = "
          f"{len(policies) * len(workloads) * len(seeds)} runs in {wall:.0f} s wall ({args.workers} worker(s)).\n")
    print("Requested load over the run (cpu / memory / GPU, share of capacity x horizon, warm-up included): "
          + "; ".join(f"{w} {c:.2f} / {m:.2f} / {g:.2f}" for w, (c, m, g) in loads.items()) + "\n")
    if freedom:
        print("Placement freedom (reward-aware's placements: share with a single feasible node; mean feasible nodes): "
              + "; ".join(f"{w} {one:.0%} single, {mean:.1f} nodes ({n} placements)"
                          for w, (one, mean, n) in freedom.items()) + "\n")
    print(report(values, list(policies) + ([BEST_OF] if BEST_OF in next(iter(values.values())) else [])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({w: {p: {m: v.tolist() for m, v in pv.items()} for p, pv in vals.items()}
                       for w, vals in values.items()} | {"seeds": seeds}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
