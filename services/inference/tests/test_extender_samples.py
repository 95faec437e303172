"""The kube-scheduler extender over real HTTP, wired as the inference service wires it (real
nats-server, ServiceRuntime, InferenceApp, uvicorn on a free loopback port).

Every request kube-scheduler sent in /work/shared/k8s/extender-samples/ is replayed byte for byte
and the answer must have the recorded response's shape. Then: rollout modes, bad bodies, the time
budget, NATS down, the KV-driven mode switch, the decision log with its trace, and bind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest

from agmarl_common import kubeconvert as kc
from agmarl_common import messages as m
from agmarl_common import subjects
from agmarl_common.bus import MSG_ID_HEADER, Bus
from agmarl_common.cluster.model import HOSTNAME_LABEL, Pod, state_to_dict
from agmarl_common.metrics import sample
from agmarl_common.natsserver import NatsServer
from agmarl_common.policies.base import PolicyBase
from agmarl_common.policies.registry import get_policy
from agmarl_common.service import ServiceRuntime
from agmarl_inference.app import InferenceApp
from agmarl_inference.extender_scoring import Scored, blend_weights, explain, returned_kind, to_extender_scores
from agmarl_inference.extender_wire import NEUTRAL_SCORE
from agmarl_inference.http import load_binder, parse_mode, setup_extender, start_extender
from agmarl_inference.settings import InferenceSettings

SAMPLES = Path("/work/shared/k8s/extender-samples")
N_NODES = 10
LOADED = "node-1"  # the node with pods on it: most-allocated (our stand-in model) prefers it


# --- fixtures ------------------------------------------------------------------------------------

def sample_nodes() -> tuple:
    """node-0..node-9 shaped like the recorded NodeList (32 cpu, 128 Gi, 110 pods)."""
    proto = kc.nodes_from_k8s(json.loads((SAMPLES / "nocache-filter-1-request.json").read_text())["Nodes"])[0]
    return tuple(dataclasses.replace(proto, name=f"node-{i}", labels={**proto.labels, HOSTNAME_LABEL: f"node-{i}"})
                 for i in range(N_NODES))


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
    ext = setup_extender(rt, app, settings, decisions=app.decisions, binder=binder)
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
            await bus.publish(subjects.snapshot(cluster), sample_snapshot(cluster))
            await _until(lambda: ext.cache.seq == 1, "the snapshot reached the cache")
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


async def _until(cond, what: str, timeout: float = 5.0) -> None:
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


# --- every recorded sample -------------------------------------------------------------------------

def _verb(path: Path) -> str:
    return path.name.removesuffix("-request.wire.json").rsplit("-", 2)[-2]


def _check_shape(verb: str, request: dict, recorded, answer) -> None:
    if verb == "filter":
        assert {k.lower() for k in answer} == {k.lower() for k in recorded}
        asked = request["NodeNames"] if request["NodeNames"] is not None else \
            [n["metadata"]["name"] for n in request["Nodes"]["items"]]
        passed = answer["NodeNames"] if "NodeNames" in answer else [n["metadata"]["name"] for n in answer["Nodes"]["items"]]
        failed, hard = answer["FailedNodes"], answer["FailedAndUnresolvableNodes"]
        assert sorted(passed + list(failed) + list(hard)) == sorted(asked)
        assert all(isinstance(v, str) and v for v in {**failed, **hard}.values())
        assert answer["Error"] == ""
        if "Nodes" in answer:  # the node objects come back untouched
            given = {n["metadata"]["name"]: n for n in request["Nodes"]["items"]}
            assert all(n == given[n["metadata"]["name"]] for n in answer["Nodes"]["items"])
    elif verb == "prioritize":
        asked = request["NodeNames"] if request["NodeNames"] is not None else \
            [n["metadata"]["name"] for n in request["Nodes"]["items"]]
        assert isinstance(answer, list) and all(set(h) == {"Host", "Score"} for h in answer)
        assert {h["Host"] for h in answer} <= set(asked)
        assert all(isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in answer)
    elif verb == "bind":
        assert set(answer) == set(recorded) == {"Error"}
        assert answer["Error"] == "no Kubernetes API configured"
    elif verb == "preempt":
        assert set(answer) == set(recorded)
        assert answer["NodeNameToMetaVictims"] == request["NodeNameToMetaVictims"]
    else:
        raise AssertionError(f"unknown verb {verb}")


async def test_every_recorded_sample_has_the_recorded_shape(nats_url):
    requests = sorted(SAMPLES.glob("*-request.wire.json"))
    assert len(requests) >= 30 and {_verb(p) for p in requests} == {"filter", "prioritize", "bind", "preempt"}
    # a generous budget: this test checks what the answers say, not how fast they come (on a loaded machine a
    # 100 ms budget can run out and give default scores; the budget has its own tests)
    async with running(nats_url, extender_budget_ms=2000) as r:
        for path in requests:
            verb = _verb(path)
            headers = dict(line.split(": ", 1) for line in
                           path.with_name(path.name.replace("request.wire.json", "headers.txt")).read_text().splitlines()[1:]
                           if ": " in line)
            url = path.with_name(path.name.replace("request.wire.json", "headers.txt")).read_text().split()[1]
            assert url == f"/ext/{verb}"
            resp = await r.client.post(url, content=path.read_bytes(),
                                       headers={"Content-Type": headers["Content-Type"]})
            assert resp.status_code == 200, (path.name, resp.text)
            request = json.loads(path.read_bytes())
            recorded = json.loads(path.with_name(path.name.replace("request.wire", "response.wire")).read_bytes())
            try:
                _check_shape(verb, request, recorded, resp.json())
            except AssertionError as exc:
                raise AssertionError(f"{path.name}: {exc}\nanswer: {resp.text[:500]}") from None
            if verb == "prioritize" and request["NodeNames"] and LOADED in request["NodeNames"]:
                scores = {h["Host"]: h["Score"] for h in resp.json()}
                assert max(scores, key=scores.get) == LOADED and scores[LOADED] == 10, path.name
        # the preempt scenario's pod asks 20 cpu on node-5 (nodeSelector): it fits the cache's node-5
        filt = json.loads((SAMPLES / "preempt-filter-1-response.wire.json").read_bytes())
        assert filt["NodeNames"] == ["node-5"]
        assert sample(r.rt.registry, "agmarl_extender_request_duration_seconds_count", {"verb": "filter"}) >= 10


async def test_paths_health_and_unknown_verbs(nats_url):
    async with running(nats_url, extender_path_prefixes=["", "/ext", "/agmarl/v1"]) as r:
        body = {"Pod": pod_json(), "NodeNames": ["node-0", "node-2"]}
        for prefix in ("", "/ext", "/agmarl/v1"):
            resp = await r.client.post(f"{prefix}/filter", json=body)
            assert resp.status_code == 200 and resp.json()["NodeNames"] == ["node-0", "node-2"]
        assert (await r.client.post("/ext/unknown", json=body)).status_code == 404
        assert (await r.client.get("/ext/filter")).status_code == 405
        assert (await r.client.get("/healthz")).json() == {"status": "ok"}
        ready = await r.client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["snapshot_seq"] == 1
    async with running(nats_url, feed=False) as r:
        ready = await r.client.get("/ext/readyz")
        assert ready.status_code == 503 and "no cluster snapshot yet" in ready.json()["problems"]
        # a cold cache never blocks scheduling: filter passes the nodes on, prioritize is neutral
        resp = await r.client.post("/filter", json={"Pod": pod_json(), "NodeNames": ["node-0", "x"]})
        assert resp.json()["NodeNames"] == ["node-0", "x"]
        assert set((await prioritize(r, nodes=["node-0", "x"])).values()) == {NEUTRAL_SCORE}
        assert r.fallbacks("cache_cold") == 2


async def test_filter_fails_unknown_and_infeasible_nodes_with_reasons(nats_url):
    async with running(nats_url) as r:
        sub = await r.bus.nc.subscribe(subjects.decision_wildcard(r.cluster))
        resp = await r.client.post("/filter", json={"Pod": pod_json(cpu="21"), "NodeNames": ["node-0", LOADED, "ghost"]})
        out = resp.json()
        assert out["NodeNames"] == ["node-0"]
        assert out["FailedNodes"] == {LOADED: "NodeResourcesFit: Insufficient cpu",
                                      "ghost": "node unknown to the agmarl extender's cluster cache"}
        assert out["FailedAndUnresolvableNodes"] == {}
        # a nodeSelector nobody matches: unresolvable (preemption cannot help), and logged as a decision
        pod = pod_json("nowhere")
        pod["spec"]["nodeSelector"] = {"disk": "ssd"}
        out = (await r.client.post("/filter", json={"Pod": pod, "NodeNames": ["node-0", "node-3"]})).json()
        assert out["NodeNames"] == [] and set(out["FailedAndUnresolvableNodes"]) == {"node-0", "node-3"}
        msg = await sub.next_msg(timeout=3)
        decision = m.decode(m.Decision, msg.data)
        assert decision.pod_key == "default/nowhere" and decision.node == "" and decision.source == "extender"
        assert decision.explanation["reason"] == "no feasible node" and len(decision.trace_id) == 32
        assert sample(r.rt.registry, "agmarl_decisions_total",
                      {"policy": "most-allocated", "mode": "full", "source": "extender", "result": "unschedulable"}) == 1


async def test_a_retried_pod_the_cache_shows_bound_is_not_counted_twice(nats_url):
    async with running(nats_url) as r:
        # busy-0 (4 cpu) is bound on node-1 in the snapshot: 12 of 32 cpu used, 8 without it
        again = pod_json("busy-0", namespace="load", cpu="21")
        out = (await r.client.post("/filter", json={"Pod": again, "NodeNames": [LOADED]})).json()
        assert out["NodeNames"] == [LOADED]
        other = pod_json("busy-x", namespace="load", cpu="21")
        out = (await r.client.post("/filter", json={"Pod": other, "NodeNames": [LOADED]})).json()
        assert out["NodeNames"] == []


async def test_no_time_left_passes_nodes_on_and_answers_neutral(nats_url):
    async with running(nats_url, extender_budget_ms=0) as r:
        out = (await r.client.post("/filter", json={"Pod": pod_json(cpu="64"), "NodeNames": ["node-0", "ghost"]})).json()
        assert out["NodeNames"] == ["node-0", "ghost"] and out["FailedNodes"] == {}
        assert set((await prioritize(r)).values()) == {NEUTRAL_SCORE}
        assert r.fallbacks("filter_timeout") == 1 and r.fallbacks("state_timeout") == 1


async def test_nocache_mode_uses_the_given_nodes_and_the_cached_pods(nats_url):
    async with running(nats_url) as r:
        items = [{"metadata": {"name": n, "labels": {HOSTNAME_LABEL: n}},
                  "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}} for n in ("node-0", LOADED)]
        items.append({"metadata": {"name": "broken"}, "status": {"allocatable": {"cpu": "many"}}})
        body = {"Pod": pod_json(cpu="21"), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
        out = (await r.client.post("/filter", json=body)).json()
        assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["node-0"] and "NodeNames" not in out
        assert out["FailedNodes"][LOADED] == "NodeResourcesFit: Insufficient cpu"  # 12 of 32 cpu used in the cache
        assert out["FailedNodes"]["broken"].startswith("node object could not be read")
        scores = (await r.client.post("/prioritize", json={**body, "Pod": pod_json()})).json()
        assert {h["Host"] for h in scores} == {"node-0", LOADED, "broken"}
        assert max(scores, key=lambda h: h["Score"])["Host"] == LOADED


# --- rollout modes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, pod, expect", [
    ("full", pod_json(), "model"),
    ("recommend", pod_json(), "model"),
    ("hybrid", pod_json(), "model"),
    ("shadow", pod_json(), "neutral"),
    ("canary", pod_json(namespace="team-canary"), "model"),
    ("canary", pod_json(labels={"canary": "true"}), "model"),
    ("canary", pod_json(labels={"canary": "no"}), "neutral"),
])
async def test_rollout_modes(nats_url, mode, pod, expect):
    async with running(nats_url, rollout_mode=mode, canary_namespaces=["team-canary"],
                       canary_label_selector="canary=true") as r:
        sub = await r.bus.nc.subscribe(subjects.decision_wildcard(r.cluster))
        scores = await prioritize(r, pod)
        decision = m.decode(m.Decision, (await sub.next_msg(timeout=3)).data)
        assert decision.mode == mode and decision.explanation["returned"] == expect
        model, default = np.array(list(decision.model_scores.values())), np.array(list(decision.default_scores.values()))
        if expect == "neutral":
            assert set(scores.values()) == {NEUTRAL_SCORE}
        else:  # the model's own 0..100 scores mapped to 0..10
            assert scores == {n: int(np.floor(s / 10 + 0.5)) for n, s in decision.model_scores.items()}
            assert max(scores, key=scores.get) == LOADED
        # the log records the model's choice in every mode, and the blend kube-scheduler ends up making
        assert decision.explanation["model_choice"] == LOADED
        assert decision.explanation["default_choice"] != LOADED
        blended = np.array(list(decision.scores.values()))
        w = {"hybrid": 0.7, "full": 1.0, "recommend": 1.0, "shadow": 0.0}.get(mode, 1.0 if expect == "model" else 0.0)
        assert np.allclose(blended, w * model + (1 - w) * default, atol=0.01)
        assert decision.node == list(decision.scores)[int(np.argmax(blended))]
        if mode == "recommend":
            assert decision.explanation["recommendation"] == LOADED


# --- bad bodies --------------------------------------------------------------------------------------

async def test_malformed_and_oversized_bodies(nats_url):
    async with running(nats_url, max_body_bytes=4096) as r:
        cases = [
            (b"{not json", 400, "not JSON"),
            (b"[1, 2]", 400, "not a ExtenderArgs"),
            (b'{"NodeNames": ["node-0"]}', 400, "Pod"),
            (json.dumps({"Pod": pod_json(cpu="lots"), "NodeNames": ["node-0"]}).encode(), 400, "quantity"),
            (json.dumps({"Pod": {"metadata": {}}, "NodeNames": ["node-0"]}).encode(), 400, "metadata.name"),
            (json.dumps({"Pod": pod_json(), "NodeNames": ["n" * 5000]}).encode(), 413, "exceeds"),
        ]
        for body, status, text in cases:
            for verb in ("filter", "prioritize"):
                resp = await r.client.post(f"/{verb}", content=body, headers={"Content-Type": "application/json"})
                assert resp.status_code == status, (body[:40], verb, resp.text)
                assert text in resp.json()["detail"]

        async def chunks():  # no Content-Length: the limit applies while reading
            for _ in range(10):
                yield b" " * 1000
        resp = await r.client.post("/filter", content=chunks())
        assert resp.status_code == 413
        bad = await r.client.post("/bind", json={"PodName": "x"})
        assert bad.status_code == 400
        reg = r.rt.registry
        assert sample(reg, "agmarl_extender_rejected_requests_total", {"verb": "filter", "reason": "oversized"}) == 2
        assert sample(reg, "agmarl_extender_rejected_requests_total", {"verb": "prioritize", "reason": "malformed"}) == 1
        assert sample(reg, "agmarl_extender_rejected_requests_total", {"verb": "filter", "reason": "invalid"}) == 2
        # lower-case keys are read as Go's encoding/json reads them
        ok = await r.client.post("/filter", json={"pod": pod_json(), "nodenames": ["node-0"]})
        assert ok.status_code == 200 and ok.json()["NodeNames"] == ["node-0"]


# --- time budget and fallbacks ---------------------------------------------------------------------------

class SlowPolicy(PolicyBase):
    """A model that takes 0.4 s per call (prefers the last candidate)."""

    name = "slow-model"

    def score(self, pod, state, candidates):
        time.sleep(0.4)
        return np.arange(len(candidates), dtype=float)


class BrokenPolicy(PolicyBase):
    name = "broken-model"

    def score(self, pod, state, candidates):
        raise RuntimeError("model exploded")


async def _default_answer(r: Running) -> dict[str, int]:
    r.app.policy = r.app.default
    return await prioritize(r)


async def test_slow_or_failing_model_answers_default_scores_within_budget(nats_url):
    async with running(nats_url, extender_budget_ms=100) as r:
        expected = await _default_answer(r)
        assert max(expected, key=expected.get) != LOADED  # default scoring spreads
        r.app.policy = SlowPolicy()
        started = time.perf_counter()
        first = await prioritize(r)
        elapsed = time.perf_counter() - started
        second = await prioritize(r)  # the slow call still runs: this one does not queue behind it
        assert first == second == expected
        assert elapsed < 0.3, f"answered after {elapsed:.3f}s (budget 0.1 s, model 0.4 s)"
        assert r.fallbacks("model_timeout") == 1 and r.fallbacks("model_busy") == 1
        await asyncio.sleep(0.45)
        r.app.policy = BrokenPolicy()
        assert await prioritize(r) == expected and r.fallbacks("model_error") == 1
        assert sample(r.rt.registry, "agmarl_decisions_total", {"policy": "broken-model", "mode": "full",
                                                                "source": "extender", "result": "fallback"}) == 1


async def test_nats_down_answers_default_scores(tmp_path):
    with NatsServer(store_dir=tmp_path / "js") as server:
        async with running(server.url) as r:
            expected = await _default_answer(r)
            r.app.policy = get_policy("most-allocated")
            model = await prioritize(r)
            assert max(model, key=model.get) == LOADED and model != expected
            server.stop()
            r.nats_stopped = True
            await _until(lambda: not r.rt.bus.is_connected, "the runtime saw NATS go")
            started = time.perf_counter()
            assert await prioritize(r) == expected
            assert time.perf_counter() - started < 0.3
            assert r.fallbacks("nats_down") == 1
            # the decision log entry was dropped and counted, not queued forever
            await _until(lambda: sample(r.rt.registry, "agmarl_extender_decisions_dropped_total",
                                        {"reason": "nats_down"}) >= 1, "the drop was counted")


# --- rollout mode from KV at run time ------------------------------------------------------------------

async def test_kv_rollout_switches_mode_at_run_time(nats_url):
    async with running(nats_url, rollout_mode="full") as r:
        kv = await r.bus.kv(subjects.CONFIG_BUCKET)
        try:
            first = await prioritize(r)
            assert max(first, key=first.get) == LOADED
            await kv.put(subjects.KEY_ROLLOUT, b"shadow")
            await _until(lambda: r.app.mode == "shadow", "shadow from KV")
            assert set((await prioritize(r)).values()) == {NEUTRAL_SCORE}
            await kv.put(subjects.KEY_ROLLOUT, json.dumps({"mode": "hybrid"}).encode())
            await _until(lambda: r.app.mode == "hybrid", "hybrid from KV (JSON)")
            await kv.put(subjects.KEY_ROLLOUT, b"bogus")
            await asyncio.sleep(0.2)
            assert r.app.mode == "hybrid"
            await kv.delete(subjects.KEY_ROLLOUT)
            await _until(lambda: r.app.mode == "full", "back to the configured mode when the key goes")
            assert sample(r.rt.registry, "agmarl_active_policy_info",
                          {"policy": "most-allocated", "model_version": "none", "mode": "full"}) == 1
        finally:
            await kv.purge(subjects.KEY_ROLLOUT)


@pytest.mark.parametrize("raw, mode", [(b"hybrid", "hybrid"), (b" Shadow\n", "shadow"), (b'{"mode": "canary"}', "canary"),
                                       (b"nope", None), (b"", None), (None, None), (b"{bad", None)])
def test_parse_mode(raw, mode):
    assert parse_mode(raw) == mode


# --- decision log and trace ------------------------------------------------------------------------

async def test_decision_log_entry_carries_the_request_trace(nats_url):
    async with running(nats_url, rollout_mode="hybrid") as r:
        sub = await r.bus.nc.subscribe(subjects.decision_wildcard(r.cluster))
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        scores = await prioritize(r, headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
        msg = await sub.next_msg(timeout=3)
        decision = m.decode(m.Decision, msg.data)
        assert decision.trace_id == trace_id and msg.headers["traceparent"].split("-")[1] == trace_id
        assert msg.headers[MSG_ID_HEADER] == decision.decision_id
        assert decision.source == "extender" and decision.pod_key == "default/p" and decision.mode == "hybrid"
        assert set(decision.scores) == set(decision.model_scores) == set(decision.default_scores) == set(scores)
        ex = decision.explanation
        assert ex["blend"] == {"model": 0.7, "default": pytest.approx(0.3)}
        assert ex["top"][0]["node"] == decision.node and "default.NodeResourcesFit" in ex["top"][0]["terms"]
        # the drivers are an exact decomposition of the winner's margin over the runner-up
        assert sum(d["delta"] for d in ex["drivers"]) == pytest.approx(ex["margin"], abs=0.01)
        # no traceparent: the request starts a new trace
        await prioritize(r)
        other = m.decode(m.Decision, (await sub.next_msg(timeout=3)).data)
        assert len(other.trace_id) == 32 and other.trace_id != trace_id
        # the entry is in the JetStream decision log
        info = await r.bus.js.stream_info(subjects.DECISIONS.name, subjects_filter=subjects.decision_wildcard(r.cluster))
        assert info.state.messages >= 2


def test_explain_and_score_helpers():
    default = Scored(np.array([100.0, 0.0, 50.0]), {"A": np.array([60.0, 0.0, 30.0]), "B": np.array([40.0, 0.0, 20.0])})
    model = Scored(np.array([0.0, 100.0, 40.0]), {"m": np.array([0.0, 100.0, 40.0])})
    ex = explain(["a", "b", "c"], model, default, (0.7, 0.3), [0, 10, 4])
    assert [t["node"] for t in ex["top"]] == ["b", "c", "a"]
    assert ex["margin"] == pytest.approx(70 - 43)
    assert {d["term"]: d["delta"] for d in ex["drivers"]} == pytest.approx(
        {"model.m": 0.7 * 60, "default.A": 0.3 * -30, "default.B": 0.3 * -20})
    assert to_extender_scores(np.array([0, 4.9, 5, 94.9, 95, 100, 130])) == [0, 0, 1, 9, 10, 10, 10]
    assert blend_weights("hybrid", True, 0.7) == (0.7, pytest.approx(0.3))
    assert blend_weights("canary", False, 0.7) == (0.0, 1.0) and blend_weights("full", True, 0.7) == (1.0, 0.0)
    assert returned_kind("shadow", True, "") == "neutral" and returned_kind("full", True, "nats_down") == "default"
    assert returned_kind("canary", False, "") == "neutral" and returned_kind("canary", True, "") == "model"


# --- bind ---------------------------------------------------------------------------------------------

class _ApiStub(BaseHTTPRequestHandler):
    """Stands in for kube-apiserver's pods/binding endpoint (no API server can run here)."""

    seen: list = []
    status = 201

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, body))
        payload = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Success" if self.status < 300 else "Failure",
                              "message": "conflict" if self.status >= 300 else ""}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


async def test_bind_creates_a_binding_through_the_kubernetes_client(nats_url, tmp_path):
    assert load_binder({}) is None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiStub)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "t",
            "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "t0k"}}]}))
        binder = load_binder({"KUBECONFIG": str(kubeconfig)})
        assert binder is not None
        async with running(nats_url, binder=binder) as r:
            args = json.loads((SAMPLES / "bind-bind-1-request.wire.json").read_bytes())
            resp = await r.client.post("/ext/bind", json=args)
            assert resp.status_code == 200 and resp.json() == {"Error": ""}
            path, body = _ApiStub.seen[-1]
            assert path == f"/api/v1/namespaces/default/pods/{args['PodName']}/binding"
            assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": args["Node"]}
            assert body["metadata"]["uid"] == args["PodUID"]
            _ApiStub.status = 409
            failed = await r.client.post("/ext/bind", json=args)
            assert failed.status_code == 200 and "409" in failed.json()["Error"]
    finally:
        _ApiStub.status = 201
        server.shutdown()
        server.server_close()


async def test_shutdown_closes_the_port(nats_url):
    async with running(nats_url) as r:
        port = r.ext.port
        assert (await r.client.get("/healthz")).status_code == 200
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as c:
            await c.get(f"http://127.0.0.1:{port}/healthz")


async def test_filter_applies_the_active_policys_load_cap_only_where_the_policy_decides(nats_url):
    """capped:most-allocated active: a best-effort pod that would take node-1 (12 of 32 cpu requested)
    above 80 % fails there with the admission reason in full mode; in shadow mode the policy does not
    decide, so only the hard filter runs."""
    be = pod_json("batch", cpu="14")  # 26/32 = 81 % on node-1, 14/32 elsewhere
    body = {"Pod": be, "NodeNames": ["node-0", LOADED, "node-2"]}
    async with running(nats_url, model="capped:most-allocated", rollout_mode="full") as r:
        out = (await r.client.post("/filter", json=body)).json()
        assert out["NodeNames"] == ["node-0", "node-2"]
        assert list(out["FailedNodes"]) == [LOADED] and "LoadCap" in out["FailedNodes"][LOADED]
        assert out["FailedAndUnresolvableNodes"] == {}
        small = {"Pod": pod_json("small", cpu="13"), "NodeNames": [LOADED]}  # 25/32 = 78 %: admitted
        assert (await r.client.post("/filter", json=small)).json()["NodeNames"] == [LOADED]
    async with running(nats_url, model="capped:most-allocated", rollout_mode="shadow") as r:
        out = (await r.client.post("/filter", json=body)).json()
        assert out["NodeNames"] == ["node-0", LOADED, "node-2"] and out["FailedNodes"] == {}
