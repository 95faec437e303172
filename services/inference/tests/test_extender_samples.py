"""The kube-scheduler extender over real HTTP (``agmarl_testing.extender``: real nats-server,
ServiceRuntime, InferenceApp, uvicorn on a free loopback port). Every request kube-scheduler sent in
/work/shared/k8s/extender-samples/ is replayed byte for byte and the answer must have the recorded
response's shape; then paths and health, filter reasons, the cache modes, no time left, shutdown.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.cluster.model import HOSTNAME_LABEL
from agmarl_common.runtime.metrics import sample
from agmarl_inference.extender_wire import NEUTRAL_SCORE
from agmarl_testing.extender import LOADED, SAMPLES, pod_json, prioritize, running


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
        assert ready.status_code == 200 and ready.json()["graph_version"] == 1
    async with running(nats_url, feed=False) as r:
        ready = await r.client.get("/ext/readyz")
        assert ready.status_code == 503 and "no cluster graph yet" in ready.json()["problems"]
        # a cold cache never blocks scheduling: filter passes the nodes on, prioritize is neutral
        resp = await r.client.post("/filter", json={"Pod": pod_json(), "NodeNames": ["node-0", "x"]})
        assert resp.json()["NodeNames"] == ["node-0", "x"]
        assert set((await prioritize(r, nodes=["node-0", "x"])).values()) == {NEUTRAL_SCORE}
        assert r.fallbacks("cache_cold") == 2


async def test_filter_fails_unknown_and_infeasible_nodes_with_reasons(nats_url):
    async with running(nats_url) as r:
        sub = await r.bus.subscribe(subjects.decision_wildcard(r.cluster))
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


async def test_shutdown_closes_the_port(nats_url):
    async with running(nats_url) as r:
        port = r.ext.port
        assert (await r.client.get("/healthz")).status_code == 200
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as c:
            await c.get(f"http://127.0.0.1:{port}/healthz")
