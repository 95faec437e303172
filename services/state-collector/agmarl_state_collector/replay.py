"""Trace replay for the live services: the FGD paper's inflation protocol as the cluster behind the
state-collector (``AGMARL_REPLAY_WORKLOAD=openb:default`` ...).

The arrival sequence and the per-run node order come from ``sim.inflation.plan`` with the same seed as
``agmarl eval``, so a live run can be compared with the in-process one pod for pod. Pods are announced
in arrival order, at most ``in_flight`` without a decision at a time (1: each pod is decided on the
cluster its predecessors left, exactly as the simulator runs); a decision binds after the hard filter
re-checks it; an unschedulable pod is dropped, as the protocol drops it. The per-run node order travels
as the node label ``agmarl.io/tie-order`` (a decider gives ties to the lowest). At the end the result
(placements, allocation at every arrived %) is written as JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from agmarl_common.core.cluster.filters import filter_node
from agmarl_common.core.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState, Node, Pod, bind
from agmarl_common.core.cluster.specs import TIE_ORDER_LABEL
from agmarl_common.core.sim import catalog
from agmarl_common.core.sim.dynamic_state import BindOutcome, SimEvent
from agmarl_common.core.sim.inflation import MAX_ARRIVED_PCT, binned_mean, plan


@dataclass
class ReplayCounters:
    arrived: int = 0
    bound: int = 0
    failed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"arrived": self.arrived, "bound": self.bound, "failed": self.failed}


@dataclass
class ReplayState:
    """What the collector app reads of a source: the cluster, its clock, the pods waiting."""
    cluster: ClusterState
    time: float = 0.0
    pending: dict[str, Pod] = field(default_factory=dict)
    counters: ReplayCounters = field(default_factory=ReplayCounters)

    def pending_pods(self) -> list[Pod]:
        return list(self.pending.values())


def labelled(nodes: tuple[Node, ...], rank: np.ndarray | None) -> tuple[Node, ...]:
    if rank is None:
        return nodes
    return tuple(replace(nd, labels={**nd.labels, TIE_ORDER_LABEL: str(int(r))}) for nd, r in zip(nodes, rank))


class InflationReplay:
    """The inflation protocol as a live cluster source (module docstring)."""

    def __init__(self, nodes: tuple[Node, ...], workload: tuple[Pod, ...], seed: int, ratio: float = 1.3,
                 tie_break: str = "node-order", in_flight: int = 1, rate: float = 0.0, retry_s: float = 2.0):
        arrivals, rank = plan(nodes, workload, np.random.default_rng(seed), ratio, tie_break)
        self.arrivals = arrivals
        self.state = ReplayState(ClusterState.empty(labelled(tuple(nodes), rank)))
        self.total = int(self.state.cluster.gpu_count.sum()) * GPU_MILLI
        self.in_flight, self.rate = max(1, in_flight), rate
        self.next = 0  # next arrival to announce
        self.node_of: dict[str, int] = {}  # pod key -> node index (-1: dropped)
        self.position = {p.key: e for e, p in enumerate(arrivals)}
        self.started_at: float | None = None
        # pods are announced again only when no decision at all came for ``retry_s`` (no decider was listening,
        # e.g. at start-up): a busy decider is never sent duplicates
        self.retry_s = retry_s
        self.announced_at: dict[str, float] = {}
        self.last_decision = 0.0

    @classmethod
    def from_spec(cls, workload: str, nodes: str, seed: int, ratio: float, tie_break: str, in_flight: int,
                  rate: float, retry_s: float = 2.0) -> "InflationReplay":
        return cls(catalog.cluster_nodes(nodes or catalog.default_nodes(workload)), catalog.openb_pods(workload),
                   seed, ratio, tie_break, in_flight, rate, retry_s)

    @property
    def done(self) -> bool:
        return len(self.node_of) == len(self.arrivals)

    def advance(self, sim_dt: float) -> list[SimEvent]:
        return []  # nothing departs or fails in this protocol

    def due(self, now: float) -> list[Pod]:
        """The next arrivals: while fewer than ``in_flight`` wait for a decision (and, with a ``rate``,
        no faster than ``rate`` pods per second)."""
        out = []
        # a pod waiting is announced again only once no decision at all came for ``retry_s``: while decisions
        # come, none is, and the pods waiting are not looked at (at 100 pods/s behind a slow decider, hundreds)
        if now - self.last_decision > self.retry_s:
            for key, pod in self.state.pending.items():
                if now - max(self.announced_at.get(key, now), self.last_decision) > self.retry_s:
                    self.announced_at[key] = now
                    out.append(pod)
        # until the first decision arrives nobody may be listening: one pod at a time, and the rate's clock
        # starts with that decision (pods announced to nobody would be decided late, out of order)
        limit = self.in_flight if self.started_at is not None else 1
        while self.next < len(self.arrivals) and len(self.state.pending) < limit:
            if self.rate > 0 and self.started_at is not None and self.next >= (now - self.started_at) * self.rate:
                break
            pod = self.arrivals[self.next]
            self.next += 1
            self.state.pending[pod.key] = pod
            self.announced_at[pod.key] = now
            self.state.counters.arrived += 1
            out.append(pod)
        return out

    def is_pending(self, pod_key: str) -> bool:
        return pod_key in self.state.pending

    def _decided(self, now: float) -> None:
        self.last_decision = now
        if self.started_at is None:
            self.started_at = now - 1.0 / self.rate if self.rate > 0 else now

    def unschedulable(self, pod_key: str, now: float) -> None:
        self._decided(now)
        if self.state.pending.pop(pod_key, None) is not None:
            self.announced_at.pop(pod_key, None)
            self.node_of[pod_key] = -1
            self.state.counters.failed += 1

    def bind(self, pod_key: str, node: str, gpus: tuple[int, ...] | None, now: float) -> BindOutcome:
        self._decided(now)
        pod = self.state.pending.get(pod_key)
        cluster = self.state.cluster
        if pod is None:
            return BindOutcome(False, "pod is not pending")
        i = cluster.index.get(node)
        if i is None:
            return BindOutcome(False, f"unknown node {node}")
        status = filter_node(pod, cluster, i)
        if not status.ok:
            return BindOutcome(False, f"{status.plugin}: {status.reason}")
        free = np.where(np.arange(MAX_GPUS) < cluster.gpu_count[i], GPU_MILLI - cluster.gpu_used[i], 0)
        need = pod.gpu_milli if pod.is_gpu_share else GPU_MILLI
        if pod.num_gpu and (gpus is None or len(gpus) != pod.num_gpu or any(free[j] < need for j in gpus)):
            return BindOutcome(False, f"GPU devices {gpus} do not fit")
        self.state.cluster = bind(cluster, pod, i, tuple(gpus or ()))
        del self.state.pending[pod_key]
        self.announced_at.pop(pod_key, None)
        self.node_of[pod_key] = i
        self.state.counters.bound += 1
        return BindOutcome(True)

    def bound_pod(self, pod_key: str, node: str) -> Pod | None:
        i = self.state.cluster.index.get(node)
        if i is None:
            return None
        return next((p for p in self.state.cluster.bound[i] if p.key == pod_key), None)

    def result(self) -> dict:
        """Placements by pod (arrival order) and the GPU allocation curve, as ``agmarl eval`` reports them."""
        n = len(self.arrivals)
        placed = np.array([self.node_of.get(p.key, -1) for p in self.arrivals], np.int64)
        req = np.array([p.gpu_milli_total for p in self.arrivals], np.int64)
        arrived = np.concatenate([[0], np.cumsum(req)])
        used = np.concatenate([[0], np.cumsum(np.where(placed >= 0, req, 0))])
        pct = np.round(used / (self.total / GPU_MILLI) / 10, 2)
        curve = np.round(binned_mean(arrived, pct, self.total), 2)
        names = [nd.name for nd in self.state.cluster.nodes]
        return {"pods": n, "decided": len(self.node_of), "scheduled": int((placed >= 0).sum()),
                "failed": int((placed < 0).sum()), "gpu_alloc_100": float(curve[100]),
                "gpu_alloc_130": float(curve[MAX_ARRIVED_PCT]),
                "placements": [[p.key, names[i] if i >= 0 else ""] for p, i in zip(self.arrivals, placed)]}

    def write_result(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.result()))
