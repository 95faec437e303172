"""benchmarks/live_latency.py: the time a stream stored a decision, read from the JetStream ack subject its
consumer receives it with, is the stream's own stored time (real nats-server), between the publish and the
delivery."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest
from nats.js.api import DeliverPolicy

from agmarl_common.runtime.bus import Bus
from agmarl_testing.scripts import script_module

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "live_latency.py"


@pytest.fixture(scope="module")
def ll():
    with script_module(_PATH, "live_latency_bench") as module:
        yield module


def test_stored_at_reads_both_ack_subject_forms(ll):
    assert ll.stored_at("$JS.ACK.DECISIONS.c1.1.7.7.1764700000123456789.0") == pytest.approx(1764700000.1234568)
    assert ll.stored_at("$JS.ACK.hub.ACCHASH.DECISIONS.c1.1.7.7.1764700000123456789.0.tok") == \
        pytest.approx(1764700000.1234568)
    assert math.isnan(ll.stored_at(""))
    assert math.isnan(ll.stored_at("_INBOX.abc"))


async def test_stored_at_is_the_streams_stored_time(ll, nats_url):
    bus = await Bus.connect(nats_url, name="test-live-latency")
    try:
        js = bus.nc.jetstream()
        await js.add_stream(name="LLSTORED", subjects=["llstored.>"])
        got: list[tuple[float, float, int]] = []  # (arrival, stored_at, stream sequence)
        done = asyncio.Event()

        async def on_msg(msg) -> None:
            got.append((time.time(), ll.stored_at(msg.reply), msg.metadata.sequence.stream))
            if len(got) == 3:
                done.set()

        await js.subscribe("llstored.>", cb=on_msg, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW)
        sent = []
        for k in range(3):
            sent.append(time.time())
            await js.publish(f"llstored.{k}", b"x")
        await asyncio.wait_for(done.wait(), 10)
        for (arrival, stored, seq), before in zip(got, sent):
            raw = await js.get_msg("LLSTORED", seq)  # the stream's own record of the message
            assert raw.time is not None and stored == pytest.approx(raw.time.timestamp(), abs=1e-5)
            assert before - 0.01 <= stored <= arrival + 0.01
    finally:
        await bus.close()
