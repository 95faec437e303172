"""Supervision (issue 14.5) with real processes: the System `agmarl up` runs (authenticated embedded
nats-server, state-collector with its simulator, graph-builder, inference). A service killed with SIGKILL
is restarted and healthy again, counted as "exited -9"; the nats-server killed with SIGKILL is restarted on
the same port with the same credentials, the services reconnect, and decisions go on."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from agmarl_cli.keys import local_model_keys
from agmarl_cli.supervisor import NATS, System
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_testing.fixtures import wait_healthy

DECIDERS = ("state-collector", "graph-builder", "inference")
CLUSTER = "supervised"


class Decisions:
    """Counts the decisions published on the cluster's subjects (core NATS: survives a reconnect)."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()

    async def on_msg(self, msg) -> None:
        self.count += 1
        self.changed.set()

    async def more_than(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.count <= n and time.monotonic() < deadline:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
        return self.count > n


async def supervise_until(system: System, done, timeout: float) -> list[str]:
    """Supervision rounds (as `agmarl up` runs them) until ``done(system.report())`` (bounded)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines += [str(e) for e in await asyncio.to_thread(system.supervise)]
        if done(system.report()):
            return lines
        await asyncio.sleep(0.2)
    raise AssertionError(f"supervision did not get there within {timeout}s: {system.report()} {lines}")


@pytest.fixture
def system(tmp_path, monkeypatch):
    for name in ("NATS_URL", "AGMARL_NATS_URL", "AGMARL_NATS_CREDS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGMARL_STATE_DIR", str(tmp_path / ".state"))
    system = System(root=tmp_path / ".state", run_id="supervision")
    system.root.mkdir(parents=True)
    try:
        system.start_nats()
        system.start_services({**local_model_keys(system.root), "AGMARL_CLUSTER": CLUSTER}, services=DECIDERS)
        yield system
    finally:
        system.stop()


async def test_killed_service_and_nats_server_are_restarted_and_decisions_go_on(system):
    bus = await Bus.connect(system.nats_url, "test-supervision", auth=system.cli_auth())
    decisions = Decisions()
    try:
        await bus.subscribe(subjects.decision_wildcard(CLUSTER), decisions.on_msg)
        for service in DECIDERS:
            await wait_healthy(bus, service, timeout=90)
        assert await decisions.more_than(3, timeout=60), "no decisions before the faults"

        # a service killed with SIGKILL: restarted with the same environment, healthy again, counted
        os.kill(system.procs["inference"].pid, signal.SIGKILL)
        lines = await supervise_until(system, lambda r: r["inference"]["restarts"] == 1, timeout=30)
        assert any(line.startswith("inference exited -9") for line in lines), lines
        await wait_healthy(bus, "inference", timeout=90)
        before = decisions.count
        assert await decisions.more_than(before + 3, timeout=60), "no decisions after inference's restart"
        assert system.report()["inference"] == {"restarts": 1, "exits": ["exited -9"], "running": True}

        # the nats-server killed with SIGKILL: same port, store and credentials; everyone reconnects
        port, old_pid = system.nats.port, system.nats.pid
        os.kill(old_pid, signal.SIGKILL)
        lines = await supervise_until(system, lambda r: r[NATS]["restarts"] == 1, timeout=30)
        assert system.report()[NATS]["exits"] == ["exited -9"], lines
        assert system.nats.port == port and system.nats.pid != old_pid
        for service in DECIDERS:
            await wait_healthy(bus, service, timeout=90)  # its connection came back (and ours)
        before = decisions.count
        assert await decisions.more_than(before + 3, timeout=60), "no decisions after the NATS restart"
        assert all(r["exits"] == [] for name, r in system.report().items() if name not in ("inference", NATS))
        assert all(system.procs[s].poll() is None for s in DECIDERS)
    finally:
        await bus.close()
