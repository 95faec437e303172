"""Snapshots of a large cluster reach a real consumer (real NATS, the services' decoding middleware, the
1 MiB limit) and decode to the collector's exact state; a snapshot over the limit is counted, logged and
not published, and the collector carries on."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import numpy as np
import pytest
from nats.errors import MaxPayloadError
from prometheus_client import CollectorRegistry

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.model import MAX_GPUS, ClusterState, choose_gpus, state_from_dict, state_to_dict, to_dict
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_common.runtime.settings import CommonSettings
from agmarl_common.core.sim import dynamic
from agmarl_common.core.sim.traces import load_openb_nodes, load_openb_pods
from agmarl_state_collector.app import CollectorApp
from agmarl_state_collector.settings import CollectorSettings
from agmarl_state_collector.simsource import SimulatedCluster

N_BOUND = 7000  # the full form is ~1.45 MB: over the limit since ~3,500 bound pods


def openb_cluster(n_bound: int) -> ClusterState:
    """The 1,523 openb nodes holding the first ``n_bound`` openb pods that fit (seeded spread)."""
    nodes, pods = load_openb_nodes(), load_openb_pods()
    cpu, mem = np.array([n.cpu_milli for n in nodes]), np.array([n.memory_mib for n in nodes])
    model = np.array([n.gpu_model for n in nodes])
    gfree = np.where(np.arange(MAX_GPUS)[None, :] < np.array([n.gpu_count for n in nodes])[:, None], 1000, 0)
    bound: list[list[dict]] = [[] for _ in nodes]
    placed = 0
    for k, p in enumerate(pods):
        if placed == n_bound:
            break
        ok = (cpu >= p.cpu_milli) & (mem >= p.memory_mib)
        if p.num_gpu:
            ok &= (gfree >= p.gpu_milli).sum(axis=1) >= p.num_gpu
            ok &= np.isin(model, p.gpu_spec) if p.gpu_spec else True
        fit = np.flatnonzero(ok)
        if fit.size == 0:
            continue
        i = int(fit[(k * 7919) % fit.size])
        gpus = choose_gpus(p, gfree[i]) if p.num_gpu else ()
        cpu[i] -= p.cpu_milli
        mem[i] -= p.memory_mib
        for j in gpus:
            gfree[i, j] -= p.gpu_milli if p.is_gpu_share else 1000
        bound[i].append(to_dict(replace(p, node_name=nodes[i].name, gpu_devices=tuple(gpus))))
        placed += 1
    assert placed == n_bound
    return state_from_dict({"nodes": [to_dict(n) for n in nodes], "bound": bound})


@pytest.fixture(scope="module")
def large() -> ClusterState:
    return openb_cluster(N_BOUND)


def simulated(cluster: ClusterState) -> SimulatedCluster:
    """The collector's simulated source, its cluster replaced by ``cluster``."""
    sim = SimulatedCluster.create(n_nodes=4, zones=1, workload="diurnal", rate=1.0, seed=1, chunk_seconds=60,
                                  retry_seconds=2.0)
    sim.state = replace(dynamic.reset(cluster.nodes, [], sim.config, 1), cluster=cluster)
    return sim


def total(registry: CollectorRegistry, name: str) -> float:
    return sum(s.value for metric in registry.collect() for s in metric.samples if s.name == name)


async def until(predicate, timeout: float = 10.0) -> bool:
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return bool(predicate())


async def test_a_large_snapshot_is_accepted_by_a_real_consumer(nats_url, large):
    cluster = "big-snapshot"
    collector = ServiceRuntime("state-collector", CollectorSettings(nats_url=nats_url, cluster=cluster))
    consumer = ServiceRuntime("snapshot-consumer", CommonSettings(nats_url=nats_url, cluster=cluster))
    got: list[tuple[m.ClusterSnapshot, ClusterState]] = []

    @consumer.handle(subjects.snapshot(cluster), m.ClusterSnapshot)
    async def on_snapshot(msg: m.ClusterSnapshot, ctx) -> None:  # as graph-builder / inference decode it
        got.append((msg, state_from_dict(msg.state)))

    app = CollectorApp(collector, collector.settings, simulated(large))
    async with consumer, collector:
        await app.publish_snapshot()
        assert await until(lambda: got), "the consumer did not accept the snapshot"
        # the full form, as published before, is over the server's max_payload: refused before any consumer
        bus = await Bus.connect(nats_url, "full-form")
        try:
            with pytest.raises(MaxPayloadError):
                await bus.publish(subjects.snapshot(cluster), m.ClusterSnapshot(
                    cluster=cluster, seq=99, time=0.0, state=state_to_dict(large)))
            await bus.flush()
        finally:
            await bus.close()
    msg, state = got[0]
    assert len(got) == 1 and msg.seq == 1 and int(state.pods_used.sum()) == N_BOUND
    size = app.snapshots.bytes_gauge._value.get()
    print(f"state-collector snapshot, 1523 openb nodes, {N_BOUND} bound pods: {int(size)} bytes")
    assert size < m.MAX_MESSAGE_BYTES < len(m.encode(m.ClusterSnapshot(cluster=cluster, seq=1, time=0.0,
                                                                         state=state_to_dict(large))))
    assert state.nodes == large.nodes and state.bound == large.bound  # identity, specs, nodes, devices
    for k in ("cpu_used", "mem_used", "pods_used", "gpu_used", "eph_used", "affinity_pods"):
        assert np.array_equal(getattr(state, k), getattr(large, k)), k
    assert total(collector.registry, "agmarl_snapshots_oversized_total") == 0


async def test_an_oversized_snapshot_is_counted_logged_and_skipped(nats_url, large, caplog):
    cluster = "over-limit"
    settings = CollectorSettings(nats_url=nats_url, cluster=cluster, max_message_bytes=100_000)
    collector = ServiceRuntime("state-collector", settings)
    seen: list[m.ClusterSnapshot] = []
    app = CollectorApp(collector, settings, simulated(large))
    async with collector:
        bus = await Bus.connect(nats_url, "watcher")

        async def on_snapshot(raw) -> None:
            seen.append(m.decode(m.ClusterSnapshot, raw.data))

        try:
            await bus.subscribe(subjects.snapshot(cluster), on_snapshot)
            await bus.flush()  # the server knows the subscription before the collector's connection publishes
            with caplog.at_level(logging.ERROR, logger="agmarl.state-collector"):
                await app.publish_snapshot()
                await app.publish_snapshot()
            assert total(collector.registry, "agmarl_snapshots_oversized_total") == 2
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1 and "exceeds the message limit of 100000 bytes" in errors[0]
            assert f"1523 nodes, {N_BOUND} bound pods" in errors[0]
            app.snapshots.max_bytes = m.MAX_MESSAGE_BYTES  # the collector kept going: the next one fits
            await app.publish_snapshot()
            assert await until(lambda: seen)
        finally:
            await bus.close()
    assert [s.seq for s in seen] == [3]


async def test_a_snapshot_is_built_off_the_loop_and_a_decision_meanwhile_comes_after_it(nats_url, monkeypatch):
    """While a snapshot is built (in a worker thread) the collector goes on announcing pods; a decision that
    arrives meanwhile is applied once the snapshot is out, its event numbered and published after it."""
    import threading
    from types import SimpleNamespace

    from agmarl_common.core.cluster.model import Node, Pod
    from agmarl_state_collector import app as collector_app
    from agmarl_state_collector.replay import InflationReplay

    class NoSpan:
        def set_attribute(self, *args) -> None:
            pass

    building, release = threading.Event(), threading.Event()
    build = collector_app.built_snapshot

    def held(*args):  # a snapshot that takes as long as the test says
        building.set()
        assert release.wait(10.0)
        return build(*args)

    monkeypatch.setattr(collector_app, "built_snapshot", held)
    cluster = "snapshot-off-loop"
    settings = CollectorSettings(nats_url=nats_url, cluster=cluster)
    rt = ServiceRuntime("state-collector", settings)
    nodes = tuple(Node(f"n{k}", 8000, 16000, gpu_count=2, gpu_model="T4") for k in range(3))
    pods = tuple(Pod(f"p{k}", 1000, 1000, num_gpu=1, gpu_milli=1000) for k in range(6))
    replay = InflationReplay(nodes, pods, seed=1, in_flight=10)
    app = CollectorApp(rt, settings, replay)
    seen: list[tuple[str, int]] = []  # (kind, seq) in the order they reached a subscriber
    async with rt:
        await rt.bus.ensure_stream(subjects.EVENTS)
        bus = await Bus.connect(nats_url, "snapshot-watcher")

        async def on_msg(raw) -> None:
            kind = raw.subject.split(".")[2]
            msg = m.decode({"pending": m.PendingPod, "snapshot": m.ClusterSnapshot, "event": m.ClusterEvent}[kind],
                           raw.data)
            seen.append((kind, msg.seq))

        try:
            for subject in (subjects.pending(cluster), subjects.snapshot(cluster), subjects.event(cluster)):
                await bus.subscribe(subject, on_msg)
            snapshot = rt.spawn(app.publish_snapshot())
            assert await until(building.is_set)
            await app.tick()  # the loop is free: the tick announces the first pod while the snapshot builds
            assert await until(lambda: [k for k, _ in seen] == ["pending"])
            pod = replay.arrivals[0]
            decision = m.Decision(decision_id="d-1", cluster=cluster, namespace=pod.namespace, pod_key=pod.key,
                                  node="n0", gpus=[0], policy="fgd", mode="full", seen_at=time.time(),
                                  decided_at=time.time())
            applying = asyncio.get_running_loop().create_task(
                app.on_decision(decision, SimpleNamespace(publish=rt.publish, span=NoSpan())))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not applying.done() and replay.is_pending(pod.key)  # it waits for the snapshot
            release.set()
            await asyncio.wait_for(asyncio.gather(snapshot, applying), 10.0)
            assert not replay.is_pending(pod.key)
            assert await until(lambda: len(seen) >= 3)
        finally:
            release.set()
            await bus.close()
    kinds = [k for k, _ in seen]
    assert kinds[:3] == ["pending", "snapshot", "event"]
    assert seen[2][1] > seen[1][1]  # the decision's event is numbered after the snapshot
