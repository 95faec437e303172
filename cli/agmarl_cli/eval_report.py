"""`agmarl eval` report: per-policy mean and std over seeds, as JSON and as a Markdown table.

Re-exported by ``agmarl_cli.evaluate``.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from agmarl_common.core.sim.inflation import MAX_ARRIVED_PCT
from agmarl_cli.eval_spec import DYNAMIC_SERIES, INFLATION_CURVES, EvalSpec


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
