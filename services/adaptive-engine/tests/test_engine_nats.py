"""The adaptive-engine process on a real nats-server: a collapsing reward triggers a rollback event
within 5 s and the KV selection follows; `agmarl policy set / rollback / show` round trip."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.adaptive import history as hist
from agmarl_common.runtime.bus import Bus
from agmarl_testing.fixtures import ask_health, health_advances, wait_healthy

CLUSTER = "adaptive-it"


def cli(nats_url: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NATS_URL=nats_url)
    return subprocess.run([sys.executable, "-m", "agmarl_cli.main", "policy", *args], env=env,
                          capture_output=True, text=True, timeout=30)


async def kv_selection(bus: Bus) -> m.PolicySelection:
    return m.decode(m.PolicySelection, await bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY))


async def start_selection(bus: Bus, policy: str) -> m.PolicySelection:
    """Write ``policy`` as the active selection and the whole history, as a fresh deployment has it."""
    start = m.PolicySelection(policy=policy, reason="test start", time=time.time())
    await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.encode(start))
    await bus.kv_put(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY,
                     hist.encode_history([start.model_dump(exclude={"v"})]))
    return start


async def collect(bus: Bus, subject: str, cls) -> list:
    """Every ``cls`` message on ``subject`` from now on, decoded, in a list that fills as they arrive."""
    got: list = []

    async def on_msg(msg):
        got.append(m.decode(cls, msg.data))

    await bus.subscribe(subject, on_msg)
    await bus.flush()
    return got


async def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_reward_collapse_rolls_back_and_cli_round_trip(nats_url, service_processes):
    bus = await Bus.connect(nats_url, name="test-adaptive")
    try:
        await start_selection(bus, "kube-resources")
        events = await collect(bus, subjects.policy_selection(), m.PolicySelection)
        proc = service_processes("agmarl_adaptive_engine", env={
            "NATS_URL": nats_url, "AGMARL_CLUSTER": CLUSTER, "AGMARL_ENGINE_TICK_SECONDS": "0.1"})
        await wait_healthy(bus, "adaptive-engine", timeout=30, proc=proc)

        out = cli(nats_url, "set", "most-allocated", "--reason", "try packing")
        assert out.returncode == 0, out.stderr
        assert (await kv_selection(bus)).policy == "most-allocated"

        async def adopted():
            h = await ask_health(bus, "adaptive-engine")
            return h is not None and h.details.get("policy") == "most-allocated"
        assert await wait_until(adopted, 5.0)

        t0 = time.monotonic()
        for k in range(12):
            await bus.publish(subjects.reward(CLUSTER), m.Reward(
                decision_id=f"r{k}", cluster=CLUSTER, components={"sla": 0.0}, total=0.05, scheme="fixed", time=k))
        await bus.flush()

        async def rolled_back():
            return any(e.reason.startswith("rollback") for e in events)
        assert await wait_until(rolled_back, 5.0), proc.output()[-3000:]
        assert time.monotonic() - t0 < 5.0
        event = next(e for e in events if e.reason.startswith("rollback"))
        assert event.policy == "kube-resources" and event.previous == "most-allocated"
        assert "reward mean" in event.reason
        sel = await kv_selection(bus)
        assert (sel.policy, sel.reason) == ("kube-resources", event.reason)
        history = hist.decode_history(await bus.kv_get(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY))
        assert history[-1]["policy"] == "kube-resources" and history[-1]["reason"].startswith("rollback")

        # CLI round trip: set, set, rollback -> the first; show lists the history
        assert cli(nats_url, "set", "rtcr").returncode == 0
        assert cli(nats_url, "set", "trimaran-tlp", "--mode", "hybrid").returncode == 0
        out = cli(nats_url, "rollback")
        assert out.returncode == 0, out.stderr
        assert "policy=rtcr" in out.stdout and "trimaran-tlp" in out.stdout
        sel = await kv_selection(bus)
        assert sel.policy == "rtcr" and sel.reason.startswith("rollback: manual")
        assert await wait_until(lambda: _has_event(events, "rtcr", "rollback"), 2.0)
        shown = cli(nats_url, "show")
        assert shown.returncode == 0 and shown.stdout.startswith("policy=rtcr")
        assert "history" in shown.stdout and "kube-resources" in shown.stdout

        bad = cli(nats_url, "set", "no-such-policy")
        assert bad.returncode == 2
        assert len(bad.stderr.strip().splitlines()) == 1 and "unknown policy 'no-such-policy'" in bad.stderr
        assert (await kv_selection(bus)).policy == "rtcr"
    finally:
        await bus.close()


async def _has_event(events: list[m.PolicySelection], policy: str, reason: str) -> bool:
    return any(e.policy == policy and e.reason.startswith(reason) for e in events)


async def test_model_inference_refuses_is_rolled_back(nats_url, service_processes):
    """A selection naming a version the Object Store does not hold: inference refuses it and says so
    (SelectionRefused), the engine rolls the active selection back within seconds, with the reason."""
    missing = f"model:missing-{time.time_ns()}"
    bus = await Bus.connect(nats_url, name="test-refused")
    try:
        start = await start_selection(bus, "kube-resources")
        refused = await collect(bus, subjects.selection_refused(), m.SelectionRefused)
        events = await collect(bus, subjects.policy_selection(), m.PolicySelection)
        engine = service_processes("agmarl_adaptive_engine", env={
            "NATS_URL": nats_url, "AGMARL_CLUSTER": CLUSTER, "AGMARL_ENGINE_TICK_SECONDS": "0.1"})
        inference = service_processes("agmarl_inference", env={
            "NATS_URL": nats_url, "AGMARL_CLUSTER": CLUSTER, "AGMARL_HTTP_PORT": "0"})
        await wait_healthy(bus, "adaptive-engine", timeout=30, proc=engine)
        await wait_healthy(bus, "inference", timeout=60, proc=inference)

        # what `agmarl policy set` does: KV selection + history, then the PolicySelection event
        manual = m.PolicySelection(policy=missing, reason="manual: try a model", time=time.time(),
                                   previous="kube-resources")
        await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.encode(manual))
        await bus.kv_put(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY, hist.encode_history(
            [start.model_dump(exclude={"v"}), manual.model_dump(exclude={"v"})]))
        t0 = time.monotonic()
        await bus.publish(subjects.policy_selection(), manual)
        await bus.flush()

        async def rolled_back():
            sel = await kv_selection(bus)
            return sel.reason.startswith("rollback: inference refused")
        assert await wait_until(rolled_back, 8.0), engine.output()[-2000:] + inference.output()[-2000:]
        assert time.monotonic() - t0 < 8.0
        assert [(r.policy, r.reason) for r in refused] == [(missing, "not_found")]
        sel = await kv_selection(bus)
        assert (sel.policy, sel.previous) == ("kube-resources", missing)
        assert sel.reason.startswith(f"rollback: inference refused {missing}: not_found")
        history = hist.decode_history(await bus.kv_get(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY))
        assert [e["policy"] for e in history] == ["kube-resources"] and history[-1]["reason"] == sel.reason
        assert await wait_until(lambda: _has_event(events, "kube-resources", "rollback: inference refused"), 2.0)

        async def serving_baseline():
            h = await ask_health(bus, "inference")
            return h is not None and h.details.get("policy") == "kube-resources" and not h.details.get("model_version")
        assert await wait_until(serving_baseline, 3.0)
        # the refused model is quarantined: the engine keeps the rollback (one event, one rollback) for five ticks
        await health_advances(bus, "adaptive-engine", "ticks", 5)
        assert len(refused) == 1 and (await kv_selection(bus)).reason == sel.reason
    finally:
        await bus.close()
