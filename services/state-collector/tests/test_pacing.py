"""A tick's arrivals are announced as the simulator created them, spread over the tick, not in one burst
(`agmarl up`'s decision latency counted a tick's pods queueing behind one another at inference), on a real
nats-server; the pacing's clock is a fake one, so nothing here depends on the machine's speed."""

from __future__ import annotations

import asyncio

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_state_collector.app import CollectorApp
from agmarl_state_collector.settings import CollectorSettings
from agmarl_state_collector.simsource import SimulatedCluster, paced


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def test_paced_offsets_follow_creation_times_and_older_pods_go_at_once():
    sim = SimulatedCluster.create(n_nodes=8, zones=2, workload="diurnal", rate=8.0, seed=5, chunk_seconds=120,
                                  retry_seconds=2.0)
    sim.advance(10.0)
    old = sim.due(now=0.0)
    since = sim.state.time
    sim.advance(2.5)
    new = [p for p in sim.due(now=0.0)]
    assert old and len(new) >= 2
    out = paced(old[:2] + new, since, time_scale=10.0)
    assert [o for o, _ in out] == sorted(o for o, _ in out)
    for offset, pod in out:
        assert offset == pytest.approx(max(0.0, (pod.creation_time - since) / 10.0))
    assert all(offset == 0.0 for offset, pod in out if pod in old[:2])


async def test_a_ticks_arrivals_are_announced_at_their_creation_times_not_at_once(nats_url):
    cluster = "pacing"
    settings = CollectorSettings(nats_url=nats_url, cluster=cluster, tick_seconds=0.25, sim_time_scale=10.0)
    sim = SimulatedCluster.create(n_nodes=8, zones=2, workload="diurnal", rate=8.0, seed=5, chunk_seconds=120,
                                  retry_seconds=2.0)
    rt = ServiceRuntime("state-collector", settings)
    app = CollectorApp(rt, settings, sim)
    clock = FakeClock()
    app.clock, app.sleep = clock, clock.sleep
    published: list[tuple[float, str, float]] = []  # (fake time, pod, creation time)
    announce = app.announce

    async def recording(pod) -> None:
        published.append((clock(), pod.key, pod.creation_time))
        await announce(pod)
    app.announce = recording
    received: list[str] = []
    last: list[str] = []
    got = asyncio.Event()

    async with rt:
        async def on_pending(msg) -> None:
            received.append(m.decode(m.PendingPod, msg.data).pod["name"])
            if last and received[-1] == last[0]:
                got.set()
        await rt.bus.subscribe(subjects.pending(cluster), on_pending)
        for _ in range(40):  # ticks until one holds pods created at different times
            since, started = sim.state.time, clock()
            published.clear()
            await app.announce_paced(await app.tick(), started)
            if len({c for _, _, c in published if c >= since}) >= 2:
                break
        else:
            raise AssertionError("no tick with two arrivals at different times")
        new = [(t - started, c) for t, _, c in published if c >= since]
        # each new pod went out as far into the tick as it was created; before the fix all at the tick's start
        for offset, created in new:
            assert offset == pytest.approx((created - since) / settings.sim_time_scale)
            assert 0.0 <= offset < settings.tick_seconds
        assert len({round(o, 9) for o, _ in new}) >= 2
        assert app.announced >= len(published)
        keys = [k.split("/", 1)[1] for _, k, _ in published]
        last.append(keys[-1])
        if keys[-1] not in received:
            await asyncio.wait_for(got.wait(), 10)
    assert received[-len(keys):] == keys  # on NATS, in the order announced


async def test_a_pod_announced_while_a_decision_is_handled_starts_its_own_trace(nats_url):
    """A retry announced from a decision's handler was one more child of that decision's trace (16 pods in one
    trace): each announcement is a root, so its decision's latency and spans are its own."""
    cluster = "roots"
    settings = CollectorSettings(nats_url=nats_url, cluster=cluster)
    sim = SimulatedCluster.create(n_nodes=4, zones=1, workload="diurnal", rate=4.0, seed=2, chunk_seconds=60,
                                  retry_seconds=2.0)
    sim.advance(10.0)
    pods = sim.due(now=0.0)[:2]
    assert len(pods) == 2
    rt = ServiceRuntime("state-collector", settings)
    app = CollectorApp(rt, settings, sim)
    parents: list[str] = []
    got = asyncio.Event()
    async with rt:
        async def on_pending(msg) -> None:
            parents.append((msg.headers or {}).get("traceparent", ""))
            if len(parents) == 2:
                got.set()
        await rt.bus.subscribe(subjects.pending(cluster), on_pending)
        with rt.tracer.start_as_current_span("state-collector decision") as outer:
            for pod in pods:
                await app.announce(pod)
        await asyncio.wait_for(got.wait(), 10)
    outer_trace = format(outer.get_span_context().trace_id, "032x")
    traces = [p.split("-")[1] for p in parents]
    assert all(traces) and outer_trace not in traces and traces[0] != traces[1]


def test_a_pod_is_announced_again_later_while_the_binder_lags():
    """A pod whose announcement got no decision is announced again after 10 retry periods; while the decisions
    reaching the binder are old (it lags), twice that lag later, so that a pod whose decision is still queued is
    not decided a second time; once the binder has caught up, after 10 retry periods again."""
    sim = SimulatedCluster.create(n_nodes=8, zones=2, workload="diurnal", rate=8.0, seed=5, chunk_seconds=120,
                                  retry_seconds=2.0)
    sim.advance(10.0)
    first = {p.key for p in sim.due(now=0.0)}
    assert first and not sim.due(now=19.0)
    assert {p.key for p in sim.due(now=20.5)} >= first  # lost: announced again
    sim.note_applied(15.0)  # the binder applies decisions made 15 s ago
    assert not sim.due(now=41.0) and not sim.due(now=70.0)  # 20 s + 2 x 15 s after the last announcement (20.5)
    assert {p.key for p in sim.due(now=71.0)} >= first
    sim.note_applied(0.2)  # caught up
    assert not sim.due(now=91.0) and {p.key for p in sim.due(now=91.5)} >= first
    sim.note_applied(1e9)  # a clock far off: held at most 2 x MAX_LAG_S more
    assert not sim.due(now=91.5 + 20 + 599) and {p.key for p in sim.due(now=91.5 + 20 + 600.5)} >= first
