"""Cluster-state metrics: pure functions of one ClusterState, shared by the reward, the policies and the
simulator's run summaries (``sim.metrics``).

Definitions (all over *schedulable* nodes, i.e. ready and not cordoned, unless stated):
- utilisation of a resource = sum(requested) / sum(capacity);
- balance = population std of per-node cpu requested/capacity (lower is more balanced);
- a node is *hot* when max(cpu requested, cpu measured load) / capacity > threshold (0.8);
  an SLA violation is a latency-sensitive pod (qos "LS") running on a hot node.
"""

from __future__ import annotations

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState
from agmarl_common.core.cluster.specs import LS_QOS

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
