"""`agmarl eval`: run scheduling policies side by side in the simulator and report.

Two protocols over the same policy registry:
- ``inflation``: the FGD paper's workload-inflation experiment (``sim.inflation.run_inflation``):
  GPU allocation and fragmentation against arrived workload, 0..130 % of GPU capacity;
- ``dynamic``: the time-driven simulator (arrivals, durations, pending queue); utilisation,
  balance, pending times, SLA and hard-constraint violations, and the composite reward of
  ``agmarl_common.reward`` averaged over the record points of the run.

Every (policy, seed) pair is one job; a job depends on nothing but its arguments, so a seed
replays exactly whatever the number of worker processes. Results are aggregated per policy as
mean and population std over seeds. Bad input is an ``EvalError`` (a ``ValueError``) whose
message names the problem; the command prints it on one line and exits 2.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from agmarl_common import reward
from agmarl_common.cluster.filters import violations
from agmarl_common.cluster.model import Node, Pod
from agmarl_common.policies.base import Policy
from agmarl_common.sim import dynamic, metrics, synthetic, traces
from agmarl_common.sim.inflation import MAX_ARRIVED_PCT, run_inflation

PROTOCOLS = ("inflation", "dynamic")
MODEL_PREFIX = "model:"
MAX_SEEDS = 1000
INFLATION_CURVES = ("allocation", "frag", "frag_ratio")
DYNAMIC_SERIES = ("util_cpu", "util_mem", "util_gpu", "pending", "reward")
SYNTHETIC_CLUSTER_SEED = 0  # the synthetic cluster is the fixed setting; the seed varies the workload


class EvalError(ValueError):
    """Bad input: the message names the problem (shown to the user as one line)."""


@dataclass(frozen=True)
class EvalSpec:
    protocol: str  # "inflation" | "dynamic"
    workload: str  # "openb:default" | "openb:<name>" | "openb:<csv path>" | "synthetic:<name>"
    nodes: str = ""  # "openb" | "openb:all" | "synthetic:<n>" | "<csv path>"; "" = by workload
    ratio: float = 1.3  # inflation target, x GPU capacity
    horizon_s: float = 3600.0  # dynamic run length; also sizes synthetic workloads
    record_every_s: float = 30.0  # dynamic record interval
    tie_break: str = "node-order"  # inflation: "node-order" (the paper's simulator) | "random" (kube-scheduler)


# ---------------------------------------------------------------------------------------------
# Parsing and validation


def parse_seeds(text: str) -> list[int]:
    """``"42-51"`` (inclusive), ``"42,43,50"`` or ``"42"`` -> seeds; anything else is an EvalError."""
    raw = (text or "").strip()
    try:
        if "-" in raw and "," not in raw:
            lo_s, hi_s = raw.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo:
                raise ValueError
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(s) for s in raw.split(",")]
    except ValueError:
        raise EvalError(f"bad seed range {text!r}: use A-B with A <= B, or a comma list of integers") from None
    if not seeds or min(seeds) < 0 or len(seeds) > MAX_SEEDS or len(set(seeds)) != len(seeds):
        raise EvalError(f"bad seed range {text!r}: 1..{MAX_SEEDS} distinct non-negative integers")
    return seeds


def known_policy_names() -> list[str]:
    """Registry names, plus the FGD-paper policies when the registry does not list them (yet)."""
    from agmarl_common.policies.fgd import FGD_PAPER_POLICIES  # noqa: PLC0415
    from agmarl_common.policies.registry import policy_names  # noqa: PLC0415
    return sorted(set(policy_names()) | set(FGD_PAPER_POLICIES))


def resolve_policy(name: str, seed: int) -> Policy:
    """A fresh policy: the registry first (``model:*`` included when a helper registered it)."""
    from agmarl_common.policies.fgd import FGD_PAPER_POLICIES  # noqa: PLC0415
    from agmarl_common.policies.registry import get_policy  # noqa: PLC0415
    try:
        return get_policy(name, seed)
    except KeyError:
        if name in FGD_PAPER_POLICIES:
            return FGD_PAPER_POLICIES[name](seed)
    what = "unknown model policy" if name.startswith(MODEL_PREFIX) else "unknown policy"
    raise EvalError(f"{what} {name!r}; known: {', '.join(known_policy_names())}")


def parse_policies(text: str) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if not names:
        raise EvalError("no policies given (--policies a,b,...)")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise EvalError(f"policy listed twice: {', '.join(dup)}")
    for n in names:
        resolve_policy(n, 0)
    return names


def _openb_workload_path(ref: str) -> Path:
    if ref.endswith(".csv") or "/" in ref:
        return Path(ref)
    known = traces.available_workloads()
    if ref not in known:
        raise EvalError(f"unknown workload 'openb:{ref}'; known openb workloads: {', '.join(known) or 'none'}"
                        " (or openb:<csv path>)")
    return traces.openb_pod_path(ref)


def check_spec(spec: EvalSpec) -> None:
    """Everything a job needs, loaded once here so bad input fails before any run starts."""
    if spec.protocol not in PROTOCOLS:
        raise EvalError(f"unknown protocol {spec.protocol!r}; known: {', '.join(PROTOCOLS)}")
    if spec.tie_break not in ("node-order", "random"):
        raise EvalError(f"--tie-break must be node-order or random, not {spec.tie_break!r}")
    if not spec.ratio > 0 or not spec.horizon_s > 0 or not spec.record_every_s > 0:
        raise EvalError("--ratio, --horizon and --record-every must be > 0")
    kind, _, ref = spec.workload.partition(":")
    if kind == "synthetic":
        if ref not in synthetic.SYNTHETIC_WORKLOADS:
            raise EvalError(f"unknown workload {spec.workload!r}; known synthetic workloads: "
                            f"{', '.join(sorted(synthetic.SYNTHETIC_WORKLOADS))}")
    elif kind == "openb" and ref:
        _openb_pods(str(_openb_workload_path(ref)))
    else:
        raise EvalError(f"unknown workload {spec.workload!r}: use openb:default, openb:<csv path> or "
                        "synthetic:<name>")
    if not load_nodes(spec):
        raise EvalError(f"node list {spec.nodes!r} is empty")


# ---------------------------------------------------------------------------------------------
# Inputs (cached per process: a worker loads a trace once for all its jobs)


@lru_cache(maxsize=8)
def _openb_pods(path: str) -> tuple[Pod, ...]:
    return traces.load_openb_pods(path)


@lru_cache(maxsize=8)
def _nodes(ref: str) -> tuple[Node, ...]:
    if ref in ("openb", "openb:gpu"):
        return traces.load_openb_nodes(traces.openb_node_path(traces.GPU_NODES))
    if ref == "openb:all":
        return traces.load_openb_nodes(traces.openb_node_path(traces.ALL_NODES))
    if ref.startswith("synthetic:"):
        n = ref.removeprefix("synthetic:")
        if not n.isdigit() or not 1 <= int(n) <= 100_000:
            raise EvalError(f"bad node spec {ref!r}: synthetic:<n> with 1 <= n <= 100000")
        return tuple(synthetic.synthetic_cluster(int(n), seed=SYNTHETIC_CLUSTER_SEED))
    return traces.load_openb_nodes(ref)


def load_nodes(spec: EvalSpec) -> tuple[Node, ...]:
    """The cluster: ``spec.nodes``, or by default openb's GPU nodes for openb, 50 synthetic nodes else."""
    ref = spec.nodes or ("openb" if spec.workload.startswith("openb:") else "synthetic:50")
    return _nodes(ref)


def compress_times(pods: tuple[Pod, ...], horizon_s: float) -> tuple[Pod, ...]:
    """A trace longer than the horizon squeezed onto it: creation times and durations scaled by
    horizon / span (durations at least 1 s; 0 stays 0, "runs forever"). Every trace starts at 0."""
    times = [p.creation_time for p in pods]
    lo, span = min(times, default=0.0), max(times, default=0.0) - min(times, default=0.0)
    if span <= horizon_s:
        return tuple(replace_time(p, p.creation_time - lo, p.duration) for p in pods)
    k = horizon_s / span
    return tuple(replace_time(p, (p.creation_time - lo) * k, max(p.duration * k, 1.0) if p.duration > 0 else 0.0)
                 for p in pods)


def replace_time(pod: Pod, creation_time: float, duration: float) -> Pod:
    return replace(pod, creation_time=float(creation_time), duration=float(duration))


def load_workload(spec: EvalSpec, nodes: tuple[Node, ...], seed: int) -> tuple[Pod, ...]:
    kind, _, ref = spec.workload.partition(":")
    if kind == "synthetic":
        return tuple(synthetic.generate(ref, list(nodes), horizon_s=spec.horizon_s, seed=seed))
    pods = _openb_pods(str(_openb_workload_path(ref)))
    return compress_times(pods, spec.horizon_s) if spec.protocol == "dynamic" else pods


# ---------------------------------------------------------------------------------------------
# Jobs


def run_job(spec: EvalSpec, policy_name: str, seed: int) -> dict[str, Any]:
    """One (policy, seed) run -> {"policy", "seed", "metrics": {...}, "curves"|"series": {...}}."""
    nodes = load_nodes(spec)
    pods = load_workload(spec, nodes, seed)
    policy = resolve_policy(policy_name, seed)
    if spec.protocol == "inflation":
        out = _inflation_job(spec, nodes, pods, policy, seed)
    else:
        out = _dynamic_job(spec, nodes, pods, policy, seed)
    return {"policy": policy_name, "seed": seed, **out}


def _inflation_job(spec: EvalSpec, nodes, pods, policy: Policy, seed: int) -> dict[str, Any]:
    res = run_inflation(nodes, pods, policy, np.random.default_rng(seed), ratio=spec.ratio,
                        tie_break=spec.tie_break)
    curves = {"allocation": res.allocation_curve(), "frag": res.frag_curve(), "frag_ratio": res.frag_ratio_curve()}
    m = {"pods": float(len(res.pods)), "scheduled": float(res.scheduled), "failed": float(res.failed)}
    for pct in (100, MAX_ARRIVED_PCT):
        m[f"gpu_alloc_{pct}"] = float(curves["allocation"][pct])
        m[f"frag_{pct}"] = float(curves["frag"][pct])
        m[f"frag_ratio_{pct}"] = float(curves["frag_ratio"][pct])
    return {"metrics": m, "curves": {k: v.tolist() for k, v in curves.items()}}


def _dynamic_job(spec: EvalSpec, nodes, pods, policy: Policy, seed: int) -> dict[str, Any]:
    config = dynamic.SimConfig(horizon_s=spec.horizon_s)
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
    c, b = state.counters, before
    out = reward.Outcomes(pending=len(state.pending), scheduled=c.bound - b.bound,
                          failed=(c.unschedulable - b.unschedulable) + (c.evicted - b.evicted)
                          + (c.bind_rejected - b.bind_rejected),
                          violations=n_violations)
    comps = reward.reward_components(state.cluster, out)
    return {**comps, "total": reward.total_reward(comps)}


def run_dynamic_with_reward(policy: Policy, nodes, workload, config: dynamic.SimConfig, seed: int,
                            record_every: float) -> tuple[dynamic.DynamicResult, list[dict[str, float]]]:
    """``dynamic.run`` (same steps, same result) that also scores the composite reward at every
    record point over the window since the previous one; hard violations are checked there too.
    A policy with ``observe_workload(pods)`` (FGD) is told the workload first, as in inflation."""
    observe = getattr(policy, "observe_workload", None)
    if callable(observe):
        observe(tuple(workload))
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
            util = metrics.utilisation(state.cluster)
            bad, total = metrics.sla_violators(state.cluster, config.sla_cpu_threshold)
            sla_pods.update(bad)
            rows.append((state.time, util["cpu"], util["mem"], util["gpu"], metrics.balance(state.cluster),
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


def _mean_std(values: list[Any]) -> tuple[Any, Any]:
    """Mean and population std over seeds (axis 0), ignoring NaN; all-NaN -> None."""
    a = np.asarray(values, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices (empty curve bins)
        return _clean(np.nanmean(a, axis=0)), _clean(np.nanstd(a, axis=0))


def _clean(x: Any) -> Any:
    """numpy -> JSON-ready Python: NaN/inf -> None, floats rounded to 6 places."""
    if isinstance(x, np.ndarray):
        return [_clean(v) for v in x.tolist()] if x.ndim else _clean(x.item())
    if isinstance(x, list):
        return [_clean(v) for v in x]
    x = float(x)
    return round(x, 6) if math.isfinite(x) else None


def aggregate(spec: EvalSpec, runs: list[dict[str, Any]], policies: list[str], seeds: list[int],
              n_nodes: int) -> dict[str, Any]:
    """The report written as JSON: per policy, mean and std over seeds of every metric and curve."""
    report: dict[str, Any] = {"protocol": spec.protocol, "workload": spec.workload, "nodes": spec.nodes or "default",
                              "n_nodes": n_nodes, "spec": asdict(spec), "seeds": seeds, "policies": {}}
    if spec.protocol == "inflation":
        report["arrived_pct"] = list(range(MAX_ARRIVED_PCT + 1))
    for p in policies:
        mine = [r for r in runs if r["policy"] == p]
        names = list(mine[0]["metrics"])
        entry: dict[str, Any] = {"metrics": {}}
        for m in names:
            mean, std = _mean_std([r["metrics"][m] for r in mine])
            entry["metrics"][m] = {"mean": mean, "std": std}
        key, keys = ("curves", INFLATION_CURVES) if spec.protocol == "inflation" else ("series", DYNAMIC_SERIES)
        entry[key] = {}
        for c in keys:
            mean, std = _mean_std([r[key][c] for r in mine])
            entry[key][c] = {"mean": mean, "std": std}
        if key == "series":
            entry[key]["time"] = mine[0]["series"]["time"]
        entry["runs"] = [{"seed": r["seed"], "metrics": {k: _clean(v) for k, v in r["metrics"].items()}}
                         for r in mine]
        report["policies"][p] = entry
    return report


TABLE_COLUMNS = {
    "inflation": [("gpu_alloc_100", "GPU alloc % @100 %"), ("gpu_alloc_130", "GPU alloc % @130 %"),
                  ("frag_100", "frag % @100 %"), ("frag_ratio_100", "frag/idle % @100 %"), ("failed", "failed pods")],
    "dynamic": [("reward_mean", "reward"), ("util_mean", "util"), ("util_cpu_mean", "cpu"),
                ("util_mem_mean", "mem"), ("util_gpu_mean", "gpu"), ("balance_mean", "balance std"),
                ("pending_time_p50_s", "pending p50 s"), ("pending_time_p99_s", "pending p99 s"),
                ("unschedulable", "unsched."), ("failed", "failed"), ("sla_violation_rate", "SLA viol."),
                ("hard_violations", "hard viol.")],
}


def _fmt(cell: dict[str, Any], digits: int) -> str:
    if cell["mean"] is None:
        return "n/a"
    return f"{cell['mean']:.{digits}f} ± {cell['std']:.{digits}f}"


def markdown_table(report: dict[str, Any]) -> str:
    """One row per policy, mean ± std over seeds of the protocol's headline metrics."""
    cols = TABLE_COLUMNS[report["protocol"]]
    lines = ["| policy | " + " | ".join(h for _, h in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, entry in report["policies"].items():
        cells = []
        for key, _ in cols:
            big = key.startswith(("gpu_alloc", "frag", "pending_time", "unsched", "failed", "hard"))
            cells.append(_fmt(entry["metrics"][key], 2 if big else 3))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")


# ---------------------------------------------------------------------------------------------
# The command


def _check_output(path: str | None, flag: str, suffix: str) -> None:
    if path is None:
        return
    p = Path(path)
    if not p.parent.is_dir():
        raise EvalError(f"{flag} {path}: directory {p.parent} does not exist")
    if p.suffix.lower() != suffix:
        raise EvalError(f"{flag} {path}: expected a {suffix} file")


def eval_command(spec: EvalSpec, policies: str, seeds: str, json_path: str | None = None,
                 plot_path: str | None = None, workers: int = 1) -> int:
    """Validate, run, write JSON / PNG, print the Markdown table; 2 on bad input (one line on stderr)."""
    try:
        seed_list = parse_seeds(seeds)
        if workers < 1:
            raise EvalError(f"--workers must be >= 1, got {workers}")
        _check_output(json_path, "--json", ".json")
        _check_output(plot_path, "--plot", ".png")
        check_spec(spec)
        names = parse_policies(policies)
        runs = run_all(spec, names, seed_list, workers)
    except (EvalError, ValueError, KeyError, OSError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"agmarl eval: error: {' '.join(str(msg).split())}", file=sys.stderr)
        return 2
    report = aggregate(spec, runs, names, seed_list, len(load_nodes(spec)))
    if json_path:
        write_json(report, json_path)
    if plot_path:
        from agmarl_cli.plots import plot_report  # noqa: PLC0415 - matplotlib only when asked
        plot_report(report, plot_path)
    print(f"{spec.protocol} · {spec.workload} · {report['n_nodes']} nodes · seeds {seeds} "
          f"({len(seed_list)}) · mean ± std\n")
    print(markdown_table(report))
    return 0
