"""Liveness and readiness: the pure verdict (table-driven), and a runtime's /healthz and /readyz on its
metrics server against a real nats-server that is stopped and started again, and a handler that hangs."""
import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid

import pytest

from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.health import Beat, HealthLimits, judge
from agmarl_common.runtime.messages import PendingPod
from agmarl_common.runtime.natsserver import NatsServer
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_common.runtime.settings import CommonSettings

LIMITS = HealthLimits(nats_grace_s=30.0, handler_stuck_s=60.0)


@pytest.mark.parametrize("beat, now, live, ready, problem", [
    (None, 0.0, True, False, "starting"),
    (Beat(100.0, True, True), 100.4, True, True, None),
    (Beat(100.0, False, True), 100.4, True, False, "starting"),
    (Beat(100.0, True, False, disconnected_since=90.0), 100.4, True, False, "nats disconnected for 10.4s"),
    (Beat(100.0, True, False, disconnected_since=60.0), 100.4, False, False, "nats disconnected for 40.4s"),
    (Beat(100.0, True, True, oldest_handler=("agmarl.x", 50.0)), 100.4, True, True, None),
    (Beat(100.0, True, True, oldest_handler=("agmarl.x", 30.0)), 100.4, False, False,
     "handler on agmarl.x running for 70.4s"),
    (Beat(100.0, True, True), 170.0, False, False, "event loop silent for 70.0s"),
    (Beat(100.0, True, True, unhealthy="kubernetes not listed yet"), 100.4, True, False,
     "kubernetes not listed yet"),
])
def test_judge(beat, now, live, ready, problem):
    verdict = judge(beat, now, LIMITS)
    assert (verdict.live, verdict.ready) == (live, ready)
    assert (verdict.problems[0] if verdict.problems else None) == problem
    assert verdict.body("live")["status"] == ("ok" if live else "not live")


def _get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def _until_status(port: int, path: str, code: int, timeout: float) -> tuple[int, dict]:
    """Poll ``path`` until it answers ``code`` (bounded); returns the last answer."""
    deadline = time.monotonic() + timeout
    answer = await asyncio.to_thread(_get, port, path)
    while answer[0] != code and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        answer = await asyncio.to_thread(_get, port, path)
    return answer


async def test_healthz_fails_after_the_nats_grace_and_recovers_on_reconnect(tmp_path):
    server = NatsServer(store_dir=tmp_path / "nats")
    server.start()
    settings = CommonSettings(nats_url=server.url, cluster="health", nats_grace_seconds=2.0)
    rt = ServiceRuntime(f"svc-{uuid.uuid4().hex[:6]}", settings)
    try:
        await rt.start()
        assert (await _until_status(rt.metrics_port, "/readyz", 200, 10.0))[0] == 200
        assert (await _until_status(rt.metrics_port, "/healthz", 200, 10.0))[0] == 200
        server.stop()
        # cut off: unready at once, still live within the grace, then not live
        code, body = await _until_status(rt.metrics_port, "/readyz", 503, 10.0)
        assert code == 503 and body["problems"][0].startswith("nats disconnected"), body
        assert _get(rt.metrics_port, "/healthz")[0] == 200
        code, body = await _until_status(rt.metrics_port, "/healthz", 503, 10.0)
        assert code == 503 and body["live"] is False and "nats disconnected" in body["problems"][0], body
        with urllib.request.urlopen(f"http://127.0.0.1:{rt.metrics_port}/metrics", timeout=5) as resp:
            assert b"agmarl_" in resp.read()  # the metrics still answer
        server.start()  # same port and store: nats-py reconnects
        assert (await _until_status(rt.metrics_port, "/readyz", 200, 20.0))[0] == 200
        assert _get(rt.metrics_port, "/healthz")[0] == 200
        assert rt.bus.reconnects >= 1
    finally:
        await rt.shutdown()
        server.cleanup()


async def test_a_stuck_handler_fails_liveness_and_the_health_reply(nats_url):
    cluster = f"c{uuid.uuid4().hex[:6]}"
    settings = CommonSettings(nats_url=nats_url, cluster=cluster, handler_stuck_seconds=1.0)
    rt = ServiceRuntime(f"svc-{uuid.uuid4().hex[:6]}", settings)
    release = asyncio.Event()

    @rt.handle(subjects.pending(cluster), PendingPod)
    async def on_pending(msg: PendingPod, ctx: HandlerContext) -> None:
        await release.wait()

    await rt.start()
    client = await Bus.connect(nats_url, "test-client")
    try:
        assert (await _until_status(rt.metrics_port, "/healthz", 200, 10.0))[0] == 200
        await client.publish(subjects.pending(cluster), PendingPod(cluster=cluster, pod={"name": "p"},
                                                                   seen_at=1.0, seq=1))
        code, body = await _until_status(rt.metrics_port, "/healthz", 503, 10.0)
        assert code == 503 and "handler on" in body["problems"][0], body
        assert _get(rt.metrics_port, "/readyz")[0] == 503
        assert rt.health_status().status.startswith("handler on")
        release.set()
        assert (await _until_status(rt.metrics_port, "/healthz", 200, 10.0))[0] == 200
        assert rt.health_status().status == "healthy"
    finally:
        release.set()
        await client.close()
        await rt.shutdown()
