"""graph-builder on a real nats-server: the first snapshot goes out as a full graph, each event as the next
version's change, a snapshot after a missed event repairs the graph with a diff, a restarted collector
(new epoch) gets a new full graph, and graph_sync answers the current graph."""

from __future__ import annotations

import asyncio
import contextlib
import time

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.compact import compact_snapshot
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, state_from_dict, to_dict
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_graph_builder.app import GraphBuilderApp
from agmarl_graph_builder.settings import GraphBuilderSettings

CLUSTER = "gb-test"
NODES = (Node("a", 4000, 4000), Node("b", 4000, 4000))


def snapshot(epoch: str, seq: int, state: ClusterState) -> m.ClusterSnapshot:
    return m.ClusterSnapshot(cluster=CLUSTER, seq=seq, time=float(seq), state=compact_snapshot(state), epoch=epoch)


def bound_event(epoch: str, seq: int, pod: Pod, node: str) -> m.ClusterEvent:
    return m.ClusterEvent(cluster=CLUSTER, seq=seq, epoch=epoch, type="pod_bound", pod_key=pod.key, node=node,
                          time=float(seq), pod=to_dict(pod))


async def until(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.02)
    return False


@contextlib.asynccontextmanager
async def running(nats_url: str):
    settings = GraphBuilderSettings(nats_url=nats_url, cluster=CLUSTER)
    rt = ServiceRuntime("graph-builder", settings)
    app = GraphBuilderApp(rt, settings)
    rt.handle(subjects.snapshot(CLUSTER), m.ClusterSnapshot)(app.on_snapshot)
    rt.handle(subjects.event(CLUSTER), m.ClusterEvent)(app.on_event)
    rt.handle_request(subjects.graph_sync(CLUSTER), m.GraphSync, m.GraphUpdate)(app.on_sync)
    async with rt:
        yield app


async def test_versions_follow_snapshots_and_events(nats_url):
    bus = await Bus.connect(nats_url, name="test-graph-builder")
    got: list[m.GraphUpdate] = []

    async def on_update(msg):
        got.append(m.decode(m.GraphUpdate, msg.data))

    try:
        await bus.subscribe(subjects.graph(CLUSTER), on_update)
        async with running(nats_url) as app:
            empty = ClusterState.empty(NODES)
            p, q, r = Pod("p", 1000, 100), Pod("q", 500, 100), Pod("r", 700, 100)
            await bus.publish(subjects.snapshot(CLUSTER), snapshot("e1", 1, empty))
            assert await until(lambda: len(got) == 1)
            assert got[0].full and got[0].version == 1 and state_from_dict(got[0].state).n_nodes == 2

            await bus.publish(subjects.event(CLUSTER), bound_event("e1", 2, p, "a"))
            assert await until(lambda: len(got) == 2)
            assert not got[1].full and got[1].version == 2 and got[1].epoch == got[0].epoch
            assert [c["op"] for c in got[1].changes] == ["bound"] and got[1].changes[0]["node"] == "a"

            # q's event (seq 3) is lost; r's (seq 4) arrives after a gap: applied, and the next snapshot repairs
            await bus.publish(subjects.event(CLUSTER), bound_event("e1", 4, r, "b"))
            assert await until(lambda: len(got) == 3)
            truth = bind(bind(bind(empty, p, 0), q, 1), r, 1)
            await bus.publish(subjects.snapshot(CLUSTER), snapshot("e1", 5, truth))
            assert await until(lambda: len(got) == 4)
            assert not got[3].full and [(c["op"], c["pod"]["name"]) for c in got[3].changes] == [("bound", "q")]
            assert app.view.state.cpu_used.tolist() == [1000, 1200]

            # graph_sync: the current graph, in full, at the current version
            sync = await bus.request(subjects.graph_sync(CLUSTER), m.GraphSync(cluster=CLUSTER), m.GraphUpdate)
            assert sync.full and sync.version == got[3].version
            assert state_from_dict(sync.state).cpu_used.tolist() == [1000, 1200]

            # a restarted collector (new epoch, seq from 1 again): a full graph, not a frozen view
            await bus.publish(subjects.snapshot(CLUSTER), snapshot("e2", 1, bind(empty, p, 1)))
            assert await until(lambda: len(got) == 5)
            assert got[4].full and got[4].version == 5
            assert state_from_dict(got[4].state).cpu_used.tolist() == [0, 1000]
            # a stale event of the old run changes nothing
            await bus.publish(subjects.event(CLUSTER), bound_event("e1", 6, q, "a"))
            await bus.flush()
            assert await until(lambda: app.dropped.labels(reason="stale")._value.get() >= 1)
            assert len(got) == 5
    finally:
        await bus.close()
