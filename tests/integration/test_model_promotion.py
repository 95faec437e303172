"""A model the trainer publishes becomes the active selection through the adaptive-engine, and the
inference service serves exactly what the selection names, on a rollback too.

The adaptive-engine and inference run as processes on the session's nats-server. The active selection
is the shipped model (``model:default``, or inside the placement rule ``cpu-first:``, which the promoted version
keeps); a new version is published exactly as the trainer does
(``TrainerApp.publish_model``, signed with a throwaway key both services trust). The engine makes it the active selection (KV + history + a
PolicySelection whose reason starts with "promoted"), the inference service swaps it in and its
decisions name it; rewards that collapse make the guard roll back to ``model:default``, which the
inference service serves again.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.serving import modelstore, signing
from agmarl_common.runtime import subjects
from agmarl_common.core.adaptive import history as hist
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, to_dict
from agmarl_testing.extender import graph_full
from agmarl_testing.fixtures import ask_health, wait_healthy
from agmarl_trainer.app import TrainerApp

from .conftest import wait_for

CLUSTER = "promotion"


def model_folder(dst: Path, version: str) -> Path:
    """The shipped model's files as version ``version`` (same weights), as the trainer writes a folder."""
    dst.mkdir(parents=True)
    src = modelstore.DEFAULT_MODEL_DIR
    manifest = json.loads((src / modelstore.MANIFEST).read_text())
    for name in manifest["files"]:
        shutil.copyfile(src / name, dst / name)
    manifest.update(version=version, evaluation={"verdict": {"promote": True, "reason": "test: promoted"}})
    (dst / modelstore.MANIFEST).write_text(json.dumps(manifest))
    return dst


@pytest.mark.asyncio
@pytest.mark.parametrize("rules", ["", "cpu-first:"])
async def test_published_model_is_selected_served_and_rolled_back(nats_url, service_processes, tmp_path, model_keys,
                                                                  rules):
    version = f"promo-{uuid.uuid4().hex[:8]}"
    bus = await Bus.connect(nats_url, name="test-model-promotion")
    try:
        start = m.PolicySelection(policy=f"{rules}model:default", reason="test start: the shipped model",
                                  time=time.time())
        await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.encode(start))
        await bus.kv_put(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY,
                         hist.encode_history([start.model_dump(exclude={"v"})]))
        selections: list[m.PolicySelection] = []
        decisions: list[m.Decision] = []

        async def on_selection(msg):
            selections.append(m.decode(m.PolicySelection, msg.data))

        async def on_decision(msg):
            decisions.append(m.decode(m.Decision, msg.data))

        await bus.subscribe(subjects.policy_selection(), on_selection)
        await bus.subscribe(subjects.decision_wildcard(CLUSTER), on_decision)
        await bus.flush()
        env = {"NATS_URL": nats_url, "AGMARL_CLUSTER": CLUSTER, "AGMARL_HTTP_PORT": "0", **model_keys.env}
        engine = service_processes("agmarl_adaptive_engine", env={**env, "AGMARL_ENGINE_TICK_SECONDS": "0.1"})
        inference = service_processes("agmarl_inference", env=env)
        await wait_healthy(bus, "adaptive-engine", timeout=60, proc=engine)
        await wait_healthy(bus, "inference", timeout=60, proc=inference)

        async def health(service: str) -> dict:
            status = await ask_health(bus, service)
            return status.details if status is not None else {}

        default_version = json.loads((modelstore.DEFAULT_MODEL_DIR / modelstore.MANIFEST).read_text())["version"]
        assert await wait_for(lambda: _serves(health, default_version), 30), await health("inference")
        nodes = tuple(Node(f"n{k}", cpu_milli=16000, memory_mib=32768) for k in range(4))
        state = ClusterState.empty(nodes)

        await bus.publish(subjects.graph(CLUSTER), graph_full(CLUSTER, state))

        async def decide(k: int) -> m.Decision:
            pod = Pod(f"p{k}", 1000, 2048)
            await bus.publish(subjects.pending(CLUSTER), m.PendingPod(
                cluster=CLUSTER, pod=to_dict(pod), seen_at=time.time(), seq=k))
            d = await wait_for(lambda: next((d for d in decisions if d.pod_key == pod.key), None), 15)
            assert d is not None, inference.output()[-3000:]
            return d

        assert (await decide(0)).policy == f"{rules}model:{default_version}"

        # published as the trainer does: the engine promotes it, inference serves it
        shim = SimpleNamespace(rt=SimpleNamespace(bus=bus, publish=bus.publish),
                               signing_key=signing.load_private_key(model_keys.key))
        assert await TrainerApp.publish_model(shim, model_folder(tmp_path / version, version)) == version
        promoted = await wait_for(lambda: next((s for s in selections if s.reason.startswith("promoted")), None), 15)
        assert promoted is not None, engine.output()[-3000:]
        assert (promoted.policy, promoted.previous) == (f"{rules}model:{version}", f"{rules}model:default")
        assert promoted.reason == f"promoted: model {version} published by the trainer (test: promoted)"
        assert await wait_for(lambda: _serves(health, version), 30), await health("inference")
        d = await decide(1)
        assert (d.policy, d.model_version) == (f"{rules}model:{version}", version)

        # the guard judges it on its own rewards; the rollback goes back to model:default, served again
        for k in range(12):
            await bus.publish(subjects.reward(CLUSTER), m.Reward(
                decision_id=f"{version}-{k}", cluster=CLUSTER, components={"sla": 0.0}, total=0.05,
                scheme="fixed", time=float(k)))
        rb = await wait_for(lambda: next((s for s in selections if s.reason.startswith("rollback")), None), 10)
        assert rb is not None and (rb.policy, rb.previous) == (f"{rules}model:default", f"{rules}model:{version}"), \
            selections
        assert await wait_for(lambda: _serves(health, default_version), 30), await health("inference")
        assert (await decide(2)).policy == f"{rules}model:{default_version}"
    finally:
        await bus.close()


async def _serves(health, version: str) -> bool:
    return (await health("inference")).get("model_version") == version
