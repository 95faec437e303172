"""Horizontal scaling and what Grafana reads, against real processes on a real NATS:

- two inference replicas share the pending pods through a NATS queue group, each keeping its own replica of
  graph-builder's cluster graph (one graph-builder owns the versions): both replicas decide, decisions stay
  feasible (0 violations, no refused binds beyond what retries absorb);
- every metric the Grafana dashboards query is exported by some running service (scraped /metrics).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_testing.fixtures import health_until, wait_healthy

from .conftest import metric_value, module_of, scrape, wait_for

CLUSTER = "replicas"
ROOT = Path(__file__).resolve().parents[2]


def exported_families(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, flags=re.M))


@pytest.mark.asyncio
async def test_two_replicas_share_work_and_dashboards_read_exported_metrics(nats_url, service_processes, tmp_path):
    env = {"NATS_URL": nats_url, "AGMARL_CLUSTER": CLUSTER, "AGMARL_TRACE_DIR": str(tmp_path / "traces"),
           "AGMARL_SIM_NODES": "30", "AGMARL_HTTP_PORT": "0"}
    layout = ["state-collector", "graph-builder", "inference", "inference", "reward-calculator",
              "adaptive-engine", "trainer"]
    procs = [(s, service_processes(module_of(s), env=env)) for s in layout]
    bus = await Bus.connect(nats_url, name="test-replicas")
    try:
        for s, p in procs:
            await wait_healthy(bus, s, timeout=60, proc=p)
        decisions: list[m.Decision] = []
        stats: list[dict] = []

        async def on_decision(msg):
            decisions.append(m.decode(m.Decision, msg.data))

        async def on_snapshot(msg):
            stats.append(m.decode(m.ClusterSnapshot, msg.data).stats)

        await bus.subscribe(subjects.decision_wildcard(CLUSTER), on_decision)
        await bus.subscribe(subjects.snapshot(CLUSTER), on_snapshot)
        assert await wait_for(lambda: len({d.origin for d in decisions}) >= 2 and len(decisions) >= 60, timeout=40), \
            f"{len(decisions)} decisions from {len({d.origin for d in decisions})} inference replicas"

        # each replica found its own port through its health answer; scrape them all
        # (health_until retries: a service busy for a moment on a loaded machine answers the next ask)
        ports: dict[str, set[int]] = {}
        for s, p in procs:
            status = await health_until(bus, s, lambda st: st.metrics_port > 0, timeout=30, proc=p,
                                        what="reporting its metrics port")
            ports.setdefault(s, set()).add(status.metrics_port)
        # health is answered by one replica at a time: ask until both replicas' ports are known
        for s in ("inference",):
            def new_port(st: m.HealthStatus, service: str = s) -> bool:
                ports[service].add(st.metrics_port)
                return len(ports[service]) == 2
            await health_until(bus, s, new_port, timeout=30, what="answering from both replicas")
        for port in ports["graph-builder"]:
            assert metric_value(scrape(port), "agmarl_graph_updates_total", kind="delta") > 0, "no graph versions"
        for port in ports["inference"]:
            assert metric_value(scrape(port), "agmarl_decisions_total", source="loop") > 0, \
                "an idle inference replica"
        assert stats and max(s.get("violations", 0) for s in stats) == 0
        assert stats[-1].get("bound", 0) > 0

        families: set[str] = set()
        for service, service_ports in ports.items():
            for port in service_ports:
                families |= exported_families(scrape(port))
        wanted = [ln.strip() for ln in (ROOT / "tests/deploy/dashboard_metrics.txt").read_text().splitlines()
                  if ln.strip() and not ln.startswith("#")]
        missing = [name for name in wanted if name not in families and name.removesuffix("_total") not in families]
        assert not missing, f"dashboards query metrics no service exports: {missing}"
    finally:
        await bus.close()
