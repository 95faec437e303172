"""Plain data of the dynamic simulator (``sim.dynamic``): config, events, frozen state, result, metrics.

``SimConfig``, ``SimEvent``, ``BindOutcome``, ``PendingPod``, ``RunInfo``, ``SimCounters`` and
``SimState`` are what ``reset``/``advance``/``bind`` take and return; ``DynamicResult`` is what
``run`` returns; ``snapshot_stats`` and ``_record`` turn a state into metrics. Everything here is
re-exported by ``agmarl_common.core.sim.dynamic``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Mapping

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Node, Pod
from agmarl_common.core.cluster import metrics as state_metrics
from agmarl_common.core.reward import Outcomes, outcomes_from_stats
from agmarl_common.core.sim import metrics

EVENT_TYPES = ("pod_added", "pod_bound", "pod_deleted", "pod_failed", "pod_evicted",
               "node_failed", "node_recovered", "bind_rejected")
RESTART_POLICIES = ("requeue", "fail")


@dataclass(frozen=True)
class SimConfig:
    tick_s: float = 1.0
    horizon_s: float = 3600.0
    start_s: float = 0.0
    pending_timeout_s: float = 600.0  # a pod pending longer leaves as unschedulable; 0 = never
    node_failure_rate: float = 0.0  # failures per node per hour
    mean_recovery_s: float = 600.0  # exponential down time of a failed node
    node_loss_at_s: float = math.inf  # scripted node loss: at this time ...
    node_loss_fraction: float = 0.0  # ... this share of the nodes (drawn from the seed) fails ...
    node_loss_s: float = 600.0  # ... for this long (their pods evicted, as a random failure does)
    eviction_rate: float = 0.0  # random evictions per running pod per hour
    restart_policy: str = "requeue"  # requeue: an evicted pod is pending again | fail: it is gone
    load_ratio: float = 1.0  # measured load per requested unit (cpu_load = cpu_used * ratio * noise)
    metric_noise_std: float = 0.0  # std of the per-node multiplicative load noise
    sla_cpu_threshold: float = state_metrics.SLA_CPU_THRESHOLD
    backoff_initial_s: float = 1.0  # runner: retry delay of an unschedulable pod, doubled each try
    backoff_max_s: float = 10.0

    def __post_init__(self) -> None:
        if self.tick_s <= 0 or self.horizon_s < 0:
            raise ValueError("tick_s must be > 0 and horizon_s >= 0")
        if self.restart_policy not in RESTART_POLICIES:
            raise ValueError(f"restart_policy must be one of {RESTART_POLICIES}")
        if min(self.node_failure_rate, self.eviction_rate, self.metric_noise_std, self.pending_timeout_s) < 0:
            raise ValueError("rates, noise and timeout must be >= 0")
        if self.mean_recovery_s <= 0 or self.load_ratio < 0:
            raise ValueError("mean_recovery_s must be > 0 and load_ratio >= 0")
        if not 0.0 <= self.node_loss_fraction <= 1.0 or self.node_loss_s <= 0:
            raise ValueError("node_loss_fraction must be in [0, 1] and node_loss_s > 0")


@dataclass(frozen=True)
class SimEvent:
    type: str  # one of EVENT_TYPES
    pod_key: str = ""
    node: str = ""
    time: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class BindOutcome:
    ok: bool
    reason: str = ""
    event: SimEvent | None = None


@dataclass(frozen=True)
class PendingPod:
    pod: Pod  # unbound (no node_name / gpu_devices)
    arrival_time: float  # first creation time
    enqueue_time: float  # when it (re-)joined the queue; pending time is measured from here
    restarts: int = 0


@dataclass(frozen=True)
class RunInfo:
    node_index: int
    start: float
    end: float  # inf for pods that run forever
    arrival_time: float
    restarts: int = 0


@dataclass(frozen=True)
class SimCounters:
    arrived: int = 0
    bound: int = 0
    bind_rejected: int = 0
    unschedulable: int = 0  # left the queue after pending_timeout_s
    departed: int = 0  # completed their duration
    evicted: int = 0  # removed from their node by a node failure or a random eviction
    restarted: int = 0  # evicted and queued again
    failed: int = 0  # evicted and gone (restart_policy "fail")
    node_failures: int = 0
    node_recoveries: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class SimState:
    time: float
    step: int
    seed: int
    cluster: ClusterState
    base_nodes: tuple[Node, ...]  # node specs as given (restored on recovery)
    workload: tuple[Pod, ...]  # sorted by creation_time
    next_arrival: int = 0  # index of the next workload pod to arrive
    pending: Mapping[str, PendingPod] = field(default_factory=dict)  # queue order
    running: Mapping[str, RunInfo] = field(default_factory=dict)
    down: Mapping[int, float] = field(default_factory=dict)  # node index -> recovery time
    counters: SimCounters = SimCounters()
    ends: tuple[tuple[float, str], ...] = ()  # (end time, key) of finite running pods, ascending; may hold stale entries
    wait_log: tuple = ()  # waits of pods that left the queue (bound or timed out) as a cons list (wait, older)

    @property
    def node_down(self) -> frozenset[int]:
        return frozenset(self.down)

    def pending_pods(self) -> list[Pod]:
        return [pp.pod for pp in self.pending.values()]

    @property
    def pending_times(self) -> np.ndarray:
        """Waits (s) of every pod that left the queue, bound or timed out, in the order they left."""
        out, node = [], self.wait_log
        while node:
            out.append(node[0])
            node = node[1]
        return np.array(out[::-1], dtype=np.float64)



def mean_pending_wait(state: SimState) -> float:
    """Mean time the pods still pending have waited since they (re-)joined the queue (0 when none): the
    reward's ``pending_time_s``, as the reward-calculator measures it on the live cluster."""
    if not state.pending:
        return 0.0
    return sum(state.time - pp.enqueue_time for pp in state.pending.values()) / len(state.pending)


def window_outcomes(state: SimState, before: SimCounters, violations: int = 0) -> Outcomes:
    """What happened since the counters ``before``, as the composite reward reads it: pods still pending and
    how long they have waited, pods bound, pods failed. ``reward.outcomes_from_stats`` defines them, for the
    reward-calculator and the trainer too: an evicted pod that is queued again is not failed."""
    after = {**state.counters.as_dict(), "pending": len(state.pending), "violations": violations}
    return outcomes_from_stats(before.as_dict(), after, mean_pending_wait(state))


def snapshot_stats(state: SimState, threshold: float = state_metrics.SLA_CPU_THRESHOLD) -> dict[str, float]:
    util = state_metrics.utilisation(state.cluster)
    bad, total = state_metrics.sla_violators(state.cluster, threshold)
    out = {"time": state.time, "util_cpu": util["cpu"], "util_mem": util["mem"], "util_gpu": util["gpu"],
           "balance": state_metrics.balance(state.cluster), "pending": float(len(state.pending)),
           "running": float(len(state.running)), "nodes_down": float(len(state.down)),
           "sla_bad": float(len(bad)), "sla_total": float(total)}
    out.update({k: float(v) for k, v in state.counters.as_dict().items()})
    return out


@dataclass(frozen=True)
class DynamicResult:
    policy: str
    seed: int
    config: SimConfig
    counters: SimCounters
    pending_times: np.ndarray
    series: metrics.TimeSeries
    sla_violating_pods: int  # distinct LS pods seen on a hot node at a record point
    hard_violations: int  # most violations(state) seen at a record point (must be 0)
    violation_examples: tuple[str, ...]
    final_state: SimState

    def summary(self) -> dict[str, float]:
        out = metrics.summarise(self.series, self.pending_times, self.counters.as_dict(),
                                self.sla_violating_pods, self.hard_violations)
        out["pending_at_end"] = float(len(self.final_state.pending))
        out["running_at_end"] = float(len(self.final_state.running))
        return out

def _record(state: SimState, config: SimConfig, sla_pods: set[str]) -> tuple[float, ...]:
    util = state_metrics.utilisation(state.cluster)
    bad, total = state_metrics.sla_violators(state.cluster, config.sla_cpu_threshold)
    sla_pods.update(bad)
    return (state.time, util["cpu"], util["mem"], util["gpu"], state_metrics.balance(state.cluster),
            float(len(state.pending)), float(len(state.running)), float(len(bad)), float(total))
