"""Test rig for the kube-scheduler extender (used by ``services/inference/tests/test_extender_*``): the
inference service's runtime with the extender over real HTTP, wired as the service wires it (real
nats-server, ServiceRuntime, InferenceApp, uvicorn on a free loopback port), fed one full cluster graph
over NATS (as graph-builder publishes it): ten nodes shaped like kube-scheduler's recorded NodeList (``SAMPLES``), ``LOADED`` holding
three busy pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from pathlib import Path

import httpx

from agmarl_common.kube import convert as kc
from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster import changes as ch
from agmarl_common.core.cluster.compact import compact_snapshot
from agmarl_common.core.cluster.model import HOSTNAME_LABEL, ClusterState, Pod, state_to_dict
from agmarl_common.runtime.metrics import sample
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_inference.app import InferenceApp
from agmarl_inference.http import setup_extender, start_extender
from agmarl_inference.settings import InferenceSettings

SAMPLES = Path("/work/shared/k8s/extender-samples")
N_NODES = 10
LOADED = "node-1"  # the node with pods on it: most-allocated (our stand-in model) prefers it


def sample_nodes() -> tuple:
    """node-0..node-9 shaped like the recorded NodeList (32 cpu, 128 Gi, 110 pods)."""
    proto = kc.nodes_from_k8s(json.loads((SAMPLES / "nocache-filter-1-request.json").read_text())["Nodes"])[0]
    return tuple(dataclasses.replace(proto, name=f"node-{i}", labels={**proto.labels, HOSTNAME_LABEL: f"node-{i}"})
                 for i in range(N_NODES))


def graph_full(cluster: str, state: dict | ClusterState, version: int = 1, epoch: str = "test") -> m.GraphUpdate:
    """A full graph as graph-builder publishes it (``state``: a ClusterState or its compact dict)."""
    compact = compact_snapshot(state) if isinstance(state, ClusterState) else state
    return m.GraphUpdate(cluster=cluster, epoch=epoch, version=version, full=True, state=compact, time=time.time())


def sample_snapshot(cluster: str, seq: int = 1) -> m.ClusterSnapshot:
    pods = [Pod(f"busy-{k}", 4000, 16384, namespace="load", node_name=LOADED) for k in range(3)]
    state = kc.pods_on_nodes(sample_nodes(), pods)
    return m.ClusterSnapshot(cluster=cluster, seq=seq, time=time.time(), state=state_to_dict(state))


@dataclasses.dataclass
class Running:
    rt: ServiceRuntime
    app: InferenceApp
    ext: object
    client: httpx.AsyncClient
    bus: Bus
    cluster: str
    nats_stopped: bool = False  # Bus.close() may raise ConnectionResetError then (libs/common/bus.py)

    def fallbacks(self, reason: str) -> float:
        return sample(self.rt.registry, "agmarl_extender_fallbacks_total", {"reason": reason})


_CLUSTERS = iter(range(10**6))


@contextlib.asynccontextmanager
async def running(nats_url: str, *, feed: bool = True, model: str = "most-allocated", binder=None, **overrides):
    """The inference service's runtime with the extender, fed one snapshot over NATS."""
    cluster = f"ext{next(_CLUSTERS)}-{time.monotonic_ns() % 10**6}"
    settings = InferenceSettings(nats_url=nats_url, cluster=cluster, http_port=0, **overrides)
    rt = ServiceRuntime("inference", settings)
    app = InferenceApp(rt, settings)
    ext = setup_extender(rt, app, settings, app.view, decisions=app.decisions, binder=binder)
    app.replica.bound_listeners.append(ext.service.observed)  # as the service wires it (app.main)
    rt.handle(subjects.graph(cluster), m.GraphUpdate)(app.replica.on_update)
    await rt.start()
    bus = await Bus.connect(nats_url, "test-client")
    client, r = None, None
    try:
        await rt.bus.ensure_streams()
        with contextlib.suppress(Exception):  # no rollout left over from another test
            await (await bus.kv(subjects.CONFIG_BUCKET)).purge(subjects.KEY_ROLLOUT)
        app.policy = get_policy(model)
        port = await start_extender(rt, ext, settings)
        assert port > 0
        if feed:
            await bus.publish(subjects.graph(cluster), graph_full(cluster, sample_snapshot(cluster).state))
            await until(lambda: ext.view.seq == 1, "the graph reached the cluster view")
        client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5.0)
        r = Running(rt, app, ext, client, bus, cluster)
        yield r
    finally:
        if client is not None:
            await client.aclose()
        with contextlib.suppress(*((ConnectionError,) if r is not None and r.nats_stopped else ())):
            await bus.close()
        with contextlib.suppress(*((ConnectionError,) if r is not None and r.nats_stopped else ())):
            await rt.shutdown()


async def observe_binding(r: Running, pod: dict, node: str) -> None:
    """graph-builder's delta for a binding the watch observed (``pod``, a v1.Pod, bound to ``node``),
    published as graph-builder publishes it; returns once the view applied it."""
    view, seq = r.ext.view, r.ext.view.seq
    await r.bus.publish(subjects.graph(r.cluster), m.GraphUpdate(
        cluster=r.cluster, epoch=view.epoch, version=seq + 1, full=False, time=time.time(),
        changes=[ch.bound_change(kc.pod_from_k8s(pod), node, [])]))
    await until(lambda: view.seq > seq, "the binding reached the cluster view")


def top(scores: dict[str, int]) -> str:
    return max(scores, key=scores.get)


async def until(cond, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.01)


def pod_json(name: str = "p", namespace: str = "default", cpu: str = "100m", labels: dict | None = None) -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}}


def names(n: int = N_NODES) -> list[str]:
    return [f"node-{i}" for i in range(n)]


async def prioritize(r: Running, pod: dict | None = None, nodes: list[str] | None = None, **kw) -> dict[str, int]:
    resp = await r.client.post("/prioritize", json={"Pod": pod or pod_json(), "Nodes": None,
                                                   "NodeNames": nodes or names()}, **kw)
    assert resp.status_code == 200, resp.text
    return {h["Host"]: h["Score"] for h in resp.json()}
