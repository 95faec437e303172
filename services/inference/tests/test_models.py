"""The model registry of the inference service, against a real nats-server and a real service process:
the KV selection's model is fetched from the Object Store at start; a ModelPublished event only fetches,
verifies and caches the new version (what serves is unchanged); a selection naming it swaps it in
without a restart (decisions carry its name and version); a model whose digest does not match, or that is
not signed, is refused and the selected one keeps serving. And no torch in the serving process.

The model files come from the trainer's smoke config (trained once per session in a subprocess), signed
with a throwaway key the service is configured to trust (test_model_signatures.py has every refusal).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.serving import signing
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.model import ClusterState, to_dict
from agmarl_testing.extender import graph_full
from agmarl_common.core.sim import traces
from agmarl_testing.fixtures import ask_health, wait_healthy

CLUSTER = "modelreg"


def version_files(model: Path, version: str, corrupt: str = "", key: Path | None = None) -> tuple[dict[str, bytes], dict]:
    """The model's files as version ``version`` (its manifest renamed; digests unchanged), signed with
    ``key`` unless None; ``corrupt`` names a file whose bytes are altered after the manifest was written."""
    manifest = json.loads((model / "manifest.json").read_text())
    manifest["version"] = version
    files = {name: (model / name).read_bytes() for name in manifest["files"]}
    files["manifest.json"] = json.dumps(manifest).encode()
    if key is not None:
        files["manifest.sig"] = signing.sign(files["manifest.json"], signing.load_private_key(key))
    if corrupt:
        files[corrupt] = files[corrupt][:-1] + bytes([files[corrupt][-1] ^ 0xFF])
    return files, manifest


async def store(bus: Bus, version: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        await bus.object_put(subjects.MODELS_BUCKET, f"{version}/{name}", data)


async def until(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    return await predicate()


def metric(port: int, name: str, label: str, value: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
    found = re.search(rf'^{name}\{{{label}="{value}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def failures(port: int, reason: str) -> float:
    return metric(port, "agmarl_model_load_failures_total", "reason", reason)


@pytest.mark.asyncio
async def test_hot_reload_through_the_object_store_and_digest_refusal(smoke_model, nats_url, service_processes,
                                                                      model_keys):
    tag = uuid.uuid4().hex[:8]
    v1, v2, v3, v4 = (f"hot-{tag}-{k}" for k in ("v1", "v2", "v3", "v4"))
    bus = await Bus.connect(nats_url, name="test-models")
    previous = await bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
    try:
        files1, _ = version_files(smoke_model, v1, key=model_keys.key)
        await store(bus, v1, files1)
        await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.encode(m.PolicySelection(
            policy=f"model:{v1}", reason="test: serve v1", time=time.time())))
        proc = service_processes("agmarl_inference", env={"NATS_URL": nats_url, "AGMARL_CLUSTER": CLUSTER,
                                                          "AGMARL_HTTP_PORT": "0", **model_keys.env})
        first = await wait_healthy(bus, "inference", timeout=60, proc=proc)

        async def health(version: str = ""):
            st = await ask_health(bus, "inference")
            return st if st is not None and (not version or st.details.get("model_version") == version) else None

        assert await until(lambda: health(v1), 30), await health()
        decisions: list[m.Decision] = []

        async def on_decision(msg):
            decisions.append(m.decode(m.Decision, msg.data))

        await bus.subscribe(subjects.decision_wildcard(CLUSTER), on_decision)
        await bus.flush()

        nodes = traces.load_openb_nodes(traces.openb_node_path(traces.GPU_NODES))[:24]
        state = ClusterState.empty(nodes)
        pod = next(p for p in traces.load_openb_pods(traces.openb_pod_path("default")) if p.is_gpu_share)

        await bus.publish(subjects.graph(CLUSTER), graph_full(CLUSTER, state))

        async def decide(k: int) -> m.Decision:
            await bus.publish(subjects.pending(CLUSTER), m.PendingPod(
                cluster=CLUSTER, pod=to_dict(replace(pod, name=f"{pod.name}-{k}")), seen_at=time.time(), seq=k))

            async def got():
                return decisions[k] if len(decisions) > k else None
            d = await until(got, 15)
            assert d is not None, proc.output()[-3000:]
            return d

        # a new version published: fetched, verified and cached; v1 keeps serving (no selection names v2)
        files2, manifest2 = version_files(smoke_model, v2, key=model_keys.key)
        await store(bus, v2, files2)
        await bus.publish(subjects.model_published(), m.ModelPublished(
            version=v2, sha256=manifest2["files"]["actor.onnx"], object_name=f"{v2}/actor.onnx",
            manifest=manifest2, time=time.time()))

        async def cached():
            st = await health()
            return st if v2 in st.details.get("models_loaded", []) else None
        st = await until(cached, 30)
        assert st and st.details["model_latest"] == v2 and st.details["model_version"] == v1, await health()
        d = await decide(0)
        assert (d.policy, d.model_version) == (f"model:{v1}", v1)

        # the selection names v2 (as the adaptive-engine's promotion does): swapped in, same process
        await bus.publish(subjects.policy_selection(), m.PolicySelection(
            policy=f"model:{v2}", reason=f"promoted: model {v2} published by the trainer", time=time.time(),
            previous=f"model:{v1}"))
        st = await until(lambda: health(v2), 30)
        assert st and st.pid == first.pid and proc.returncode is None, await health()
        d = await decide(1)
        assert (d.policy, d.model_version) == (f"model:{v2}", v2)
        assert d.node in {nd.name for nd in nodes} and len(d.gpus) == 1
        # from the cache: v1 at start and v2 on the event were the only Object Store loads
        assert metric(st.metrics_port, "agmarl_model_loads_total", "source", "objectstore") == 2.0

        # a version whose actor.onnx does not match its manifest: refused, v2 keeps serving
        files3, manifest3 = version_files(smoke_model, v3, corrupt="actor.onnx", key=model_keys.key)
        await store(bus, v3, files3)
        await bus.publish(subjects.model_published(), m.ModelPublished(
            version=v3, sha256=manifest3["files"]["actor.onnx"], object_name=f"{v3}/actor.onnx",
            manifest=manifest3, time=time.time()))

        async def refused():
            st = await health()
            return st if "digest" in st.details.get("model_last_error", "") else None
        st = await until(refused, 30)
        assert st is not None and st.details["model_version"] == v2
        assert "actor.onnx" in st.details["model_last_error"]
        assert failures(st.metrics_port, "digest") == 1.0
        d = await decide(2)
        assert (d.policy, d.model_version) == (f"model:{v2}", v2)

        # an unsigned version, then a selection naming it: refused both times, v2 keeps serving
        files4, manifest4 = version_files(smoke_model, v4)
        await store(bus, v4, files4)
        await bus.publish(subjects.model_published(), m.ModelPublished(
            version=v4, sha256=manifest4["files"]["actor.onnx"], object_name=f"{v4}/actor.onnx",
            manifest=manifest4, time=time.time()))

        def unsigned(count: float):
            async def check():
                st = await health()
                return st if failures(st.metrics_port, "unsigned") >= count else None
            return check
        st = await until(unsigned(1.0), 30)
        assert st is not None and st.details["model_version"] == v2, await health()
        await bus.publish(subjects.policy_selection(), m.PolicySelection(
            policy=f"model:{v4}", reason="test: an unsigned model", time=time.time(), previous=f"model:{v2}"))
        st = await until(unsigned(2.0), 30)
        assert st is not None and st.details["model_version"] == v2, await health()
        assert "unsigned" in st.details["model_last_error"]
        d = await decide(3)
        assert (d.policy, d.model_version) == (f"model:{v2}", v2)
    finally:
        kv = await bus.kv(subjects.CONFIG_BUCKET)
        if previous:
            await kv.put(subjects.KEY_ACTIVE_POLICY, previous)
        else:
            await kv.delete(subjects.KEY_ACTIVE_POLICY)
        await bus.close()


def test_no_torch_in_the_serving_process():
    code = ("import sys, agmarl_inference.app, agmarl_inference.models, agmarl_common.serving.onnx_model; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
