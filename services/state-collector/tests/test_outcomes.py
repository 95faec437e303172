"""A decision's outcome event is stored in the EVENTS stream before the decision is acked (the reward-calculator
learns from EVENTS which decisions were bound), on a real nats-server: stored once with its (epoch, seq) as
Nats-Msg-Id; a store that keeps failing raises, so the decision comes again, and the redelivered decision is
not applied twice: its recorded outcome is stored then."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import MSG_ID_HEADER, Bus
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_state_collector.app import CollectorApp
from agmarl_state_collector.settings import CollectorSettings
from agmarl_state_collector.simsource import SimulatedCluster


class NoSpan:
    def set_attribute(self, *args) -> None:
        pass


def pending_pod(sim: SimulatedCluster):
    for _ in range(200):
        pods = sim.state.pending_pods()
        if pods:
            return pods[0]
        sim.advance(5.0)
    raise AssertionError("no pod became pending")


async def stored_events(bus: Bus, cluster: str) -> list:
    sub = await bus.js.subscribe(subjects.event(cluster), ordered_consumer=True)
    out = []
    try:
        while True:
            out.append(await sub.next_msg(timeout=1.0))
    except asyncio.TimeoutError:
        pass
    finally:
        await sub.unsubscribe()
    return out


async def test_an_outcome_is_stored_before_the_ack_and_a_redelivery_is_not_applied_twice(nats_url):
    cluster = "outcomes"
    settings = CollectorSettings(nats_url=nats_url, cluster=cluster, event_store_seconds=0.3)
    rt = ServiceRuntime("state-collector", settings)
    sim = SimulatedCluster.create(n_nodes=4, zones=1, workload="diurnal", rate=1.0, seed=1, chunk_seconds=60,
                                  retry_seconds=2.0)
    app = CollectorApp(rt, settings, sim)
    async with rt:
        await rt.bus.ensure_stream(subjects.EVENTS)
        pod = pending_pod(sim)
        node = sim.state.cluster.nodes[0].name
        decision = m.Decision(decision_id="d-1", cluster=cluster, namespace=pod.namespace, pod_key=pod.key,
                              node=node, policy="fgd", mode="full", seen_at=time.time(), decided_at=time.time())
        failures = []

        async def failing(subject, msg, js=False, msg_id=None, headers=None):
            failures.append(msg_id)
            raise TimeoutError("nats: timeout")  # NATS restarting: nothing stored

        # the first delivery: applied (the pod is bound or refused), its outcome not stored: the handler raises,
        # so the runtime does not ack and the decision comes again
        with pytest.raises(TimeoutError):
            await app.on_decision(decision, SimpleNamespace(publish=failing, span=NoSpan()))
        assert len(failures) >= 2 and len(set(failures)) == 1  # retried under one Nats-Msg-Id
        outcome, stored = app.applied["d-1"]
        assert not stored and outcome.type in ("pod_bound", "bind_rejected") and outcome.decision_id == "d-1"
        applied = (app.bound_total._value.get(), app.rejected_total._value.get())
        assert sum(applied) == 1
        # the redelivery: not applied again (the counters stay), its recorded outcome stored now
        await app.on_decision(decision, SimpleNamespace(publish=rt.publish, span=NoSpan()))
        assert (app.bound_total._value.get(), app.rejected_total._value.get()) == applied
        assert app.applied["d-1"][1] and app.stale_total._value.get() == 1
        # once more (an ack lost): nothing stored twice, nothing applied
        await app.on_decision(decision, SimpleNamespace(publish=rt.publish, span=NoSpan()))
        bus = await Bus.connect(nats_url, "outcomes-reader")
        try:
            events = await stored_events(bus, cluster)
        finally:
            await bus.close()
    outcomes = [e for e in events if m.decode(m.ClusterEvent, e.data).decision_id == "d-1"]
    assert len(outcomes) == 1
    assert outcomes[0].headers[MSG_ID_HEADER] == f"{outcome.epoch}-{outcome.seq}" == failures[0]
    assert m.decode(m.ClusterEvent, outcomes[0].data) == outcome
