"""Bad input against running services on a real NATS: malformed msgpack, schema violations and
oversized messages on every subject a service consumes are rejected, counted, logged and
dead-lettered, and every service keeps running and keeps scheduling."""

from __future__ import annotations

import msgpack
import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_testing.fixtures import wait_healthy

from .conftest import SERVICES, metric_value, module_of, scrape, wait_for

CLUSTER = "badinput"
OVERSIZED = b"\x00" * (m.MAX_MESSAGE_BYTES + 1024)
MALFORMED = b"\xc1\xff not msgpack"
WRONG_SCHEMA = msgpack.packb({"v": 1, "unexpected": "field"})

# subject -> services that consume it
CONSUMED = {
    subjects.pending(CLUSTER): ("inference",),
    subjects.snapshot(CLUSTER): ("graph-builder", "reward-calculator", "adaptive-engine"),
    subjects.event(CLUSTER): ("graph-builder",),
    subjects.graph(CLUSTER): ("inference",),
    subjects.decision(CLUSTER, "default"): ("state-collector", "reward-calculator"),
    subjects.reward(CLUSTER): ("adaptive-engine",),
    subjects.policy_selection(): ("inference",),
    subjects.train_request(): ("trainer",),
}


@pytest.mark.asyncio
async def test_bad_messages_are_rejected_counted_dead_lettered_and_services_survive(nats_url, service_processes,
                                                                                   tmp_path):
    env = {"NATS_URL": nats_url, "AGMARL_CLUSTER": CLUSTER, "AGMARL_TRACE_DIR": str(tmp_path / "traces"),
           "AGMARL_SIM_NODES": "10"}
    procs = {s: service_processes(module_of(s), env=env) for s in SERVICES}
    bus = await Bus.connect(nats_url, name="test-bad-input")
    try:
        ports = {s: (await wait_healthy(bus, s, timeout=60, proc=procs[s])).metrics_port for s in SERVICES}
        dead: dict[str, list[m.DeadLetter]] = {s: [] for s in SERVICES}

        def collector(service):
            async def cb(msg):
                dead[service].append(m.decode(m.DeadLetter, msg.data))
            return cb

        for s in SERVICES:
            await bus.subscribe(subjects.dead_letter(s), collector(s))
        await bus.flush()

        for subject in CONSUMED:
            for payload in (MALFORMED, WRONG_SCHEMA, OVERSIZED):
                await bus.publish(subject, payload)
        await bus.flush()

        expected = {s: 0 for s in SERVICES}
        for consumers in CONSUMED.values():
            for s in consumers:
                expected[s] += 3

        async def all_dead_lettered():
            return all(len(dead[s]) >= expected[s] for s in SERVICES)

        assert await wait_for(all_dead_lettered, timeout=15), {s: len(v) for s, v in dead.items()}
        for s in SERVICES:
            kinds = sorted(d.kind for d in dead[s])
            per = expected[s] // 3
            assert kinds.count("malformed") >= per and kinds.count("schema") >= per \
                and kinds.count("oversized") >= per, (s, kinds)
            text = scrape(ports[s])
            for reason in ("malformed", "schema", "oversized"):
                assert metric_value(text, "agmarl_messages_rejected_total", service=s, reason=reason) >= per, \
                    (s, reason)
            assert "rejected" in procs[s].output(), f"{s} logged no rejection line"

        # every service is still alive and healthy, and the loop still schedules
        for s in SERVICES:
            assert procs[s].returncode is None, procs[s].output()[-2000:]
            await wait_healthy(bus, s, timeout=10, proc=procs[s])
        decisions: list[m.Decision] = []

        async def on_decision(msg):
            try:
                decisions.append(m.decode(m.Decision, msg.data))
            except m.DecodeError:
                pass

        await bus.subscribe(subjects.decision_wildcard(CLUSTER), on_decision)
        assert await wait_for(lambda: len(decisions) >= 3, timeout=20), "no decisions after bad input"
    finally:
        await bus.close()
