"""Watch a running system over the bus: decisions, events, snapshots and service health.

Feeds the live view and the headless summary. Subscribes like any other client; holds counters only.

Decision latency is a decision's ``decided_at`` (inference, when it chose) - its ``seen_at`` (the state-collector,
when it published the pending pod), both wall clock on this machine, counted for the pods announced once every
service answered healthy (``start_measuring``): a pod announced before waited for services still starting (the
first graph, the policy selection, a model load) and is reported apart as start-up. With the inference spans,
``latency_split`` parts it into the wait before inference took the pod up (queue) and the decision itself.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

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
    unassisted: int = 0  # entries for pods kube-scheduler placed alone (agmarl_inference.catchup): no decision
    pods_bound: int = 0
    bind_rejected: int = 0
    max_violations: int = 0
    measure_from: float = math.inf  # wall time every service was healthy: latency counts pods announced since
    latencies_ms: list[float] = field(default_factory=list)  # those pods' decisions
    measured: list[tuple[str, float, float]] = field(default_factory=list)  # (trace id, seen_at, decided_at)
    startup_ms: list[float] = field(default_factory=list)  # decisions on pods announced before
    window: dict[str, float] = field(default_factory=dict)  # at start_measuring: time, announced, load
    cpu: tuple[dict, dict] = field(default_factory=lambda: ({}, {}))  # (pid, CPU s) by process, at start / end
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
        if d.source == m.UNASSISTED:  # not a decision: neither counted nor in the latency
            self.unassisted += 1
            return
        self.decisions += 1
        if not d.node:
            self.unschedulable += 1
        latency = max(0.0, (d.decided_at - d.seen_at) * 1000.0)
        if d.seen_at >= self.measure_from:
            self.latencies_ms.append(latency)
            self.measured.append((d.trace_id, d.seen_at, d.decided_at))
        else:
            self.startup_ms.append(latency)
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

    def start_measuring(self, now: float | None = None, cpu: dict[str, tuple[int, float]] | None = None) -> None:
        """Every service is healthy: decision latency counts the pods announced from now on. ``cpu``: each
        process's CPU seconds so far (``process_cpu_seconds``)."""
        self.measure_from = time.time() if now is None else now
        self.window = {"at": time.monotonic(), "announced": self.stats.get("announced", math.nan),
                       "load_1m": os.getloadavg()[0]}
        self.cpu = (dict(cpu or {}), {})

    def stop_measuring(self, cpu: dict[str, tuple[int, float]] | None = None) -> None:
        """The run ends: the rates are over the window up to now (decisions that still come are counted in the
        latency, not in the rates)."""
        if self.window and "end" not in self.window:
            self.window.update(end=time.monotonic(), announced_end=self.stats.get("announced", math.nan),
                               decided=len(self.measured), load_1m_end=os.getloadavg()[0])
            self.cpu = (self.cpu[0], dict(cpu or {}))

    def load_summary(self) -> dict:
        """The offered load against what was decided, since ``start_measuring``: pods announced per second (the
        state-collector's count, re-announcements included), decisions on them per second, how many of them
        were still undecided at the end, and whether the decisions kept up (>= 95 % of the announcements
        decided); with the machine's cores and 1-minute load average at the start and the end."""
        if not self.window:
            return {}
        w = self.window
        seconds = max(1e-9, w.get("end", time.monotonic()) - w["at"])
        announced = w.get("announced_end", self.stats.get("announced", math.nan)) - w["announced"]
        decided = int(w.get("decided", len(self.measured)))
        out = {"window_s": round(seconds, 2), "decided_per_s": round(decided / seconds, 2), "cpus": os.cpu_count(),
               "load_1m": [round(w["load_1m"], 2), round(w.get("load_1m_end", os.getloadavg()[0]), 2)]}
        if math.isfinite(announced):  # a simulated cluster counts its announcements (a Kubernetes one: not here)
            out.update(announced_per_s=round(announced / seconds, 2), undecided_at_end=max(0, int(announced) - decided),
                       keeping_up=decided >= 0.95 * announced)
        used = cpu_used(*self.cpu)
        if used:  # what the processes spent in the window: per decision, and in cores
            out["cpu_cores"] = round(sum(used.values()) / seconds, 3)
            out["cpu_ms_per_decision"] = {k: round(1000.0 * v / max(decided, 1), 2) for k, v in used.items()}
        return out

    def rate(self, window: float = 5.0) -> float:
        """Pods bound per second over the last ``window`` seconds."""
        now = time.monotonic()
        return sum(1 for t in self.bound_times if now - t <= window) / window

    def latency_summary(self) -> dict[str, float]:
        """Pod published -> decided, over the pods announced once every service was healthy."""
        return percentiles(self.latencies_ms)

    def startup_summary(self) -> dict:
        """The decisions on pods announced while the services were starting (not in the latency above)."""
        return {"decisions": len(self.startup_ms), "latency_ms": percentiles(self.startup_ms)}


def process_cpu_seconds(pids: dict[str, int | None]) -> dict[str, tuple[int, float]]:
    """(pid, user + system CPU seconds used) of each process (Linux /proc; one gone, or another OS: left out)."""
    per_tick, out = 1.0 / os.sysconf("SC_CLK_TCK"), {}
    for name, pid in pids.items():
        try:
            utime, stime = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]
        except (OSError, ValueError):
            continue
        out[name] = (pid, (int(utime) + int(stime)) * per_tick)
    return out


def cpu_used(start: dict[str, tuple[int, float]], end: dict[str, tuple[int, float]]) -> dict[str, float]:
    """CPU seconds each process used between two ``process_cpu_seconds`` readings; a process gone or restarted in
    between (its pid changed) is left out."""
    return {k: end[k][1] - v[1] for k, v in start.items() if k in end and end[k][0] == v[0]}


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "count": 0}
    a = np.asarray(values)
    p50, p90, p99 = (round(float(v), 3) for v in np.percentile(a, [50, 90, 99]))
    return {"p50": p50, "p90": p90, "p99": p99, "max": round(float(a.max()), 3), "count": int(a.size)}


def latency_split(measured: list[tuple[str, float, float]], spans: list[dict]) -> dict:
    """The latency of each measured decision (trace id, seen_at, decided_at) in two parts, from inference's
    ``pending_pod`` span of its trace: queue (published -> inference took the pod up: NATS, and the pods before
    it at inference) and decide (took up -> decided). Decisions without that span are left out (``split_count``)."""
    started = {s["trace_id"]: s["start_ns"] / 1e9 for s in spans if s.get("trace_id")
               and s.get("service") == "inference" and s.get("name", "").endswith("pending_pod")}
    queue, decide = [], []
    for trace_id, seen_at, decided_at in measured:
        at = started.get(trace_id) if trace_id else None
        if at is not None:
            queue.append(max(0.0, (at - seen_at) * 1000.0))
            decide.append(max(0.0, (decided_at - at) * 1000.0))
    return {"queue_ms": percentiles(queue), "decide_ms": percentiles(decide), "split_count": len(queue)}


async def probe_health(bus: Bus, service: str, timeout: float = 2.0) -> m.HealthStatus:
    """``service``'s answer to a health probe (its status and details); raises when it does not answer."""
    return await bus.request(subjects.health(service), m.HealthStatus(
        service="agmarl-cli", status="probe", pid=0, metrics_port=0, details={}), m.HealthStatus, timeout=timeout)


async def check_health(bus: Bus, services: tuple[str, ...], timeout: float = 2.0) -> dict[str, str]:
    """service -> "healthy" or the reason it is not (no answer, or what it reported)."""
    out: dict[str, str] = {}
    for service in services:
        try:
            out[service] = (await probe_health(bus, service, timeout)).status
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
