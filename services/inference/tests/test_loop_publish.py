"""The NATS decision loop publishes a decision and decides the next pod before JetStream acknowledges it:
the stream keeps the decision order, shutdown waits for what is unacknowledged, and a decision JetStream
refuses is counted and its assumption forgotten (so the pod's next announcement is decided again)."""

import asyncio
import time
import uuid

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, to_dict
from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.natsserver import NatsServer
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_inference.app import PREPARE_YIELDS, InferenceApp
from agmarl_inference.settings import InferenceSettings

DEADLINE_S = 10.0


async def until(predicate, timeout: float = DEADLINE_S) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return bool(predicate())


async def started_app(url: str, tmp_path) -> tuple[InferenceApp, ServiceRuntime, str]:
    cluster = f"loop{uuid.uuid4().hex[:8]}"
    settings = InferenceSettings(nats_url=url, cluster=cluster, trace_dir=str(tmp_path), pinned_policy="kube-resources")
    rt = ServiceRuntime(f"inference-{cluster}", settings)
    app = InferenceApp(rt, settings)
    await rt.start()
    app.view.apply_snapshot("e1", 1, ClusterState.empty([Node(f"n{k}", 4000, 4000) for k in range(4)]))
    return app, rt, cluster


def pending(cluster: str, k: int) -> m.PendingPod:
    return m.PendingPod(cluster=cluster, pod=to_dict(Pod(f"p{k}", 100, 100)), seen_at=time.time(), seq=k)


def context(rt: ServiceRuntime) -> HandlerContext:
    return HandlerContext(rt, "test", {}, rt.tracer.start_span("test"))


async def test_decisions_reach_the_stream_in_decision_order_and_shutdown_waits_for_their_acks(nats_url, tmp_path):
    app, rt, cluster = await started_app(nats_url, tmp_path)
    bus = await Bus.connect(nats_url, "test-loop-publish")
    got: list[m.Decision] = []
    try:
        await bus.ensure_streams()

        async def on_decision(msg) -> None:
            got.append(m.decode(m.Decision, msg.data))

        await bus.nc.jetstream().subscribe(subjects.decision_wildcard(cluster), cb=on_decision, ordered_consumer=True)
        for k in range(40):  # back to back: each decided while earlier ones still wait for their ack
            await app.on_pending(pending(cluster, k), context(rt))
        assert len(app._unacked) > 1  # the loop went on without waiting for the acknowledgements
        await app.flush_decisions()
        assert not app._unacked
        assert await until(lambda: len(got) == 40)
        assert [d.pod_key for d in got] == [f"default/p{k}" for k in range(40)]
        assert [d.origin_seq for d in got] == list(range(1, 41))
        assert all(app.view.is_assumed(d.pod_key) for d in got)
        assert app.decisions.labels(policy="kube-resources", mode="full", source="loop",
                                    result="scheduled")._value.get() == 40
    finally:
        await bus.close()
        await rt.shutdown()


async def test_a_decision_jetstream_refuses_is_counted_and_its_pod_decided_again(tmp_path):
    server = NatsServer(store_dir=tmp_path / "js")  # its own server: no DECISIONS stream, so the publish fails
    server.start()
    try:
        app, rt, cluster = await started_app(server.url, tmp_path)
        try:
            await app.on_pending(pending(cluster, 0), context(rt))
            assert app.view.is_assumed("default/p0")  # assumed at once, before the acknowledgement
            unpublished = app.decisions.labels(policy="kube-resources", mode="full", source="loop", result="unpublished")
            assert await until(lambda: unpublished._value.get() == 1)
            assert await until(lambda: not app._unacked)
            assert not app.view.is_assumed("default/p0")  # forgotten: its resources are free again
            assert app.view.state.cpu_used.sum() == 0
            seq = app.seq
            await app.on_pending(pending(cluster, 0), context(rt))  # announced again: decided again
            assert app.seq == seq + 1
        finally:
            await rt.shutdown()
    finally:
        server.stop()



async def test_the_policy_prepares_for_the_next_pod_after_the_decision_went_out(nats_url, tmp_path):
    """``prepare_loop``: after a decision, once its publish was handed to the connection, the active policy's
    ``prepare`` gets the view's state with the decision assumed; a policy without ``prepare`` is left alone."""
    app, rt, cluster = await started_app(nats_url, tmp_path)
    calls: list[tuple[float, int]] = []  # (cpu assumed in the state prepared, messages the client had sent)
    app.policy.prepare = lambda state: calls.append((float(state.cpu_used.sum()), rt.bus.nc.stats["out_msgs"]))
    loop = asyncio.get_running_loop().create_task(app.prepare_loop())
    try:
        await rt.bus.ensure_streams()
        sent = rt.bus.nc.stats["out_msgs"]
        await app.on_pending(pending(cluster, 0), context(rt))
        assert not calls  # not inside the decision
        assert await until(lambda: len(calls) == 1)
        assert calls[0][0] == 100  # the state with the pod assumed
        assert calls[0][1] > sent  # the decision's publish went out first
        await app.on_pending(pending(cluster, 1), context(rt))
        assert await until(lambda: len(calls) == 2) and calls[1][0] == 200
        del app.policy.prepare
        await app.on_pending(pending(cluster, 2), context(rt))
        await app.flush_decisions()
        assert len(calls) == 2
    finally:
        loop.cancel()
        await rt.shutdown()


async def test_the_policy_warms_after_prepare_only_when_nothing_waits(nats_url, tmp_path):
    """``prepare_loop``: after ``prepare``, the policy's ``warm`` (work ahead of need) gets the same state when the
    loop is idle; with messages waiting in the client's queues (``backlog``) it is skipped, ``prepare`` is not."""
    app, rt, cluster = await started_app(nats_url, tmp_path)
    calls: list[tuple[str, object]] = []
    app.policy.prepare = lambda state: calls.append(("prepare", state))
    app.policy.warm = lambda state: calls.append(("warm", state))
    waiting = [0]
    rt.backlog = lambda: waiting[0]
    loop = asyncio.get_running_loop().create_task(app.prepare_loop())
    try:
        await rt.bus.ensure_streams()
        await app.on_pending(pending(cluster, 0), context(rt))
        assert await until(lambda: len(calls) == 2)
        assert [c[0] for c in calls] == ["prepare", "warm"] and calls[0][1] is calls[1][1] is app.view.state
        waiting[0] = 3  # a backlog: prepare only
        await app.on_pending(pending(cluster, 1), context(rt))
        assert await until(lambda: len(calls) == 3)
        for _ in range(2 * PREPARE_YIELDS + 2):
            await asyncio.sleep(0)
        assert [c[0] for c in calls] == ["prepare", "warm", "prepare"]
        waiting[0] = 0
        await app.on_pending(pending(cluster, 2), context(rt))
        assert await until(lambda: len(calls) == 5) and [c[0] for c in calls[3:]] == ["prepare", "warm"]
    finally:
        loop.cancel()
        await app.flush_decisions()
        await rt.shutdown()


async def test_a_graph_update_that_leaves_the_view_as_it_was_is_not_prepared_again(nats_url, tmp_path):
    """The bind of a decision the view already assumed (the usual graph update after each decision) leaves the
    view's state as it was: ``prepare_loop`` does not pass the policy the same state twice; an update that
    changes the state (another replica's pod bound) is prepared."""
    from agmarl_common.core.cluster import changes as ch

    app, rt, cluster = await started_app(nats_url, tmp_path)
    prepared: list[object] = []
    app.policy.prepare = prepared.append
    loop = asyncio.get_running_loop().create_task(app.prepare_loop())

    def update(version: int, pod: Pod, node: str) -> m.GraphUpdate:
        return m.GraphUpdate(cluster=cluster, epoch="e1", version=version, full=False,
                             changes=[ch.bound_change(pod, node, ())], time=time.time())

    try:
        await rt.bus.ensure_streams()
        await app.on_pending(pending(cluster, 0), context(rt))
        assert await until(lambda: len(prepared) == 1)
        assert prepared[0] is app.view.state
        node = app.view.node_of("default/p0")
        await app.on_graph(update(2, Pod("p0", 100, 100), node), context(rt))  # the assumed decision, bound
        assert not app.view.is_assumed("default/p0") and app.view.state is prepared[0]
        assert await until(lambda: not app.view_changed.is_set())  # the loop took the change ...
        for _ in range(PREPARE_YIELDS + 2):  # ... and had its turns to prepare it
            await asyncio.sleep(0)
        assert len(prepared) == 1
        await app.on_graph(update(3, Pod("other", 300, 300), "n3"), context(rt))  # a change: prepared
        assert await until(lambda: len(prepared) == 2)
        assert prepared[1] is app.view.state and float(prepared[1].cpu_used.sum()) == 400
        await app.on_pending(pending(cluster, 1), context(rt))
        assert await until(lambda: len(prepared) == 3) and prepared[2] is app.view.state
    finally:
        loop.cancel()
        await app.flush_decisions()
        await rt.shutdown()


async def test_a_decision_is_written_before_the_next_queued_pod_is_decided(nats_url, tmp_path):
    """Pods read off the socket together (after a stall, say) are queued in the subscription at once: each
    decision's publish is written to the connection before the next queued pod's decision starts, not held in
    the client's buffer until that decision ends."""
    from nats.aio.msg import Msg

    cluster = f"loop{uuid.uuid4().hex[:8]}"
    settings = InferenceSettings(nats_url=nats_url, cluster=cluster, trace_dir=str(tmp_path))
    rt = ServiceRuntime(f"inference-{cluster}", settings)
    app = InferenceApp(rt, settings)
    rt.handle(subjects.pending(cluster), m.PendingPod)(app.on_pending)
    await rt.start()
    app.view.apply_snapshot("e1", 1, ClusterState.empty([Node(f"n{k}", 4000, 4000) for k in range(4)]))
    unsent: dict[str, int] = {}  # pod name -> bytes the client still held unwritten when its decision started
    score = app.policy.score

    def recording(pod, state, idx):
        unsent[pod.name] = rt.bus.nc.pending_data_size
        return score(pod, state, idx)

    app.policy.score = recording
    try:
        await rt.bus.ensure_streams()
        await app.on_pending(pending(cluster, 0), context(rt))  # the connection's request inbox exists now
        await app.flush_decisions()
        sub = next(s for s in rt._subscriptions if s.subject == subjects.pending(cluster))
        for k in (1, 2):  # two pods queued at once, as one read of the socket parses them
            sub._pending_queue.put_nowait(Msg(rt.bus.nc, subject=subjects.pending(cluster),
                                              data=m.encode(pending(cluster, k)), _sid=sub._id))
        assert await until(lambda: app.seq == 3)
        assert unsent["p2"] == 0  # p1's decision was on the wire before p2's decision began
        await app.flush_decisions()
        assert app.decisions.labels(policy=app.policy.name, mode="full", source="loop",
                                    result="scheduled")._value.get() == 3
    finally:
        del app.policy.score
        await rt.shutdown()
