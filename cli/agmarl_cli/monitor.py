"""Watch a running system over the bus: decisions, events, snapshots and service health.

Feeds the live view and the headless summary. Subscribes like any other client; holds counters only.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus

TRACE_SERVICES = ("state-collector", "graph-builder", "inference")


@dataclass
class Monitor:
    cluster: str
    decisions: int = 0
    unschedulable: int = 0
    pods_bound: int = 0
    bind_rejected: int = 0
    max_violations: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    trace_ids: list[str] = field(default_factory=list)
    recent: deque = field(default_factory=lambda: deque(maxlen=8))
    stats: dict[str, float] = field(default_factory=dict)
    bound_times: deque = field(default_factory=lambda: deque(maxlen=10_000))
    bad_messages: int = 0

    async def attach(self, bus: Bus) -> None:
        await bus.subscribe(subjects.decision_wildcard(self.cluster), self._on_decision)
        await bus.subscribe(subjects.event(self.cluster), self._on_event)
        await bus.subscribe(subjects.snapshot(self.cluster), self._on_snapshot)

    async def _on_decision(self, msg) -> None:
        try:
            d = m.decode(m.Decision, msg.data)
        except m.DecodeError:
            self.bad_messages += 1
            return
        self.decisions += 1
        if not d.node:
            self.unschedulable += 1
        self.latencies_ms.append(max(0.0, (d.decided_at - d.seen_at) * 1000.0))
        if d.trace_id:
            self.trace_ids.append(d.trace_id)
        self.recent.append(d)

    async def _on_event(self, msg) -> None:
        try:
            ev = m.decode(m.ClusterEvent, msg.data)
        except m.DecodeError:
            self.bad_messages += 1
            return
        if ev.type == "pod_bound":
            self.pods_bound += 1
            self.bound_times.append(time.monotonic())
        elif ev.type == "bind_rejected":
            self.bind_rejected += 1

    async def _on_snapshot(self, msg) -> None:
        try:
            snap = m.decode(m.ClusterSnapshot, msg.data, max_bytes=64 * 1024 * 1024)
        except m.DecodeError:
            self.bad_messages += 1
            return
        self.stats = dict(snap.stats)
        self.max_violations = max(self.max_violations, int(snap.stats.get("violations", 0)))

    def rate(self, window: float = 5.0) -> float:
        """Pods bound per second over the last ``window`` seconds."""
        now = time.monotonic()
        return sum(1 for t in self.bound_times if now - t <= window) / window

    def latency_summary(self) -> dict[str, float]:
        if not self.latencies_ms:
            return {"p50": 0.0, "p99": 0.0, "count": 0}
        a = np.asarray(self.latencies_ms)
        return {"p50": round(float(np.percentile(a, 50)), 3), "p99": round(float(np.percentile(a, 99)), 3),
                "count": int(a.size)}


async def check_health(bus: Bus, services: tuple[str, ...], timeout: float = 2.0) -> dict[str, str]:
    """service -> "healthy" or the reason it is not (no answer, or what it reported)."""
    out: dict[str, str] = {}
    for service in services:
        try:
            status = await bus.request(subjects.health(service), m.HealthStatus(
                service="agmarl-cli", status="probe", pid=0, metrics_port=0, details={}), m.HealthStatus,
                timeout=timeout)
            out[service] = status.status
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the reason
            out[service] = f"no answer to health probe: {type(exc).__name__}"
    return out


def traces_complete(trace_ids: list[str], spans: list[dict]) -> int:
    """How many decisions' traces hold spans from state-collector, graph-builder and inference."""
    services_by_trace: dict[str, set[str]] = {}
    for s in spans:
        services_by_trace.setdefault(s.get("trace_id", ""), set()).add(s.get("service", ""))
    need = set(TRACE_SERVICES)
    return sum(1 for t in trace_ids if need <= services_by_trace.get(t, set()))
