"""How far above a policy any placement could reach on the openb inflation target: an upper reference per seed.

Issue 12's target is GPU allocation at 100 % arrived >= 96.0 % (openb default pod list, the full 1,523-node
cluster). This prints, for each seed's arrival sequence (the ``agmarl eval --protocol inflation`` run's own:
``sim.inflation.plan`` with that seed), the most GPU milli any placement of the pods arrived by the end of the
100 % bin could allocate, as a % of capacity (``sim.optimum.device_ceiling``: devices as 1000-milli bins, CPU,
memory, GPU models and node boundaries left out, so it is a loose ceiling; the shares' bin packing solved
exactly by HiGHS):

- ``free``: any placement, pods dropped at will (an offline packer may leave out a share that wastes a device);
- ``must P``: placements that place every pod arriving before P % of the capacity has arrived. The protocol
  drops a pod only when no node can take it, so a placer that has not filled the cluster by then places all of
  them: the column applies to a policy whose first dropped pod arrived after P % (printed per run as "first
  drop").

With ``--policies`` each policy runs the seed in-process (``run_inflation``, as ``agmarl eval`` does) and the
summary gives its mean allocation at 100 % and how much of the way from it to each ceiling ``--target`` is.

    .venv/bin/python benchmarks/inflation_ceiling.py [--workload default] [--seeds 42-51] [--must 90,95] \\
        [--policies fgd,model:default] [--target 96.0] [--workers 2] [--json out.json] [--detail]

``--detail`` also prints, per seed, the one-GPU share sizes arrived by 100 % and, per policy, the milli its
devices holding shares leave empty, by what each device holds (e.g. ``810 x965``: 965 devices each holding one
810-milli share).
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from agmarl_cli.eval_spec import EvalSpec, load_nodes, load_workload, parse_seeds, resolve_policy
from agmarl_common.core.cluster.model import GPU_MILLI
from agmarl_common.core.sim.inflation import InflationResult, arrived_bins, plan, run_inflation
from agmarl_common.core.sim.optimum import device_ceiling


@dataclass(frozen=True)
class Job:
    workload: str
    seed: int
    policy: str  # "" = the ceilings
    must: tuple[float, ...]


def run(job: Job) -> dict:
    spec = EvalSpec(protocol="inflation", workload=f"openb:{job.workload}", nodes="openb:all")
    nodes = load_nodes(spec)
    pods = load_workload(spec, nodes, job.seed)
    t0 = time.process_time()
    if job.policy:
        res = run_inflation(nodes, pods, resolve_policy(job.policy, job.seed), np.random.default_rng(job.seed),
                            ratio=spec.ratio, tie_break=spec.tie_break)
        dropped = np.flatnonzero(res.node_index < 0)
        first = 100.0 * res.arrived_milli[dropped[0] + 1] / res.total_gpu_milli if dropped.size else float("nan")
        return {"alloc": float(res.allocation_curve()[100]), "first_drop_pct": round(float(first), 2),
                "waste": waste_by_device(res), "cpu_s": time.process_time() - t0}
    arrivals, _ = plan(nodes, pods, np.random.default_rng(job.seed), spec.ratio, spec.tie_break)
    devices = sum(nd.gpu_count for nd in nodes)
    total = devices * GPU_MILLI
    arrived = np.cumsum([p.gpu_milli_total for p in arrivals])
    upto = int((arrived_bins(arrived, total) <= 100).sum())  # the pods arrived by the last event of the 100 % bin
    shares = Counter(p.gpu_milli for p in arrivals[:upto] if p.num_gpu == 1 and 0 < p.gpu_milli < GPU_MILLI)
    out: dict = {"shares": {str(milli): n for milli, n in sorted(shares.items())}}
    for label, pct in [("free", None)] + [(f"must {m:g}", m) for m in job.must]:
        must = 0 if pct is None else int((arrived <= pct / 100 * total).sum())
        c = device_ceiling(arrivals[:upto], devices, must_place=must)
        infeasible = c.status == "Infeasible"  # more pods must be placed than any packing holds
        out[label] = float("nan") if infeasible else round(100.0 * c.bound_milli / total, 3)
        out[label + " status"] = c.status
    out["cpu_s"] = time.process_time() - t0
    return out


def waste_by_device(res: InflationResult, top: int = 8) -> list[tuple[str, int, int]]:
    """The devices holding shares after the last event of the 100 % bin, by what they hold: (shares on the device,
    devices holding them, milli left empty on them), the most milli left empty first."""
    upto = int((arrived_bins(res.arrived_milli[1:], res.total_gpu_milli) <= 100).sum())
    arrived = {p.name for p in res.pods[:upto]}
    held: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, pods in enumerate(res.state.bound):
        for p in pods:
            if p.name in arrived and 0 < p.gpu_milli < GPU_MILLI:
                for d in p.gpu_devices:
                    held[i, d].append(p.gpu_milli)
    kinds = Counter(tuple(sorted(v, reverse=True)) for v in held.values())
    rows = [("+".join(map(str, k)), n, n * (GPU_MILLI - sum(k))) for k, n in kinds.items()]
    return sorted(rows, key=lambda r: -r[2])[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="default", help="openb pod list")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--must", default="90,95", help="%% arrived before which every pod must be placed")
    ap.add_argument("--policies", default="", help="comma list run in-process beside the ceilings")
    ap.add_argument("--target", type=float, default=96.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--json", help="write the per-seed figures and the summary here")
    ap.add_argument("--detail", action="store_true",
                    help="also print each seed's one-GPU share sizes and where each policy leaves milli empty")
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    must = tuple(float(x) for x in args.must.split(",") if x.strip())
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    jobs = [Job(args.workload, s, p, must) for s in seeds for p in [""] + policies]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        results = dict(zip(jobs, pool.map(run, jobs)))
    labels = ["free"] + [f"must {m:g}" for m in must]
    print(f"openb:{args.workload} on openb:all, GPU allocation at 100 % arrived (% of capacity); ceilings from "
          f"sim.optimum.device_ceiling (devices as bins; CPU, memory, models, nodes left out)")
    print("seed  " + "  ".join(f"{lb:>9}" for lb in labels) + "".join(f"  {p:>16} (first drop)" for p in policies))
    table: dict[int, dict] = {}
    for s in seeds:
        ceil = results[Job(args.workload, s, "", must)]
        row = {lb: ceil[lb] for lb in labels} | {"shares": ceil["shares"]}
        line = f"{s:<5} " + "  ".join(f"{ceil[lb]:9.3f}" for lb in labels)
        for p in policies:
            r = results[Job(args.workload, s, p, must)]
            row[p] = r
            line += f"  {r['alloc']:16.2f} ({r['first_drop_pct']:6.2f} %)"
        table[s] = row
        print(line)
    for s in seeds if args.detail else []:
        shares = table[s]["shares"]
        print(f"seed {s}: {sum(shares.values())} one-GPU shares arrived by 100 %, by milli: "
              + ", ".join(f"{k} x{n}" for k, n in shares.items()))
        for p in policies:
            print(f"  {p}: milli left empty on devices holding shares, by what they hold: "
                  + ", ".join(f"{k} x{n} = {w:,}" for k, n, w in table[s][p]["waste"]))
    summary: dict[str, dict] = {}
    means = {lb: float(np.mean([table[s][lb] for s in seeds])) for lb in labels}
    print("mean  " + "  ".join(f"{means[lb]:9.3f}" for lb in labels))
    for p in policies:
        alloc = float(np.mean([table[s][p]["alloc"] for s in seeds]))
        first = float(np.min([table[s][p]["first_drop_pct"] for s in seeds]))
        shares = {lb: (args.target - alloc) / (means[lb] - alloc) if means[lb] > alloc else float("nan")
                  for lb in labels}
        summary[p] = {"alloc": alloc, "earliest_first_drop_pct": first, "target_share_of_gap": shares}
        print(f"{p}: mean {alloc:.3f} %, earliest first drop at {first:.2f} % arrived; the target {args.target:g} % is "
              + ", ".join(f"{100 * shares[lb]:.0f} % of the way to '{lb}' ({means[lb]:.2f})" for lb in labels))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seeds": {str(s): table[s] for s in seeds}, "ceilings": means, "policies": summary,
                       "target": args.target}, f, indent=1)


if __name__ == "__main__":
    main()
