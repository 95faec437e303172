"""The reward, defined once: components in [0, 1] computed from cluster state and outcome counts.

Used by the reward-calculator service, the simulator-based evaluation and the trainer, so training
and serving optimise the same thing. Pure functions over plain data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agmarl_common.cluster.model import ClusterState

UTILISATION_KNEE = 0.8  # above this, utilisation is penalised (overload risk)


@dataclass(frozen=True, slots=True)
class RewardWeights:
    utilisation: float = 0.35
    balance: float = 0.25
    pending: float = 0.15
    failed: float = 0.10
    constraints: float = 0.15


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Counts over the window the reward covers."""

    pending: int = 0  # pods still waiting at the end of the window
    scheduled: int = 0  # pods bound in the window
    failed: int = 0  # failed starts, unschedulable timeouts, evictions
    violations: int = 0  # hard-constraint violations found in the state


def node_utilisation(state: ClusterState) -> np.ndarray:
    """(n, 3) requested / capacity for cpu, memory, gpu on each schedulable node (gpu 0 where none)."""
    if state.n_nodes == 0:
        return np.zeros((0, 3))
    cpu = state.cpu_used / np.maximum(state.cpu_cap, 1)
    mem = state.mem_used / np.maximum(state.mem_cap, 1)
    gpu_cap = state.gpu_count * 1000
    gpu = state.gpu_used.sum(axis=1) / np.maximum(gpu_cap, 1)
    util = np.stack([cpu, mem, gpu], axis=1)
    return util[state.schedulable]


def utilisation_by_resource(state: ClusterState) -> dict[str, float]:
    """Cluster-wide requested / allocatable per resource (schedulable nodes only)."""
    m = state.schedulable
    out = {}
    for name, used, cap in (("cpu", state.cpu_used, state.cpu_cap), ("memory", state.mem_used, state.mem_cap),
                            ("gpu", state.gpu_used.sum(axis=1), state.gpu_count * 1000)):
        total = float(cap[m].sum())
        out[name] = float(used[m].sum()) / total if total > 0 else 0.0
    return out


def score_utilisation(util: float) -> float:
    """Rises linearly to 1 at the knee, then falls linearly to 0.5 at 100 % (overload penalty)."""
    util = min(max(util, 0.0), 1.0)
    if util <= UTILISATION_KNEE:
        return util / UTILISATION_KNEE
    return 1.0 - 0.5 * (util - UTILISATION_KNEE) / (1.0 - UTILISATION_KNEE)


def balance_std(state: ClusterState) -> float:
    """Std of per-node mean(cpu, memory) utilisation across schedulable nodes."""
    u = node_utilisation(state)
    if len(u) == 0:
        return 0.0
    return float(np.std(u[:, :2].mean(axis=1)))


def score_balance(std: float) -> float:
    """1 for perfectly even nodes, 0 at std >= 0.5 (the maximum for values in [0, 1])."""
    return float(max(0.0, 1.0 - 2.0 * std))


def reward_components(state: ClusterState, outcomes: Outcomes) -> dict[str, float]:
    """Every component in [0, 1], higher is better."""
    util = utilisation_by_resource(state)
    used = [util["cpu"], util["memory"]] + ([util["gpu"]] if state.gpu_count.sum() > 0 else [])
    seen = outcomes.pending + outcomes.scheduled + outcomes.failed
    return {
        "utilisation": score_utilisation(float(np.mean(used))),
        "balance": score_balance(balance_std(state)),
        "pending": 1.0 - outcomes.pending / seen if seen else 1.0,
        "failed": 1.0 - outcomes.failed / seen if seen else 1.0,
        "constraints": 1.0 if outcomes.violations == 0 else 0.0,
    }


def total_reward(components: dict[str, float], weights: RewardWeights = RewardWeights()) -> float:
    """Weighted sum of the components (weights sum to 1, so the total is in [0, 1])."""
    w = {"utilisation": weights.utilisation, "balance": weights.balance, "pending": weights.pending,
         "failed": weights.failed, "constraints": weights.constraints}
    norm = sum(w.values())
    return float(sum(w[k] * components.get(k, 0.0) for k in w) / norm)
