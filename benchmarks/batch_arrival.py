"""Batch-arrival protocol (``agmarl_common.core.sim.batches``): joint placement vs sequential FGD, sequential
model and the offline optimum (issue 12, items 3 and 4).

Per seed: an openb sub-cluster of ``--nodes`` GPU nodes, openb pods inflated to 1.3 x its GPU capacity and
cut into groups of 16-128, each group placed before the next arrives, nothing departs. Placers, all on the
same groups:

- ``seq:fgd``            one pod at a time in arrival order, FGD (the inflation protocol per group);
- ``seq:model:default``  the same with the shipped learned model (ONNX Runtime);
- ``joint:fgd``          ``policies.joint.JointPlacer``: the whole group at once, the best of ``--orders``
                         placement orders by GPU milli placed, then GPU milli an imagined next group
                         (``--lookahead`` pods drawn from the pod list) would still place, then fragmentation;
                         work-conserving (every pod that fits at its turn is placed);
- ``scenario:fgd``       ``policies.joint.ScenarioPlacer``: the whole group at once, choosing which pods to place
                         and where: the sequential and largest-first placements and ``--plans`` first-fit-
                         decreasing packings of the group with an imagined future (``--plan-fill`` x the free
                         GPU milli), judged by GPU milli placed plus what ``--evals`` other imagined futures
                         (``--eval-fill`` x the free GPU milli) still place; it may leave pods out (admission);
- ``switch:fgd``         ``policies.joint.SwitchPlacer``: ``joint:fgd`` while the sequential placement of the group
                         on a copy places every pod that fits the cluster alone (nothing is held back while the
                         cluster can take everything pending), the scenario placement otherwise, judged by GPU
                         milli placed first (``--overflow-weight`` x what imagined futures place: 0 by default);
- ``knapsack:fgd``       ``SwitchPlacer(exact=True)``: ``switch:fgd`` (groups that fit placed whole, one by one by
                         FGD) with, in a group that overflows, the exact knapsack among the candidates: one MIP
                         (``policies.packing.pack_group``, HiGHS, at most 200 branch-and-bound nodes) placing the
                         most GPU milli of the group on the cluster as it is; ``--pack-fitting`` also packs the
                         groups that fit by a MIP (every pod placed, fewest free devices opened, CPU kept beside
                         whole GPUs: tried, it lost);
- ``planned:fgd``        ``SwitchPlacer(exact=True, fit=WholePlanning(...))``: ``knapsack:fgd`` whose groups that fit
                         are placed whole by a plan: besides FGD's sequential placement, ``--fit-plans`` MIPs
                         (``policies.packing.pack_group``) each placing every pod of the group together with the
                         most GPU milli of an imagined future (pods drawn from the pod list, 1.0 x the GPU milli
                         free after the group, reduced to the most common pod per GPU request), the group's pods
                         kept where that packing puts them; the candidate after which ``--fit-evals`` other
                         imagined futures pack the most GPU milli (first-fit-decreasing, FGD) is bound. Every
                         candidate places every pod of the group and keeps room for as many multi-GPU pods as
                         FGD's placement; later groups meet a different cluster, so its safety at other loads
                         is measured (``--ratio``), not given; ``--fit-judge-all`` judges on futures with the
                         multi-GPU pods too instead of refusing plans that leave less room for them (not the
                         default: it dropped an 8-GPU pod at 0.8 x, docs/evaluation.md); ``--fit-pod-floor K``
                         refuses a plan after which fewer nodes than min(K, before the group) take one of the
                         workload's multi-GPU pod shapes; ``--fit-plan-all`` plans against futures with them too;
- ``optimum``            the offline ceiling (``sim.optimum``, HiGHS MIP): the most GPU milli any placement of
                         all the run's pods allocates; started from the best heuristic's final cluster,
                         ``--time-limit`` s per seed: when not proven optimal the best value found and the
                         proven bound are both reported.

Prints the GPU allocation (% of capacity after the last group) and pods placed per placer, the paired
per-seed differences with 95 % t intervals, and the share of the sequential-FGD -> optimum gap the joint
placers close (against the optimum found and against the proven bound: the share lies between).
Also printed: ``sliver_ceiling``, a loose upper bound on what a safe placer (one that places every pod of
the groups arriving before the demand passes the capacity) can allocate. ``--ratio`` changes the load (1.3 x capacity by default; below 1 everything could fit); ``--placers`` runs a
subset (seq:fgd is always run: the differences are against it).

    nice -n 19 .venv/bin/python benchmarks/batch_arrival.py --seeds 110-121
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Sequence

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.policies.fgd import FgdPolicy
from agmarl_common.core.policies.joint import (DEFAULT_EVAL_FILL, DEFAULT_EVALS, DEFAULT_ORDERS, DEFAULT_PLAN_FILL,
                                              DEFAULT_PLANS, JointPlacer, ScenarioPlacer, SwitchPlacer, WholePlanning)
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import catalog
from agmarl_common.core.sim.batches import BatchPlan, BatchResult, SequentialPlacer, apply_binds, plan_batches, run_batches
from agmarl_common.core.sim.optimum import max_gpu_packing
from agmarl_common.core.stats import interval

def paired(diffs: Sequence[float]) -> str:
    d = np.asarray(diffs, float)
    if len(d) < 2:
        return f"{d.mean():+.2f} pp (one seed)"
    mean, low, high = interval(d)
    return f"{mean:+.2f} pp (95 % CI {low:+.2f} .. {high:+.2f}), ahead on {int((d > 0).sum())}/{len(d)} seeds"


class ClairvoyantJoint(JointPlacer):
    """``JointPlacer`` whose rollout is the run's real next group instead of an imagined one: a reference
    for how much better prediction of the next arrivals could add (not a placer a scheduler can run)."""

    def __init__(self, plan: BatchPlan, policy, orders: int, seed: int):
        super().__init__(policy, orders=orders, seed=seed, lookahead=1)
        self.plan, self.group = plan, 0
        self.name = f"joint:{policy.name}:clairvoyant"

    def imagined(self) -> list[Pod]:
        return list(self.plan.groups[self.group + 1]) if self.group + 1 < len(self.plan.groups) else []

    def place_group(self, group, state, rank):
        out = super().place_group(group, state, rank)
        self.group += 1
        return out


def offline_packing(plan: BatchPlan, workload: Sequence[Pod], seed: int) -> ClusterState:
    """All the run's GPU pods placed at once knowing them all (the joint placer's orders, no lookahead):
    a strong first incumbent for the optimum."""
    pods = [p for p in plan.pods if p.num_gpu > 0]
    placer = JointPlacer(FgdPolicy(seed), orders=4, seed=seed, lookahead=0)
    placer.observe_workload(workload)
    state = ClusterState.empty(plan.nodes)
    return apply_binds(pods, placer.place_group(pods, state, plan.rank), state)


def sliver_ceiling(plan: BatchPlan) -> float:
    """An upper bound (% of GPU capacity) on the allocation of a placer that places every pod of the groups
    arriving before the GPU milli arrived passes the capacity (a safe placer must, where they fit): each
    share of more than 800 milli among those pods leaves less than 200 milli on its device, which only the
    run's shares of at most 1000 - milli can fill (a loose bound: the other shares' leftovers, CPU and
    memory are ignored)."""
    cap = plan.total_gpu_milli
    arrived = np.cumsum([sum(p.gpu_milli_total for p in g) for g in plan.groups])
    must = [p for g in plan.groups[:int((arrived <= cap).sum())] for p in g]
    left = sum(1000 - p.gpu_milli for p in must if p.is_gpu_share and p.gpu_milli > 800)
    fill = sum(p.gpu_milli for p in plan.pods if p.is_gpu_share and p.gpu_milli < 200)  # at best all of them
    return 100.0 * (1 - max(0, left - fill) / cap)


def parse_seeds(text: str) -> list[int]:
    if "-" in text and "," not in text:
        lo, hi = (int(x) for x in text.split("-", 1))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="110-121")
    ap.add_argument("--workload", default="openb:default")
    ap.add_argument("--nodes", type=int, default=40, help="sub-cluster size (the optimum is for <= 50)")
    ap.add_argument("--orders", type=int, default=DEFAULT_ORDERS)
    ap.add_argument("--lookahead", type=int, default=64)
    ap.add_argument("--plans", type=int, default=DEFAULT_PLANS)
    ap.add_argument("--evals", type=int, default=DEFAULT_EVALS)
    ap.add_argument("--plan-fill", type=float, default=DEFAULT_PLAN_FILL)
    ap.add_argument("--eval-fill", type=float, default=DEFAULT_EVAL_FILL)
    ap.add_argument("--ratio", type=float, default=1.3, help="GPU requests arriving, x the sub-cluster's capacity")
    ap.add_argument("--no-optimum", action="store_true", help="skip the MIP (the share of the gap is not printed)")
    ap.add_argument("--time-limit", type=float, default=20.0, help="HiGHS seconds per seed")
    ap.add_argument("--no-model", action="store_true", help="leave out seq:model:default")
    ap.add_argument("--no-clairvoyant", action="store_true", help="leave out the clairvoyant reference")
    ap.add_argument("--overflow-weight", type=float, default=0.0, help="switch:fgd's weight of imagined futures")
    ap.add_argument("--pack-fitting", action="store_true", help="knapsack:fgd also packs the groups that fit by a MIP")
    ap.add_argument("--fit-plans", type=int, default=2, help="planned:fgd's plans per group that fits")
    ap.add_argument("--fit-evals", type=int, default=WholePlanning.evals, help="planned:fgd's judging futures")
    ap.add_argument("--fit-judge-all", action="store_true",
                    help="planned:fgd judges on futures with multi-GPU pods too instead of refusing plans by whole_room")
    ap.add_argument("--fit-pod-floor", type=int, default=WholePlanning.pod_floor,
                    help="refuse a plan after which fewer nodes than min(this, before the group) take a multi-GPU pod")
    ap.add_argument("--fit-plan-all", action="store_true",
                    help="planned:fgd plans against futures with multi-GPU pods too (tried, not kept)")
    ap.add_argument("--placers", default="", help="comma-separated subset of the placers (seq:fgd always runs)")
    ap.add_argument("--json", default="", help="write per-seed figures here")
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    nodes = catalog.cluster_nodes("openb")
    workload = catalog.openb_pods(args.workload)
    names = (["seq:fgd"] + ([] if args.no_model else ["seq:model:default"])
             + ["joint:fgd", "scenario:fgd", "switch:fgd", "knapsack:fgd", "planned:fgd"] + ([] if args.no_clairvoyant else ["joint:fgd:clairvoyant"]))
    if args.placers:
        keep = set(args.placers.split(",")) | {"seq:fgd"}
        names = [n for n in names if n in keep]
    alloc: dict[str, list[float]] = {n: [] for n in names + ["optimum", "optimum bound"]}
    ceiling: list[float] = []
    pods: dict[str, list[int]] = {n: [] for n in names}
    secs: dict[str, float] = {n: 0.0 for n in names + ["optimum"]}
    proven = 0
    rows = []
    for seed in seeds:
        plan = plan_batches(nodes, workload, np.random.default_rng(seed), n_nodes=args.nodes, ratio=args.ratio)
        ceiling.append(sliver_ceiling(plan))
        placers = {"seq:fgd": SequentialPlacer(FgdPolicy(seed)),
                   "joint:fgd": JointPlacer(FgdPolicy(seed), orders=args.orders, seed=seed, lookahead=args.lookahead),
                   "scenario:fgd": ScenarioPlacer(FgdPolicy(seed), seed=seed, plans=args.plans, evals=args.evals,
                                                  plan_fill=args.plan_fill, eval_fill=args.eval_fill),
                   "switch:fgd": SwitchPlacer(FgdPolicy(seed), seed=seed, orders=args.orders, lookahead=args.lookahead,
                                              plans=args.plans, evals=args.evals, plan_fill=args.plan_fill,
                                              eval_fill=args.eval_fill, overflow_weight=args.overflow_weight),
                   "knapsack:fgd": SwitchPlacer(FgdPolicy(seed), seed=seed, orders=args.orders, lookahead=args.lookahead,
                                                plans=args.plans, evals=args.evals, plan_fill=args.plan_fill,
                                                eval_fill=args.eval_fill, overflow_weight=args.overflow_weight, exact=True,
                                                pack_fitting=args.pack_fitting),
                   "planned:fgd": SwitchPlacer(FgdPolicy(seed), seed=seed, orders=args.orders, lookahead=args.lookahead,
                                               plans=args.plans, evals=args.evals, plan_fill=args.plan_fill,
                                               eval_fill=args.eval_fill, overflow_weight=args.overflow_weight, exact=True,
                                               fit=WholePlanning(plans=args.fit_plans, evals=args.fit_evals,
                                                                 keep_room=not args.fit_judge_all,
                                                                 judge_all=args.fit_judge_all,
                                                                 pod_floor=args.fit_pod_floor,
                                                                 plan_all=args.fit_plan_all))}
        if not args.no_clairvoyant:
            placers["joint:fgd:clairvoyant"] = ClairvoyantJoint(plan, FgdPolicy(seed), args.orders, seed)
        if "seq:model:default" in names:
            placers["seq:model:default"] = SequentialPlacer(get_policy("model:default", seed))
        results: dict[str, BatchResult] = {}
        for name in names:
            t0 = time.process_time()
            results[name] = run_batches(plan, placers[name], workload)
            secs[name] += time.process_time() - t0
            alloc[name].append(results[name].allocation)
            pods[name].append(int(results[name].placed_pods[-1]))
        if not args.no_optimum:
            t0 = time.process_time()
            starts = [r.state for r in results.values()] + [offline_packing(plan, workload, seed)]
            best = max(starts, key=lambda s: int(s.gpu_used.sum()))
            opt = max_gpu_packing(plan.nodes, plan.pods, args.time_limit, start=best)
            secs["optimum"] += time.process_time() - t0
            proven += opt.optimal
            alloc["optimum"].append(100.0 * opt.value_milli / plan.total_gpu_milli)
            alloc["optimum bound"].append(100.0 * opt.bound_milli / plan.total_gpu_milli)
            status = opt.status
        else:
            alloc["optimum"].append(float("nan"))
            alloc["optimum bound"].append(float("nan"))
            status = "not run"
        row = {"seed": seed, "pods": len(plan.pods), "groups": [len(g) for g in plan.groups],
               "gpu_milli": plan.total_gpu_milli, **{n: round(alloc[n][-1], 3) for n in alloc},
               "optimum_status": status}
        rows.append(row)
        print(f"seed {seed}: {len(plan.pods)} pods in {len(plan.groups)} groups, "
              + ", ".join(f"{n} {alloc[n][-1]:.2f}" for n in alloc) + f" ({status})", flush=True)

    print(f"\n### Batch arrivals, {args.workload}, {args.nodes}-node openb sub-clusters, seeds {args.seeds}\n")
    print("| placer | GPU allocation after the last group, % (mean ± std) | pods placed (mean) | CPU s per run |")
    print("|---|---|---|---|")
    for n in names:
        print(f"| {n} | {np.mean(alloc[n]):.2f} ± {np.std(alloc[n]):.2f} | {np.mean(pods[n]):.1f} "
              f"| {secs[n] / len(seeds):.2f} |")
    print(f"| optimum (best found; GPU pods only) | {np.mean(alloc['optimum']):.2f} ± {np.std(alloc['optimum']):.2f} "
          f"| | {secs['optimum'] / len(seeds):.1f} |")
    print(f"| optimum (proven bound) | {np.mean(alloc['optimum bound']):.2f} | | |")
    print(f"\nproven optimal on {proven}/{len(seeds)} seeds")
    print(f"ceiling of a placer that places every pod arriving before the demand passes the capacity "
          f"(sliver_ceiling, loose): {np.mean(ceiling):.2f} %\n")
    fgd = np.asarray(alloc["seq:fgd"])
    shares: dict[str, dict[str, float]] = {}
    print("paired differences (percentage points of GPU capacity):")
    no_model = "seq:model:default" not in names
    if not no_model:
        model = np.asarray(alloc["seq:model:default"])
        print(f"- seq:model:default - seq:fgd: {paired(model - fgd)}")
    for joint_name in [n for n in ("joint:fgd", "scenario:fgd", "switch:fgd", "knapsack:fgd", "planned:fgd")
                                   if n in names]:
        joint = np.asarray(alloc[joint_name])
        print(f"- {joint_name} - seq:fgd: {paired(joint - fgd)}")
        print(f"  pods placed, {joint_name} - seq:fgd: {np.mean(np.asarray(pods[joint_name]) - pods['seq:fgd']):+.1f}"
              f" per run (seq:fgd {np.mean(pods['seq:fgd']):.1f})")
        if not no_model:
            print(f"- {joint_name} - seq:model:default: {paired(joint - model)}")
        if not args.no_optimum:
            for ref in ("optimum", "optimum bound"):
                o = np.asarray(alloc[ref])
                print(f"- {ref} - {joint_name}: {paired(o - joint)}")
            shares[joint_name] = {ref: float((joint - fgd).sum() / (np.asarray(alloc[ref]) - fgd).sum())
                                  for ref in ("optimum", "optimum bound")}
    if not args.no_optimum:
        for ref in ("optimum", "optimum bound"):
            print(f"- {ref} - seq:fgd: {paired(np.asarray(alloc[ref]) - fgd)}")
        for joint_name, share in shares.items():
            print(f"\nshare of the seq:fgd -> optimum gap closed by {joint_name} (of the summed gaps): "
                  f"{100 * share['optimum bound']:.0f} % of the gap to the proven bound .. "
                  f"{100 * share['optimum']:.0f} % of the gap to the best optimum found (target >= 50 %)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seeds": rows, "share_closed": shares, "args": vars(args)}, fh, indent=1)


if __name__ == "__main__":
    main()
