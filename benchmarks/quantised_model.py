"""The INT8 variant against the float model it was quantised from: GPU allocation and scoring latency, one run.

- allocation: the openb inflation protocol as ``agmarl eval --protocol inflation --workload openb:default
  --nodes openb:all`` runs it (``sim.inflation.run_inflation``, tune 1.3, node-order ties), GPU allocation
  at 100 % arrived, per seed for both models; the paired difference int8 - float with a 95 % t interval.
  The float run also scores every pod with the int8 model (its own picks are the float ones, so the
  trajectory is the float run's): the share of decisions where the int8 pick is the float pick.
- latency: ``agmarl bench latency`` (one pending pod scored on 1,523 and 5,000 openb nodes, ONNX Runtime
  on one pinned core, steady state) for both models in this process, alternating (``bench.compare_latency``):
  the ratio int8 / float of p50 and p99 wall time and of the scoring thread's CPU time, median over rounds.

    nice .venv/bin/python benchmarks/quantised_model.py [--float default] [--int8 default-int8] \\
        [--seeds 42-51] [--nodes 1523,5000] [--steps 1000] [--warmup 300] [--rounds 2] [--json out.json]

Models are ``model:<ref>`` references (a folder or a version on disk; signed and trusted as everywhere:
``AGMARL_TRUSTED_MODEL_KEYS``, ``AGMARL_ALLOWED_MODEL_DIRS``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from agmarl_cli.bench import BenchSpec, compare_latency, start_state
from agmarl_cli.eval_spec import EvalSpec, load_nodes, load_workload, parse_seeds
from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.policies.base import PolicyBase
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import traces
from agmarl_common.core.sim.inflation import run_inflation
from agmarl_common.core.stats import interval

SPEC = EvalSpec(protocol="inflation", workload="openb:default", nodes="openb:all")


class AgreementProbe(PolicyBase):
    """Scores with ``ref`` (so the run is ``ref``'s) and also with ``other``; counts the decisions where
    both pick the same candidate (argmax, first on ties) and, where they differ, ``ref``'s logit margin."""

    def __init__(self, ref, other):
        self.ref, self.other, self.name = ref, other, ref.name
        self.decisions = self.agree = 0
        self.margins: list[float] = []

    def set_objective(self, objective: str) -> None:
        self.ref.set_objective(objective)
        self.other.set_objective(objective)

    def observe_workload(self, pods) -> None:
        self.ref.observe_workload(pods)
        self.other.observe_workload(pods)

    def score(self, pod, state, candidates):
        s = self.ref.score(pod, state, candidates)
        o = self.other.score(pod, state, candidates)
        a, b = int(np.argmax(s)), int(np.argmax(o))
        self.decisions += 1
        self.agree += int(a == b)
        if a != b:
            self.margins.append(float(s[a] - s[b]))
        return s

    def choose_gpus(self, pod, state, node_index):
        return self.ref.choose_gpus(pod, state, node_index)


def allocation(float_ref: str, int8_ref: str, seeds: list[int]) -> dict:
    nodes = load_nodes(SPEC)
    rows = []
    for seed in seeds:
        pods = load_workload(SPEC, nodes, seed)
        t0 = time.monotonic()
        probe = AgreementProbe(get_policy(f"model:{float_ref}", seed), get_policy(f"model:{int8_ref}", seed))
        a_float = float(run_inflation(nodes, pods, probe, np.random.default_rng(seed), ratio=SPEC.ratio,
                                      tie_break=SPEC.tie_break).allocation_curve()[100])
        a_int8 = float(run_inflation(nodes, pods, get_policy(f"model:{int8_ref}", seed), np.random.default_rng(seed),
                                     ratio=SPEC.ratio, tie_break=SPEC.tie_break).allocation_curve()[100])
        row = {"seed": seed, "float": round(a_float, 3), "int8": round(a_int8, 3), "diff": round(a_int8 - a_float, 3),
               "decisions": probe.decisions, "agreement": round(probe.agree / max(probe.decisions, 1), 4),
               "margin_median": round(float(np.median(probe.margins)), 3) if probe.margins else 0.0,
               "seconds": round(time.monotonic() - t0, 1)}
        print(f"  seed {seed}: float {row['float']:.2f} %, int8 {row['int8']:.2f} % ({row['diff']:+.2f} pp); "
              f"same pick on {100 * row['agreement']:.1f} % of {row['decisions']} decisions "
              f"(float logit margin where they differ: median {row['margin_median']}) [{row['seconds']} s]", flush=True)
        rows.append(row)
    mean, _, high = interval([r["diff"] for r in rows])
    half = high - mean
    total = sum(r["decisions"] for r in rows)
    return {"seeds": seeds, "rows": rows, "float_mean": round(float(np.mean([r["float"] for r in rows])), 3),
            "int8_mean": round(float(np.mean([r["int8"] for r in rows])), 3), "diff_mean": round(mean, 3),
            "diff_ci95": round(half, 3),
            "agreement": round(sum(r["agreement"] * r["decisions"] for r in rows) / max(total, 1), 4)}


def graph_cpu_ms(float_ref: str, int8_ref: str, n_nodes: int, reps: int = 30, rounds: int = 3) -> dict:
    """The graphs alone: CPU ms (median) of a full encoder pass over the ``n_nodes`` cluster of ``agmarl bench
    latency`` and of the actor over one pod's candidates, for each model, alternating, on the same inputs."""
    state, rng = start_state(n_nodes, 2 * n_nodes, 0)
    workload = traces.load_openb_pods(traces.openb_pod_path("default"))
    pod = replace(workload[int(rng.integers(len(workload)))], name="graph-bench")
    cand = feasible_nodes(pod, state)
    policies = {"float": get_policy(f"model:{float_ref}"), "int8": get_policy(f"model:{int8_ref}")}
    for p in policies.values():
        p.observe_workload(workload)
    g = policies["float"].graph([pod], state, [cand])
    times: dict[str, dict[str, list[float]]] = {k: {"encoder": [], "actor": []} for k in policies}
    feeds = {"node_x": g.node_x, "nn_edge_index": g.nn_edge_index}
    for _ in range(rounds):
        for k, p in policies.items():
            for _ in range(reps):
                c0 = time.thread_time()
                emb = p.encoder.run(None, feeds)[0]
                c1 = time.thread_time()
                p.run_actor(emb, g)
                times[k]["encoder"].append(c1 - c0)
                times[k]["actor"].append(time.thread_time() - c1)
    out = {k: {part: round(1e3 * float(np.median(v)), 3) for part, v in t.items()} for k, t in times.items()}
    out["candidates"] = int(cand.size)
    out["ratio"] = {part: round(out["int8"][part] / out["float"][part], 3) for part in ("encoder", "actor")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--float", dest="float_ref", default="default", help="the float model (model:<ref>)")
    ap.add_argument("--int8", dest="int8_ref", default="default-int8", help="its INT8 variant (model:<ref>)")
    ap.add_argument("--seeds", default="42-51", help="A-B inclusive or a comma list")
    ap.add_argument("--nodes", default="1523,5000", help="latency: cluster sizes ('' = no latency part)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2, help="latency: alternating runs of each model")
    ap.add_argument("--skip-allocation", action="store_true")
    ap.add_argument("--json", default=None, metavar="OUT.json")
    args = ap.parse_args()
    report: dict = {"float": args.float_ref, "int8": args.int8_ref}
    if not args.skip_allocation:
        print(f"allocation: openb inflation, default pods, 1,523 nodes, GPU allocation at 100 % arrived "
              f"(model:{args.float_ref} vs model:{args.int8_ref})", flush=True)
        a = report["allocation"] = allocation(args.float_ref, args.int8_ref, parse_seeds(args.seeds))
        print(f"allocation over seeds {args.seeds}: float {a['float_mean']:.3f} %, int8 {a['int8_mean']:.3f} %, "
              f"int8 - float {a['diff_mean']:+.3f} pp (95 % CI +-{a['diff_ci95']:.3f}); same pick on "
              f"{100 * a['agreement']:.1f} % of decisions", flush=True)
    report["latency"] = {}
    for n in [int(x) for x in args.nodes.split(",") if x]:
        spec = BenchSpec(nodes=n, batch=1, model=args.float_ref, steps=args.steps, warmup=args.warmup)
        c = compare_latency(spec, args.int8_ref, args.rounds)
        report["latency"][n] = c
        b, o, r = c["base"][-1], c["other"][-1], c["ratio"]
        print(f"latency, 1 pod on {n} nodes ({b['candidates_mean']:.0f} candidates, {args.rounds} rounds of "
              f"{args.steps} steps): float p50 {b['p50_ms']} / p99 {b['p99_ms']} ms, int8 p50 {o['p50_ms']} / p99 "
              f"{o['p99_ms']} ms (last round); int8/float p50 {r['p50_ms']}, p99 {r['p99_ms']}, CPU p50 "
              f"{r['cpu_p50_ms']}, CPU p99 {r['cpu_p99_ms']} (load average {o['load_avg_1m']})", flush=True)
        gt = c["graphs"] = graph_cpu_ms(args.float_ref, args.int8_ref, n)
        print(f"  the graphs alone on {n} nodes ({gt['candidates']} candidates, CPU ms, median): full encoder pass "
              f"float {gt['float']['encoder']}, int8 {gt['int8']['encoder']} (x{gt['ratio']['encoder']}); actor "
              f"float {gt['float']['actor']}, int8 {gt['int8']['actor']} (x{gt['ratio']['actor']})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
