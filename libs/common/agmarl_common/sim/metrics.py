"""Dynamic-simulation metrics: pure functions over a ClusterState plus a summary of a run.

Definitions (all over *schedulable* nodes, i.e. ready and not cordoned, unless stated):
- utilisation of a resource = sum(requested) / sum(capacity);
- balance = population std of per-node cpu requested/capacity (lower is more balanced);
- a node is *hot* when max(cpu requested, cpu measured load) / capacity > threshold (0.8);
  an SLA violation is a latency-sensitive pod (qos "LS") running on a hot node;
- pending-time percentiles use linear interpolation (numpy's default); empty samples give 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agmarl_common.cluster.model import GPU_MILLI, ClusterState
from agmarl_common.cluster.specs import LS_QOS

SLA_CPU_THRESHOLD = 0.8


def utilisation(cluster: ClusterState) -> dict[str, float]:
    """cpu / mem / gpu requested over capacity of the schedulable nodes (0.0 when no capacity)."""
    up = cluster.schedulable
    gpu_cap = float(cluster.gpu_count[up].sum()) * GPU_MILLI
    gpu_used = float(np.where(cluster.gpu_exists(), cluster.gpu_used, 0)[up].sum())
    return {
        "cpu": _ratio(float(cluster.cpu_used[up].sum()), float(cluster.cpu_cap[up].sum())),
        "mem": _ratio(float(cluster.mem_used[up].sum()), float(cluster.mem_cap[up].sum())),
        "gpu": _ratio(gpu_used, gpu_cap),
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def node_cpu_utilisation(cluster: ClusterState) -> np.ndarray:
    """(n,) cpu requested / capacity per node (0 where capacity is 0)."""
    cap = cluster.cpu_cap.astype(np.float64)
    return np.divide(cluster.cpu_used, cap, out=np.zeros_like(cap), where=cap > 0)


def balance(cluster: ClusterState) -> float:
    """Population std of node cpu utilisation across schedulable nodes (0.0 for <= 1 node)."""
    u = node_cpu_utilisation(cluster)[cluster.schedulable]
    return float(u.std()) if u.size > 1 else 0.0


def node_cpu_pressure(cluster: ClusterState) -> np.ndarray:
    """(n,) max(requested, measured load) / capacity; the load is ignored when not measured."""
    used = cluster.cpu_used.astype(np.float64)
    if cluster.cpu_load is not None:
        used = np.maximum(used, np.asarray(cluster.cpu_load, dtype=np.float64))
    cap = cluster.cpu_cap.astype(np.float64)
    return np.divide(used, cap, out=np.zeros_like(cap), where=cap > 0)


def hot_nodes(cluster: ClusterState, threshold: float = SLA_CPU_THRESHOLD) -> np.ndarray:
    """(n,) bool: cpu pressure strictly above ``threshold``."""
    return node_cpu_pressure(cluster) > threshold


def sla_violators(cluster: ClusterState, threshold: float = SLA_CPU_THRESHOLD) -> tuple[list[str], int]:
    """(keys of LS pods on hot nodes, number of LS pods running)."""
    hot = hot_nodes(cluster, threshold)
    bad: list[str] = []
    total = 0
    for i, pods in enumerate(cluster.bound):
        for p in pods:
            if p.qos == LS_QOS:
                total += 1
                if hot[i]:
                    bad.append(p.key)
    return bad, total


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
