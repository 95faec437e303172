"""Bus against a real nats-server: trace headers, request/reply, JetStream durability and dedup,
KV and Object Store."""
import asyncio
import datetime
import hashlib
import tempfile
import time
import uuid

import pytest
from opentelemetry import trace

from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.messages import ClusterEvent, Decision, Experience, HealthStatus, PolicySelection, decode, encode
from agmarl_common.runtime.natsserver import NatsServer, free_port
from agmarl_common.runtime.telemetry import extract, setup_tracing, shutdown_tracing


def _decision(i: int, cluster: str = "sim") -> Decision:
    return Decision(decision_id=f"d{i}", cluster=cluster, namespace="team-a", pod_key=f"team-a/p{i}", node="n0",
                    policy="gnn", mode="full", seen_at=float(i), decided_at=float(i) + 0.01)


async def _until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


async def test_publish_carries_trace_context_to_consumer(nats_url, tmp_path):
    producer_tp = setup_tracing("producer", str(tmp_path), set_global=False)
    consumer_tp = setup_tracing("consumer", str(tmp_path), set_global=False)
    bus = await Bus.connect(nats_url, "test-trace")
    seen: list[tuple[str, str, str]] = []

    async def on_msg(msg):
        event = decode(ClusterEvent, msg.data)
        with consumer_tp.get_tracer("c").start_as_current_span("consume", context=extract(msg.headers)) as span:
            ctx = span.get_span_context()
            seen.append((event.pod_key, format(ctx.trace_id, "032x"), msg.headers.get("Agmarl-Kind", "")))

    try:
        subject = subjects.event(f"trace-{uuid.uuid4().hex[:8]}")
        await bus.subscribe(subject, on_msg)
        await bus.flush()
        event = ClusterEvent(cluster="sim", seq=1, type="pod_added", pod_key="a/p", time=1.0)
        with producer_tp.get_tracer("p").start_as_current_span("produce") as span:
            producer_trace = format(span.get_span_context().trace_id, "032x")
            await bus.publish(subject, event)
        await bus.publish(subject, event.model_copy(update={"pod_key": "a/q"}))  # no span: new trace
        assert await _until(lambda: len(seen) == 2)
    finally:
        await bus.close()
        shutdown_tracing(producer_tp)
        shutdown_tracing(consumer_tp)
    assert seen[0] == ("a/p", producer_trace, "event")
    assert seen[1][1] != producer_trace
    assert trace.get_current_span().get_span_context().is_valid is False


async def test_request_reply(nats_url):
    bus = await Bus.connect(nats_url, "test-rr")
    try:
        async def responder(msg):
            await bus.nc.publish(msg.reply, encode(HealthStatus(service="x", status="healthy", pid=1,
                                                                metrics_port=len(msg.data))))
        subject = subjects.health(f"rr-{uuid.uuid4().hex[:8]}")
        await bus.subscribe(subject, responder)
        reply = await bus.request(subject, b"abc", HealthStatus, timeout=2.0)
        assert (reply.service, reply.metrics_port) == ("x", 3)
        replies = await bus.request_many(subject, b"", HealthStatus, timeout=0.3)
        assert [r.service for r in replies] == ["x"]
    finally:
        await bus.close()


async def test_a_subscription_has_every_message_another_connection_publishes_once_subscribe_returns(nats_url):
    """``Bus.subscribe`` returns once the server has the subscription. nats-py's own flush writes its PING ahead of
    the buffered SUB, so without ``Bus.flush`` writing the buffer first about 3 % of these subscriptions missed the
    message (a loss in 300 tries is then all but certain); each try waits for its message, not a fixed time."""
    sub_bus, pub_bus = await Bus.connect(nats_url, "test-sub-order"), await Bus.connect(nats_url, "test-pub-order")
    try:
        for i in range(300):
            subject = subjects.pending(f"o{uuid.uuid4().hex[:8]}")
            sub = await sub_bus.subscribe(subject)
            await pub_bus.publish(subject, b"m%d" % i)
            msg = await sub.next_msg(timeout=5.0)  # a lost message: a timeout here
            assert msg.data == b"m%d" % i
            await sub.unsubscribe()
    finally:
        await sub_bus.close()
        await pub_bus.close()


async def test_decision_log_survives_nats_restart(tmp_path):
    with NatsServer(store_dir=tmp_path / "store") as server:
        bus = await Bus.connect(server.url, "test-restart")
        try:
            assert await bus.ensure_streams() == ["DECISIONS", "EXPERIENCE", "EVENTS"]
            assert await bus.ensure_streams() == ["DECISIONS", "EXPERIENCE", "EVENTS"]  # idempotent
            acks = [await bus.js_publish(subjects.decision("sim", "team-a"), _decision(i), msg_id=f"d{i}")
                    for i in range(3)]
            assert [a.stream for a in acks] == ["DECISIONS"] * 3 and not any(a.duplicate for a in acks)
            dup = await bus.js_publish(subjects.decision("sim", "team-a"), _decision(0), msg_id="d0")
            assert dup.duplicate
            port, pid_before = server.port, server.pid

            server.restart()  # same port, same store dir
            assert server.port == port and server.pid != pid_before
            # the client notices the restart and reconnects by itself
            assert await _until(lambda: bus.reconnects >= 1 and bus.is_connected, timeout=10.0)
            info = await bus.js.stream_info("DECISIONS")
            assert info.state.messages == 3
            sub = await bus.pull_subscribe("DECISIONS", subjects.decision_wildcard("sim"), "test-reader")
            msgs = await sub.fetch(3, timeout=2.0)
            for m in msgs:
                await m.ack()
            assert [decode(Decision, m.data).decision_id for m in msgs] == ["d0", "d1", "d2"]
            assert msgs[0].headers["Nats-Msg-Id"] == "d0"
        finally:
            await bus.close()


def test_a_server_keeps_its_config_and_log_next_to_its_store_and_nothing_in_the_temp_dir(tmp_path, monkeypatch):
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    server = NatsServer(store_dir=tmp_path / "store").start()
    try:
        assert server.log_path == tmp_path / "store-server" / "nats-server.log"
        assert b"Server is ready" in server.log_path.read_bytes()
        assert (tmp_path / "store-server").stat().st_mode & 0o777 == 0o700
    finally:
        server.stop()
    assert server.log_path.exists()  # read after the run (`agmarl up`: .state/nats-server/)
    assert list(temp.iterdir()) == []
    with NatsServer() as private:  # no store given: one private temporary directory, removed on exit
        assert private.work_dir.parent == temp and private.store_dir.parent == private.work_dir
    assert list(temp.iterdir()) == []


async def test_follow_since_reads_on_across_a_nats_restart(tmp_path):
    """An ordered consumer started by time reads what was stored from then on and, after the nats-server
    restarts (its ephemeral consumer gone), recreates itself from the next sequence and reads on. With nats-py's
    own reset it asked for "by start sequence" with the start time still set: the server refused (10094) and the
    subscription went quiet (the reward-calculator's bind-outcome follower in a full chaos run)."""
    with NatsServer(store_dir=tmp_path / "store") as server:
        bus = await Bus.connect(server.url, "test-follow")
        try:
            await bus.ensure_stream(subjects.EVENTS)
            subject = subjects.event("sim")

            async def event(seq: int) -> None:
                await bus.js_publish(subject, ClusterEvent(cluster="sim", type="pod_bound", seq=seq, epoch="e", time=0.0))

            await event(1)
            await asyncio.sleep(0.05)  # the stored time of event 1 is before ``since``
            since = datetime.datetime.now(datetime.timezone.utc)
            await asyncio.sleep(0.05)
            await event(2)
            sub = await bus.follow_since(subject, since)
            first = decode(ClusterEvent, (await sub.next_msg(timeout=5.0)).data)
            assert first.seq == 2  # event 1 came before ``since``
            server.restart()
            assert await _until(lambda: bus.reconnects >= 1 and bus.is_connected, timeout=10.0)
            await event(3)
            seen = []
            deadline = time.monotonic() + 60.0  # the consumer notices its lost heartbeats (every 5 s) first
            while not seen and time.monotonic() < deadline:
                try:
                    seen.append(decode(ClusterEvent, (await sub.next_msg(timeout=1.0)).data).seq)
                except asyncio.TimeoutError:
                    continue
            assert seen == [3]
        finally:
            await bus.close()


async def test_read_back_returns_what_was_stored_since_a_time_and_ends(nats_url):
    """``read_back``: the messages stored at or after ``since``, decoded (None left out), and then it returns;
    an empty window returns at once, not after the timeout."""
    bus = await Bus.connect(nats_url, "test-read-back")
    try:
        await bus.ensure_stream(subjects.EVENTS)
        cluster = f"rb-{uuid.uuid4().hex[:8]}"
        subject = subjects.event(cluster)

        def seq_of(data: bytes) -> int | None:
            ev = decode(ClusterEvent, data)
            return ev.seq if ev.seq != 3 else None  # a None result is left out

        async def event(seq: int) -> None:
            await bus.js_publish(subject, ClusterEvent(cluster=cluster, type="pod_bound", seq=seq, epoch="e", time=0.0))

        empty_since = datetime.datetime.now(datetime.timezone.utc)
        started = time.monotonic()
        assert await bus.read_back(subject, empty_since, seq_of, timeout=30.0) == []
        assert time.monotonic() - started < 10.0  # nothing stored: no wait for the timeout
        await event(1)
        await asyncio.sleep(0.05)  # the stored time of event 1 is before ``since``
        since = datetime.datetime.now(datetime.timezone.utc)
        await asyncio.sleep(0.05)
        for seq in (2, 3, 4):
            await event(seq)
        started = time.monotonic()
        assert await bus.read_back(subject, since, seq_of, timeout=30.0) == [2, 4]
        assert time.monotonic() - started < 10.0  # ended at the last stored message, not by the timeout
    finally:
        await bus.close()


async def test_connect_waits_for_a_late_server_and_gives_up_when_bounded(tmp_path):
    port = free_port()
    with pytest.raises(ConnectionError):
        await Bus.connect(f"nats://127.0.0.1:{port}", "test-nobody", connect_wait=0.3)
    server = NatsServer(store_dir=tmp_path / "late", port=port)
    connecting = asyncio.create_task(Bus.connect(server.url, "test-late", connect_wait=10.0))
    await asyncio.sleep(0.3)
    assert not connecting.done()
    try:
        await asyncio.to_thread(server.start)
        bus = await asyncio.wait_for(connecting, 10.0)
        assert bus.is_connected
        await bus.close()
    finally:
        server.cleanup()


async def test_experience_stream_deduplicates_by_msg_id(nats_url):
    bus = await Bus.connect(nats_url, "test-dedup")
    try:
        await bus.ensure_streams()
        cluster = f"dedup-{uuid.uuid4().hex[:8]}"
        exp = Experience(id=uuid.uuid4().hex, cluster=cluster, state={}, action={"node": "n0"}, reward=1.0,
                         next_state={}, time=1.0)
        first = await bus.js_publish(subjects.experience(cluster), exp, msg_id=exp.id)
        second = await bus.js_publish(subjects.experience(cluster), exp, msg_id=exp.id)
        assert (first.stream, bool(first.duplicate), second.duplicate) == ("EXPERIENCE", False, True)
        assert second.seq == first.seq
    finally:
        await bus.close()


async def test_kv_put_get(nats_url):
    bus = await Bus.connect(nats_url, "test-kv")
    try:
        selection = PolicySelection(policy="fgd", reason="test", time=1.0)
        rev1 = await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, selection)
        rev2 = await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ROLLOUT, "hybrid")
        assert rev2 > rev1
        assert decode(PolicySelection, await bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)) == selection
        assert await bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ROLLOUT) == b"hybrid"
        assert await bus.kv_get(subjects.CONFIG_BUCKET, "missing_key") is None
    finally:
        await bus.close()


async def test_object_store_put_get(nats_url):
    bus = await Bus.connect(nats_url, "test-obj")
    try:
        blob = bytes(range(256)) * 1200  # ~300 KiB: several chunks
        name = f"model-{uuid.uuid4().hex[:8]}.onnx"
        info = await bus.object_put(subjects.MODELS_BUCKET, name, blob, description="test model")
        assert info.size == len(blob)
        got = await bus.object_get(subjects.MODELS_BUCKET, name)
        assert hashlib.sha256(got).hexdigest() == hashlib.sha256(blob).hexdigest()
        assert name in await bus.object_list(subjects.MODELS_BUCKET)
        assert await bus.object_get(subjects.MODELS_BUCKET, "absent.onnx") is None
    finally:
        await bus.close()


@pytest.mark.parametrize("subject,label", [
    ("agmarl.v1.decision.prod.team-a", "agmarl.v1.decision.*.*"),
    ("agmarl.v1.graph.sim", "agmarl.v1.graph.*"),
    ("agmarl.v1.policy_selection", "agmarl.v1.policy_selection"),
    ("_INBOX.abc.def", "_INBOX.>"),
])
def test_subject_label_bounds_cardinality(subject, label):
    assert subjects.subject_label(subject) == label


@pytest.mark.parametrize("built,expected", [
    (subjects.decision("prod.eu", "team a"), "agmarl.v1.decision.prod_eu.team_a"),
    (subjects.decision_wildcard(), "agmarl.v1.decision.*.>"),
    (subjects.pending("sim"), "agmarl.v1.pending.sim"),
    (subjects.dead_letter("graph-builder"), "agmarl.v1.dead_letter.graph-builder"),
])
def test_subjects_are_single_tokens(built, expected):
    assert built == expected
