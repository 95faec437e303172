"""ServiceRuntime middleware against a real nats-server: rejection, dead letters, metrics, tracing
across hops, request/reply, JetStream consumers, health, and SIGTERM shutdown of a real process."""
import asyncio
import logging
import textwrap
import time
import urllib.request
import uuid

import msgpack
import pytest
from opentelemetry import trace

from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus, RequestError
from agmarl_common.runtime.messages import (
    MAX_MESSAGE_BYTES, ClusterEvent, DeadLetter, Decision, HealthStatus, PendingPod, decode, encode)
from agmarl_common.runtime.metrics import Children, MiddlewareMetrics, new_registry, sample
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_common.runtime.settings import CommonSettings
from agmarl_common.runtime.telemetry import extract, read_spans, setup_tracing, shutdown_tracing
from agmarl_testing.fixtures import ServiceProcess, wait_healthy


async def _until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


def _pending(name: str, cluster: str, pad: int = 0) -> PendingPod:
    pod = {"name": name, "namespace": "team-a", "pad": "x" * pad}
    return PendingPod(cluster=cluster, pod=pod, seen_at=1.0, seq=1)


@pytest.fixture
async def harness(nats_url, tmp_path):
    """A started runtime 'svc-<id>' handling PendingPod on its own cluster subject, a client bus and
    the dead letters it publishes."""
    name = f"svc-{uuid.uuid4().hex[:6]}"
    cluster = f"c{uuid.uuid4().hex[:6]}"
    rt = ServiceRuntime(name, CommonSettings(nats_url=nats_url, cluster=cluster, trace_dir=str(tmp_path)))
    seen: list[tuple[PendingPod, HandlerContext]] = []

    @rt.handle(subjects.pending(cluster), PendingPod, queue=name)
    async def on_pending(msg: PendingPod, ctx: HandlerContext) -> None:
        if msg.pod["name"] == "boom":
            raise RuntimeError("handler exploded")
        seen.append((msg, ctx))
        await ctx.publish(subjects.event(cluster), ClusterEvent(cluster=cluster, seq=msg.seq, type="pod_added",
                                                                pod_key=f"team-a/{msg.pod['name']}", time=2.0))

    await rt.start()
    client = await Bus.connect(nats_url, "test-client")
    letters: list[DeadLetter] = []

    async def on_letter(m):
        letters.append(decode(DeadLetter, m.data))

    await client.subscribe(subjects.dead_letter(name), on_letter)
    await client.flush()
    try:
        yield rt, client, seen, letters, cluster
    finally:
        await client.close()
        await rt.shutdown()


def _rejected(rt, reason):
    return sample(rt.registry, "agmarl_messages_rejected_total",
                  {"service": rt.name, "subject": "agmarl.v1.pending.*", "reason": reason})


async def test_bad_messages_are_rejected_counted_dead_lettered_and_service_survives(harness, caplog):
    rt, client, seen, letters, cluster = harness
    subject = subjects.pending(cluster)
    before = {r: _rejected(rt, r) for r in ("oversized", "malformed", "schema")}
    caplog.set_level(logging.WARNING, logger=f"agmarl.{rt.name}")

    await client.publish(subject, _pending("good-1", cluster))
    await client.publish(subject, b"\xc1\xc1 not msgpack")
    await client.publish(subject, msgpack.packb({"cluster": cluster, "pod": {}, "seq": "one"}))
    oversized = encode(_pending("huge", cluster, pad=MAX_MESSAGE_BYTES))
    assert len(oversized) > MAX_MESSAGE_BYTES
    await client.publish(subject, oversized)
    await client.publish(subject, _pending("good-2", cluster))

    assert await _until(lambda: len(seen) == 2 and len(letters) == 3)
    assert [m.pod["name"] for m, _ in seen] == ["good-1", "good-2"]
    assert {r: _rejected(rt, r) - before[r] for r in before} == {"oversized": 1, "malformed": 1, "schema": 1}
    assert sorted(dl.kind for dl in letters) == ["malformed", "oversized", "schema"]
    assert all(dl.service == rt.name and dl.subject == subject for dl in letters)
    big = next(dl for dl in letters if dl.kind == "oversized")
    assert big.size == len(oversized) and len(big.payload_b64) <= 4 * (64 * 1024) // 3 + 4
    assert sample(rt.registry, "agmarl_messages_received_total",
                  {"service": rt.name, "subject": "agmarl.v1.pending.*"}) == 2
    assert sample(rt.registry, "agmarl_dead_letters_total", {"service": rt.name}) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for kind in ("oversized", "malformed", "schema"):
        assert any(f"service={rt.name}" in w and f"subject={subject}" in w and f"kind={kind}" in w
                   for w in warnings), kind

    # the service keeps handling good messages afterwards
    await client.publish(subject, _pending("good-3", cluster))
    assert await _until(lambda: len(seen) == 3)


async def test_handler_exception_is_dead_lettered_and_not_fatal(harness, tmp_path):
    rt, client, seen, letters, cluster = harness
    await client.publish(subjects.pending(cluster), _pending("boom", cluster))
    assert await _until(lambda: len(letters) == 1)
    assert letters[0].kind == "handler_error" and "handler exploded" in letters[0].reason
    assert sample(rt.registry, "agmarl_handler_errors_total",
                  {"service": rt.name, "subject": "agmarl.v1.pending.*"}) == 1
    await client.publish(subjects.pending(cluster), _pending("after", cluster))
    assert await _until(lambda: len(seen) == 1)
    rt.tracer_provider.force_flush()  # the failed handler's span: ended, its status the error
    failed = [s for s in read_spans(tmp_path) if s["name"] == f"{rt.name} pending_pod" and s["status"] == "ERROR"]
    assert len(failed) == 1 and failed[0]["status_description"] == "RuntimeError: handler exploded"


async def test_trace_continues_through_the_handler(harness, tmp_path):
    rt, client, seen, letters, cluster = harness
    onward: list[str] = []

    async def on_event(m):
        onward.append(format(trace.get_current_span(extract(m.headers)).get_span_context().trace_id, "032x"))

    await client.subscribe(subjects.event(cluster), on_event)
    await client.flush()
    producer = setup_tracing("producer", str(tmp_path), set_global=False)
    try:
        with producer.get_tracer("p").start_as_current_span("produce pending") as span:
            trace_id = format(span.get_span_context().trace_id, "032x")
            await client.publish(subjects.pending(cluster), _pending("traced", cluster))
        assert await _until(lambda: len(seen) == 1 and len(onward) == 1)
    finally:
        shutdown_tracing(producer)
    assert seen[0][1].trace_id == trace_id   # the handler's span is a child of the producer's
    assert onward == [trace_id]              # and what the handler published carries the same trace
    rt.tracer_provider.force_flush()
    spans = [s for s in read_spans(tmp_path) if s["trace_id"] == trace_id]
    assert {s["name"] for s in spans} == {"produce pending", f"{rt.name} pending_pod"}
    by_name = {s["name"]: s for s in spans}
    handler, produced = by_name[f"{rt.name} pending_pod"], by_name["produce pending"]
    assert handler["parent_span_id"] == produced["span_id"] and handler["kind"] == "CONSUMER"
    assert handler["end_ns"] >= handler["start_ns"] and handler["status"] == "UNSET"
    attributes = handler["attributes"]
    assert (attributes["messaging.system"], attributes["messaging.destination.name"], attributes["agmarl.kind"]) \
        == ("nats", subjects.pending(cluster), "pending_pod")
    assert attributes["messaging.message.body.size"] > 0


async def test_health_request_reply_and_metrics_endpoint(harness):
    rt, client, seen, letters, cluster = harness
    status = await client.request(subjects.health(rt.name), b"", HealthStatus, timeout=2.0)
    assert (status.service, status.status, status.metrics_port) == (rt.name, "healthy", rt.metrics_port)
    assert status.details["cluster"] == cluster

    rt.add_health_check(lambda: "model not loaded")
    status = await client.request(subjects.health(rt.name), b"", HealthStatus, timeout=2.0)
    assert status.status == "model not loaded"
    everyone = await client.request_many(subjects.health_all(), b"", HealthStatus, timeout=0.3)
    assert rt.name in {s.service for s in everyone}

    await client.publish(subjects.pending(cluster), b"junk")
    assert await _until(lambda: len(letters) == 1)
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{rt.metrics_port}/metrics", timeout=2).read().decode())
    assert f'agmarl_messages_rejected_total{{reason="malformed",service="{rt.name}",subject="agmarl.v1.pending.*"}} 1.0' in body
    assert "# TYPE agmarl_message_handling_duration_seconds histogram" in body


async def test_request_handler_replies_and_rejects(nats_url):
    name = f"rr-{uuid.uuid4().hex[:6]}"
    rt = ServiceRuntime(name, CommonSettings(nats_url=nats_url))
    subject = f"agmarl.v1.score.{name}"

    @rt.handle_request(subject, PendingPod, HealthStatus)
    async def score(msg: PendingPod, ctx: HandlerContext) -> HealthStatus:
        return HealthStatus(service=name, status=msg.pod["name"], pid=0, metrics_port=0)

    async with rt:
        client = await Bus.connect(nats_url, "rr-client")
        try:
            reply = await client.request(subject, _pending("echo", "sim"), HealthStatus, timeout=2.0)
            assert reply.status == "echo"
            with pytest.raises(RequestError):
                await client.request(subject, b"\xc1", HealthStatus, timeout=2.0)
        finally:
            await client.close()


async def test_stream_handler_acks_terms_and_retries(nats_url):
    name = f"js-{uuid.uuid4().hex[:6]}"
    cluster = f"js{uuid.uuid4().hex[:6]}"
    rt = ServiceRuntime(name, CommonSettings(nats_url=nats_url, cluster=cluster))
    handled: list[tuple[str, int]] = []

    @rt.handle_stream(subjects.DECISIONS, subjects.decision_wildcard(cluster), f"{name}-log", Decision,
                      max_deliver=2, ack_wait=5.0)
    async def on_decision(msg: Decision, ctx: HandlerContext) -> None:
        handled.append((msg.decision_id, 0))
        if msg.decision_id == "flaky":
            raise ValueError("always fails")

    client = await Bus.connect(nats_url, "js-client")
    letters: list[DeadLetter] = []

    async def on_letter(m):
        letters.append(decode(DeadLetter, m.data))

    await client.subscribe(subjects.dead_letter(name), on_letter)
    async with rt:
        try:
            def decision(i):
                return Decision(decision_id=i, cluster=cluster, namespace="ns", pod_key="ns/p", policy="p",
                                mode="full", seen_at=0.0, decided_at=0.0)
            await client.js_publish(subjects.decision(cluster, "ns"), decision("ok-1"), msg_id=f"{cluster}-1")
            await client.js_publish(subjects.decision(cluster, "ns"), b"\x93garbage", msg_id=f"{cluster}-2")
            await client.js_publish(subjects.decision(cluster, "ns"), decision("flaky"), msg_id=f"{cluster}-3")
            assert await _until(lambda: len(letters) == 2, timeout=8.0)
            assert sorted(dl.kind for dl in letters) == ["handler_error", "malformed"]
            assert [h[0] for h in handled].count("flaky") == 2  # redelivered once, then given up
            info = await client.js.consumer_info("DECISIONS", f"{name}-log")
            assert info.num_ack_pending == 0 and info.num_pending == 0
        finally:
            await client.close()


async def test_a_deferred_ack_waits_for_the_handler_and_stop_hooks_run_before_the_drain(nats_url):
    name = f"jsd-{uuid.uuid4().hex[:6]}"
    cluster = f"jsd{uuid.uuid4().hex[:6]}"
    rt = ServiceRuntime(name, CommonSettings(nats_url=nats_url, cluster=cluster))
    held, order = [], []

    @rt.handle_stream(subjects.DECISIONS, subjects.decision_wildcard(cluster), f"{name}-log", Decision)
    async def on_decision(msg: Decision, ctx: HandlerContext) -> None:
        held.append(ctx.defer_ack())

    async def flush() -> None:
        order.append(("flush", rt.bus.is_connected))
        await held[0].ack()
    rt.on_stop(flush)
    client = await Bus.connect(nats_url, "jsd-client")
    try:
        async with rt:
            assert rt.health_status().status == "healthy"  # reported only once the consumers exist
            await client.js_publish(subjects.decision(cluster, "ns"), Decision(
                decision_id="d", cluster=cluster, namespace="ns", pod_key="ns/p", policy="p", mode="full",
                seen_at=0.0, decided_at=0.0), msg_id=f"{cluster}-d")
            assert await _until(lambda: len(held) == 1)
            info = await client.js.consumer_info("DECISIONS", f"{name}-log")
            assert info.num_ack_pending == 1  # the handler returned, the runtime did not ack
        assert order == [("flush", True)]  # the hook ran while the connection was still up
        info = await client.js.consumer_info("DECISIONS", f"{name}-log")
        assert info.num_ack_pending == 0 and info.num_pending == 0
    finally:
        await client.close()


ECHO_SERVICE = textwrap.dedent('''
    from agmarl_common.runtime.service import ServiceRuntime, run_service
    from agmarl_common.runtime.settings import CommonSettings, load_settings

    async def main() -> int:
        runtime = ServiceRuntime("echo-proc", load_settings(CommonSettings))
        return await runtime.run_until_stopped()

    if __name__ == "__main__":
        run_service(main)
''')


async def test_service_process_stops_cleanly_on_sigterm(nats_url, tmp_path):
    (tmp_path / "echo_proc.py").write_text(ECHO_SERVICE)
    proc = ServiceProcess("echo_proc", env={"PYTHONPATH": str(tmp_path), "AGMARL_NATS_URL": nats_url},
                          log_path=tmp_path / "echo.log", cwd=tmp_path).start()
    client = await Bus.connect(nats_url, "proc-client")
    try:
        status = await wait_healthy(client, "echo-proc", timeout=20.0, proc=proc)
        assert status.pid == proc.pid and status.metrics_port > 0
    finally:
        await client.close()
        code = proc.stop(timeout=10.0)
    assert code == 0, proc.output()
    assert "service stopped service=echo-proc" in proc.output()


async def test_a_backlog_on_one_subscription_does_not_starve_health_probes(nats_url):
    """A handler that keeps the CPU (no await inside) behind a backlog: the health probe is answered between
    its messages, not after the whole backlog (a loaded trainer missed `agmarl up`'s final probes so)."""
    name = f"busy-{uuid.uuid4().hex[:6]}"
    cluster = f"b{uuid.uuid4().hex[:6]}"
    rt = ServiceRuntime(name, CommonSettings(nats_url=nats_url, cluster=cluster))
    handled: list[str] = []

    @rt.handle(subjects.pending(cluster), PendingPod)
    async def on_pending(msg: PendingPod, ctx: HandlerContext) -> None:
        until = time.perf_counter() + 0.005  # 5 ms of work that never gives the loop back
        while time.perf_counter() < until:
            pass
        handled.append(msg.pod["name"])

    client = await Bus.connect(nats_url, "busy-client")
    async with rt:
        try:
            total = 200
            for i in range(total):
                await client.publish(subjects.pending(cluster), _pending(f"p{i}", cluster))
            await client.flush()
            status = await client.request(subjects.health(name), b"", HealthStatus, timeout=30.0)
            answered_after = len(handled)
            assert status.status == "healthy"
            assert answered_after < total // 2, f"health answered only after {answered_after} of {total}"
            assert await _until(lambda: len(handled) == total, timeout=30.0)  # and the backlog is all handled
        finally:
            await client.close()


async def test_backlog_counts_what_was_received_and_not_yet_handled(nats_url):
    """``backlog``: messages in the client's queues that no handler has taken yet; 0 once they are handled."""
    name = f"held-{uuid.uuid4().hex[:6]}"
    cluster = f"h{uuid.uuid4().hex[:6]}"
    rt = ServiceRuntime(name, CommonSettings(nats_url=nats_url, cluster=cluster))
    entered, release, handled = asyncio.Event(), asyncio.Event(), []

    @rt.handle(subjects.pending(cluster), PendingPod)
    async def on_pending(msg: PendingPod, ctx: HandlerContext) -> None:
        entered.set()
        await release.wait()  # the first message holds the subscription: the rest wait in its queue
        handled.append(msg.pod["name"])

    async with rt:
        assert rt.backlog() == 0
        for i in range(5):  # on the service's own connection: after its subscription, in order
            await rt.bus.publish(subjects.pending(cluster), _pending(f"p{i}", cluster))
        await rt.bus.flush()
        await asyncio.wait_for(entered.wait(), 10.0)
        assert await _until(lambda: rt.backlog() == 4), [s.pending_msgs for s in rt._subscriptions]
        release.set()
        assert await _until(lambda: len(handled) == 5)
        assert rt.backlog() == 0


def test_metric_children_are_the_families_own_and_a_full_cache_still_counts():
    """``Children`` (a labelled family's children looked up once) counts into the family itself, and past its
    limit forgets what it holds instead of growing, still counting; the middleware's subject labels likewise."""
    registry = new_registry(process_metrics=False)
    metrics = MiddlewareMetrics(registry, "svc")
    kids = Children(metrics.received, limit=2)
    for k in range(5):  # five subjects through a cache of two
        kids("svc", f"s{k}").inc()
        kids("svc", "s0").inc()
    assert sample(registry, "agmarl_messages_received_total", {"service": "svc", "subject": "s0"}) == 6
    assert all(sample(registry, "agmarl_messages_received_total", {"service": "svc", "subject": f"s{k}"}) == 1
               for k in range(1, 5))
    assert len(kids._kids) <= 2
    for inbox in (f"_INBOX.{k}" for k in range(3000)):  # one subject per request: bounded, one label
        metrics.on_published(inbox)
    metrics.on_published("agmarl.v1.decision.c1.ns")
    assert sample(registry, "agmarl_messages_published_total", {"service": "svc", "subject": "_INBOX.>"}) == 3000
    assert sample(registry, "agmarl_messages_published_total",
                  {"service": "svc", "subject": "agmarl.v1.decision.*.*"}) == 1
    assert len(metrics._labels) <= 1024
