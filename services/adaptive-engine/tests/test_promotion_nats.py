"""Published models and the active selection, on a real nats-server with the adaptive-engine process:
a model stored only in the Object Store is a known name (initial selection, `agmarl policy set`); a
published version supersedes the active model as a new selection with a "promoted" reason, the guard
judges it afresh and a rollback returns to the previous model; a baseline selection is left alone;
a published version whose digests do not match, or that is not signed by a trusted key, is never selected."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

from agmarl_common.runtime import messages as m
from agmarl_common.serving import modelstore, signing
from agmarl_common.runtime import subjects
from agmarl_common.core.adaptive import history as hist
from agmarl_common.runtime.bus import Bus
from agmarl_testing.fixtures import health_advances, health_until, wait_healthy

CLUSTER = "promotion-it"
GATE_REASON = "candidate alloc_at_100 94.83 > incumbent 94.47, no hard violations"


def cli(nats_url: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, NATS_URL=nats_url)
    return subprocess.run([sys.executable, "-m", "agmarl_cli.main", "policy", *args], env=env,
                          capture_output=True, text=True, timeout=60)


async def store_version(bus: Bus, version: str, corrupt: bool = False, key=None) -> m.ModelPublished:
    """The shipped model stored as ``version`` in the models bucket, as the trainer stores it, signed with the
    private key file ``key`` (unsigned when None); returns the event the trainer would send. ``corrupt``:
    actor.onnx altered after the manifest was written."""
    src = modelstore.DEFAULT_MODEL_DIR
    manifest = json.loads((src / modelstore.MANIFEST).read_text())
    manifest.update(version=version, evaluation={"verdict": {"promote": True, "reason": GATE_REASON}})
    files = {name: (src / name).read_bytes() for name in manifest["files"]}
    if corrupt:
        files[modelstore.ACTOR_FILE] = files[modelstore.ACTOR_FILE][:-1] + b"\x00"
    files[modelstore.MANIFEST] = json.dumps(manifest).encode()
    if key is not None:
        files[modelstore.SIGNATURE_FILE] = signing.sign(files[modelstore.MANIFEST], signing.load_private_key(key))
    for name, data in files.items():
        await bus.object_put(subjects.MODELS_BUCKET, f"{version}/{name}", data)
    return m.ModelPublished(version=version, sha256=manifest["files"][modelstore.ACTOR_FILE],
                            object_name=f"{version}/{modelstore.ACTOR_FILE}", manifest=manifest, time=time.time())


async def kv_selection(bus: Bus) -> m.PolicySelection:
    return m.decode(m.PolicySelection, await bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY))


async def kv_history(bus: Bus) -> list[dict]:
    return hist.decode_history(await bus.kv_get(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY))


async def wait_until(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    return await predicate()


async def test_published_model_is_promoted_judged_and_rolled_back(nats_url, service_processes, model_keys, tmp_path):
    tag = uuid.uuid4().hex[:8]
    v1, v2, v3, v4, v5, v6, v7 = (f"promo-{tag}-{k}" for k in range(1, 8))
    signer = model_keys.key
    stranger, _ = signing.generate_keypair(tmp_path / "stranger", "stranger")  # a key nobody trusts
    bus = await Bus.connect(nats_url, name="test-promotion")
    try:
        kv = await bus.kv(subjects.CONFIG_BUCKET)
        for key in (subjects.KEY_ACTIVE_POLICY, hist.KEY_POLICY_HISTORY):
            await kv.delete(key)
        await store_version(bus, v1, key=signer)  # in the Object Store only, not on disk
        events: list[m.PolicySelection] = []

        async def on_event(msg):
            events.append(m.decode(m.PolicySelection, msg.data))

        await bus.subscribe(subjects.policy_selection(), on_event)
        await bus.flush()
        proc = service_processes("agmarl_adaptive_engine", env={
            "NATS_URL": nats_url, "AGMARL_CLUSTER": CLUSTER, "AGMARL_ENGINE_TICK_SECONDS": "0.1",
            "AGMARL_INITIAL_POLICY": f"model:{v1}", **model_keys.env})
        await wait_healthy(bus, "adaptive-engine", timeout=30, proc=proc)

        async def health() -> dict:
            return (await health_until(bus, "adaptive-engine", lambda s: True, 10.0, proc, "answering")).details

        # the Object Store version is a known model: the initial selection and the gate's model experts
        assert await wait_until(lambda: bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY), 10.0)
        sel = await kv_selection(bus)
        assert sel.policy == f"model:{v1}" and sel.reason.startswith("initial selection"), sel
        assert (await health())["experts"]["low_load"] == f"model:{v1}"

        # a published version supersedes the active model: a new selection, after the previous one
        await bus.publish(subjects.model_published(), await store_version(bus, v2, key=signer))

        async def event(policy: str, reason: str):
            return next((e for e in events if e.policy == policy and e.reason.startswith(reason)), None)
        promoted = await wait_until(lambda: event(f"model:{v2}", "promoted"), 10.0)
        assert promoted is not None, proc.output()[-3000:]
        assert promoted.reason == f"promoted: model {v2} published by the trainer ({GATE_REASON})"
        assert promoted.previous == f"model:{v1}"
        assert [e["policy"] for e in (await kv_history(bus))[-2:]] == [f"model:{v1}", f"model:{v2}"]
        assert (await kv_selection(bus)).policy == f"model:{v2}"
        h = await health()
        assert h["published"] == {"version": v2, "outcome": "promoted"} and h["experts"]["low_load"] == f"model:{v2}"

        # judged on its own rewards: a collapse rolls back to the previous model
        for k in range(12):
            await bus.publish(subjects.reward(CLUSTER), m.Reward(
                decision_id=f"{tag}-{k}", cluster=CLUSTER, components={"sla": 0.0}, total=0.05, scheme="fixed",
                time=float(k)))
        await bus.flush()
        rb = await wait_until(lambda: event(f"model:{v1}", "rollback"), 5.0)
        assert rb is not None and rb.previous == f"model:{v2}" and "reward mean" in rb.reason, events
        assert (await kv_history(bus))[-1]["policy"] == f"model:{v1}"
        assert (await health())["experts"]["low_load"] == f"model:{v1}"

        # a baseline selection is left alone (not held: no "manual"/"rollback" reason)
        base = m.PolicySelection(policy="kube-resources", reason="test: baseline", time=time.time(),
                                 previous=f"model:{v1}")
        await bus.kv_put(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY,
                         hist.encode_history(hist.push(await kv_history(bus), base.model_dump(exclude={"v"}))))
        await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.encode(base))
        assert await wait_until(lambda: _is(health, "policy", "kube-resources"), 5.0)
        await bus.publish(subjects.model_published(), await store_version(bus, v3, key=signer))
        seen = await wait_until(lambda: _is(health, "published", None, v3), 10.0)
        assert seen["published"]["outcome"].startswith("left alone: the active selection kube-resources is not a model")
        await health_advances(bus, "adaptive-engine", "ticks", 5)
        assert not any(e.policy == f"model:{v3}" for e in events)
        assert (await kv_selection(bus)).policy == "kube-resources"

        # back on a model: a version whose actor does not match its digest, an unsigned one and one signed by an
        # untrusted key are never selected, the next one is
        back = m.PolicySelection(policy=f"model:{v1}", reason="test: model again", time=time.time())
        await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.encode(back))
        assert await wait_until(lambda: _is(health, "policy", f"model:{v1}"), 5.0)
        await bus.publish(subjects.model_published(), await store_version(bus, v4, corrupt=True, key=signer))
        await bus.publish(subjects.model_published(), await store_version(bus, v6))
        await bus.publish(subjects.model_published(), await store_version(bus, v7, key=stranger))
        await bus.publish(subjects.model_published(), await store_version(bus, v5, key=signer))
        assert await wait_until(lambda: event(f"model:{v5}", "promoted"), 10.0), proc.output()[-3000:]
        assert not any(e.policy in (f"model:{v4}", f"model:{v6}", f"model:{v7}") for e in events)
        out = proc.output()
        assert f"published model {v4} not verified" in out and "sha256 of actor.onnx" in out
        assert f"published model {v6} not verified" in out and "unsigned" in out
        assert f"published model {v7} not verified" in out and "not trusted" in out
    finally:
        await bus.close()


async def _is(health, key: str, value, version: str = ""):
    h = await health()
    if version:
        return h if h.get(key, {}).get("version") == version else None
    return h if h.get(key) == value else None


async def test_cli_sets_a_version_stored_only_in_the_object_store(nats_url, model_keys):
    tag = uuid.uuid4().hex[:8]
    version = f"stored-{tag}"
    bus = await Bus.connect(nats_url, name="test-policy-set-stored")
    try:
        await store_version(bus, version, key=model_keys.key)
        out = await asyncio.to_thread(cli, nats_url, "set", f"model:{version}", "--reason", "pin the fine-tune")
        assert out.returncode == 0, out.stderr
        sel = await kv_selection(bus)
        assert (sel.policy, sel.reason) == (f"model:{version}", "manual: pin the fine-tune")

        bad = await asyncio.to_thread(cli, nats_url, "set", f"model:missing-{tag}")
        assert bad.returncode == 2
        assert len(bad.stderr.strip().splitlines()) == 1 and f"model 'missing-{tag}' not found" in bad.stderr
        assert (await kv_selection(bus)).policy == f"model:{version}"
    finally:
        await bus.close()
