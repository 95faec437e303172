"""Dynamic-simulation run metrics: percentiles, the time series a run records and its summary. The
per-state metrics (utilisation, balance, hot nodes, SLA violators) are ``cluster.metrics``.

Pending-time percentiles use linear interpolation (numpy's default); empty samples give 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

def percentile(samples: np.ndarray | list[float], q: float) -> float:
    s = np.asarray(samples, dtype=np.float64)
    return float(np.percentile(s, q)) if s.size else 0.0


@dataclass(frozen=True)
class TimeSeries:
    """Samples of a run for plotting; every array has one entry per record point."""

    time: np.ndarray
    util_cpu: np.ndarray
    util_mem: np.ndarray
    util_gpu: np.ndarray
    balance: np.ndarray
    pending: np.ndarray
    running: np.ndarray
    sla_bad: np.ndarray  # LS pods on hot nodes
    sla_total: np.ndarray  # LS pods running

    def as_dict(self) -> dict[str, list[float]]:
        return {k: getattr(self, k).tolist() for k in self.__dataclass_fields__}


def series_from_rows(rows: list[tuple[float, ...]]) -> TimeSeries:
    """Rows of (time, cpu, mem, gpu, balance, pending, running, sla_bad, sla_total)."""
    names = list(TimeSeries.__dataclass_fields__)
    arr = np.asarray(rows, dtype=np.float64).reshape(-1, len(names))
    return TimeSeries(**{n: arr[:, k].copy() for k, n in enumerate(names)})


def summarise(series: TimeSeries, pending_times: np.ndarray, counters: dict[str, int],
              sla_pods: int, hard_violations: int) -> dict[str, float]:
    """The flat metric dict of a run (means are over record points)."""
    def mean(a: np.ndarray) -> float:
        return float(a.mean()) if a.size else 0.0

    sla_total = float(series.sla_total.sum())
    out = {
        "util_cpu_mean": mean(series.util_cpu),
        "util_mem_mean": mean(series.util_mem),
        "util_gpu_mean": mean(series.util_gpu),
        "balance_mean": mean(series.balance),
        "pending_mean": mean(series.pending),
        "pending_time_p50_s": percentile(pending_times, 50),
        "pending_time_p99_s": percentile(pending_times, 99),
        "pending_time_mean_s": float(np.mean(pending_times)) if len(pending_times) else 0.0,
        "sla_violation_rate": float(series.sla_bad.sum()) / sla_total if sla_total > 0 else 0.0,
        "sla_violating_pods": float(sla_pods),
        "hard_violations": float(hard_violations),
    }
    out.update({k: float(v) for k, v in counters.items()})
    return out
