"""`agmarl eval` jobs: one (policy, seed) run per job, in process or over spawned worker processes.

``run_job`` depends on nothing but its arguments, so a seed replays exactly whatever the number of
workers; workers unpickle it as ``agmarl_cli.eval_jobs.run_job``. Re-exported by ``agmarl_cli.evaluate``.
"""

from __future__ import annotations

import math
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from typing import Any

import numpy as np

from agmarl_common.core import reward
from agmarl_common.core.cluster.filters import violations
from agmarl_common.core.policies.base import Policy, brief
from agmarl_common.core.cluster import metrics as state_metrics
from agmarl_common.core.sim import dynamic, metrics, synthetic
from agmarl_common.core.sim.inflation import MAX_ARRIVED_PCT, run_inflation
from agmarl_cli.eval_spec import EvalSpec, load_nodes, load_workload, resolve_policy


def run_job(spec: EvalSpec, policy_name: str, seed: int) -> dict[str, Any]:
    """One (policy, seed) run -> {"policy", "seed", "metrics": {...}, "curves"|"series": {...}}."""
    nodes = load_nodes(spec)
    pods = load_workload(spec, nodes, seed)
    policy = resolve_policy(policy_name, seed)
    if spec.protocol == "inflation":
        out = inflation_job(spec, nodes, pods, policy, seed)
    else:
        out = dynamic_job(spec, nodes, pods, policy, seed)
    return {"policy": policy_name, "seed": seed, **out}


def inflation_job(spec: EvalSpec, nodes, pods, policy: Policy, seed: int) -> dict[str, Any]:
    """The inflation protocol's run of ``policy`` on ``nodes`` and ``pods`` -> {"metrics", "curves"}."""
    res = run_inflation(nodes, pods, policy, np.random.default_rng(seed), ratio=spec.ratio,
                        tie_break=spec.tie_break)
    curves = {"allocation": res.allocation_curve(), "frag": res.frag_curve(), "frag_ratio": res.frag_ratio_curve()}
    m = {"pods": float(len(res.pods)), "scheduled": float(res.scheduled), "failed": float(res.failed)}
    for pct in (100, MAX_ARRIVED_PCT):
        m[f"gpu_alloc_{pct}"] = float(curves["allocation"][pct])
        m[f"frag_{pct}"] = float(curves["frag"][pct])
        m[f"frag_ratio_{pct}"] = float(curves["frag_ratio"][pct])
    return {"metrics": m, "curves": {k: v.tolist() for k, v in curves.items()}}


def dynamic_job(spec: EvalSpec, nodes, pods, policy: Policy, seed: int) -> dict[str, Any]:
    """The dynamic protocol's run of ``policy`` (an instance: a caller may wrap one) on ``nodes`` and ``pods``
    -> {"metrics", "series"}; the simulator settings come from the spec's synthetic workload, if any."""
    kind, _, ref = spec.workload.partition(":")
    options = synthetic.sim_options(ref, spec.horizon_s) if kind == "synthetic" else {}
    config = dynamic.SimConfig(horizon_s=spec.horizon_s, **options)  # a pressure variant's timeout, node loss
    res, rewards = run_dynamic_with_reward(policy, nodes, pods, config, seed, spec.record_every_s)
    m = res.summary()
    used = ["util_cpu_mean", "util_mem_mean"] + (["util_gpu_mean"] if any(n.gpu_count for n in nodes) else [])
    m["util_mean"] = float(np.mean([m[k] for k in used]))
    totals = np.array([r["total"] for r in rewards]) if rewards else np.zeros(1)
    m["reward_mean"] = float(totals.mean())
    for comp in rewards[0] if rewards else ():
        if comp != "total":
            m[f"reward_{comp}_mean"] = float(np.mean([r[comp] for r in rewards]))
    s = res.series
    series = {"time": s.time.tolist(), "util_cpu": s.util_cpu.tolist(), "util_mem": s.util_mem.tolist(),
              "util_gpu": s.util_gpu.tolist(), "pending": s.pending.tolist(), "reward": totals.tolist()}
    return {"metrics": m, "series": series}


def window_reward(state: dynamic.SimState, before: dynamic.SimCounters, n_violations: int) -> dict[str, float]:
    """Composite reward of the window since the counters ``before``: components and "total"."""
    comps = reward.reward_components(state.cluster, dynamic.window_outcomes(state, before, n_violations))
    return {**comps, "total": reward.total_reward(comps)}


def run_dynamic_with_reward(policy: Policy, nodes, workload, config: dynamic.SimConfig, seed: int,
                            record_every: float) -> tuple[dynamic.DynamicResult, list[dict[str, float]]]:
    """``dynamic.run`` (same steps, same result) that also scores the composite reward at every
    record point over the window since the previous one; hard violations are checked there too.
    The policy is told the workload and the composite objective first (``policies.base.brief``)."""
    brief(policy, tuple(workload), dynamic.OBJECTIVE)
    state = dynamic.reset(nodes, workload, config, seed)
    retry: dict[str, tuple[float, float]] = {}
    every = max(1, round(record_every / config.tick_s))
    rows, rewards, sla_pods = [], [], set()
    worst, examples, before = 0, (), state.counters
    n_ticks = int(math.ceil(config.horizon_s / config.tick_s - 1e-9))
    for k in range(1, n_ticks + 1):
        state, _ = dynamic.advance(state, config.tick_s, config)
        state = dynamic.schedule_pending(policy, state, config, retry)
        if k % every == 0 or k == n_ticks:
            util = state_metrics.utilisation(state.cluster)
            bad, total = state_metrics.sla_violators(state.cluster, config.sla_cpu_threshold)
            sla_pods.update(bad)
            rows.append((state.time, util["cpu"], util["mem"], util["gpu"], state_metrics.balance(state.cluster),
                         float(len(state.pending)), float(len(state.running)), float(len(bad)), float(total)))
            found = violations(state.cluster)
            if len(found) > worst:
                worst, examples = len(found), tuple(found[:5])
            rewards.append(window_reward(state, before, len(found)))
            before = state.counters
    result = dynamic.DynamicResult(
        policy=getattr(policy, "name", type(policy).__name__), seed=seed, config=config, counters=state.counters,
        pending_times=state.pending_times, series=metrics.series_from_rows(rows), sla_violating_pods=len(sla_pods),
        hard_violations=worst, violation_examples=examples, final_state=state)
    return result, rewards


# ---------------------------------------------------------------------------------------------
# Running and aggregating


def run_all(spec: EvalSpec, policies: list[str], seeds: list[int], workers: int = 1,
            progress: bool | None = None) -> list[dict[str, Any]]:
    """Every policy x seed, in that order whatever order the workers finish in."""
    from tqdm import tqdm  # noqa: PLC0415
    jobs = [(p, s) for p in policies for s in seeds]
    bar = tqdm(total=len(jobs), desc=f"eval {spec.protocol}", unit="run", file=sys.stderr,
               disable=None if progress is None else not progress)
    results: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        if workers <= 1:
            for p, s in jobs:
                results[(p, s)] = run_job(spec, p, s)
                bar.update()
        else:
            pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context("spawn"))
            try:
                futures = {pool.submit(run_job, spec, p, s): (p, s) for p, s in jobs}
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.update()
            finally:  # on a failed job, drop the queued ones instead of running them
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        bar.close()
    return [results[j] for j in jobs]
