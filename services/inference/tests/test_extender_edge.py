"""The extender's edge: ``parse_args`` (table-driven: 400 not JSON as Go writes it, 413 too many nodes,
422 not the schema), then over real HTTP (``agmarl_testing.extender``) where large bodies are parsed
(a thread) and what a parse that outlasts the time budget answers.
"""

from __future__ import annotations

import copy
import json
import threading

import pytest

from agmarl_inference import extender_routes
from agmarl_inference.extender_wire import (
    BodyError,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
    parse_args,
)
from agmarl_testing.extender import SAMPLES, pod_json, running

POD = json.dumps(pod_json())

REJECTED = [
    # (name, model, body, status, reason, text in detail)
    ("not json", ExtenderArgs, b"{not json", 400, "malformed", "not JSON"),
    ("empty", ExtenderArgs, b"", 400, "malformed", "not JSON"),
    ("nan", ExtenderArgs, b'{"Pod": NaN}', 400, "malformed", "not JSON"),
    ("too deep", ExtenderArgs, b"[" * 1000 + b"]" * 1000, 400, "malformed", "recursion limit"),
    ("not utf-8", ExtenderArgs, b'{"Pod": "\xff"}', 400, "encoding", "not UTF-8"),
    ("lone surrogate", ExtenderArgs, b'{"Pod": {}, "NodeNames": ["\\ud800"]}', 400, "encoding", "hex escape"),
    ("reversed pair", ExtenderArgs, b'{"Pod": {}, "NodeNames": ["\\udfff\\ud800"]}', 400, "encoding", "not JSON"),
    ("names", ExtenderArgs, b'{"Pod": {}, "NodeNames": ["a", "b", "c"]}', 413, "too_many_nodes", "3 nodes"),
    ("names, any spelling", ExtenderArgs, b'{"Pod": {}, "NodeNames": [], "nodenames": ["a", "b", "c"]}', 413,
     "too_many_nodes", "3 nodes"),
    ("node objects", ExtenderArgs, b'{"Pod": {}, "Nodes": {"items": [{}, {}, {}]}}', 413, "too_many_nodes", "3"),
    ("victims", ExtenderPreemptionArgs, b'{"Pod": {}, "NodeNameToVictims": {"a": {}, "b": {}, "c": {}}}', 413,
     "too_many_nodes", "3"),
    ("not an object", ExtenderArgs, b"[1, 2]", 422, "schema", "not a ExtenderArgs"),
    ("no pod", ExtenderArgs, b'{"NodeNames": []}', 422, "schema", "Pod"),
    ("name a list", ExtenderArgs, b'{"Pod": {}, "NodeNames": [["a"]]}', 422, "schema", "NodeNames.0"),
    ("node metadata a list", ExtenderArgs, b'{"Pod": {}, "Nodes": {"items": [{"metadata": []}]}}', 422, "schema",
     "items.0.metadata"),
    ("node name a number", ExtenderArgs, b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": 3}}]}}', 422,
     "schema", "items.0.metadata"),
    ("victim pods not pods", ExtenderPreemptionArgs, b'{"Pod": {}, "NodeNameToVictims": {"n": {"Pods": [1]}}}', 422,
     "schema", "NodeNameToVictims.n"),
    ("pdb violations not a number", ExtenderPreemptionArgs,
     b'{"Pod": {}, "NodeNameToVictims": {"n": {"NumPDBViolations": "many"}}}', 422, "schema", "NumPDBViolations"),
    ("pdb violations past int64", ExtenderPreemptionArgs,
     b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"NumPDBViolations": 9223372036854775808}}}', 422, "schema",
     "NumPDBViolations"),
    ("meta victim uid a number", ExtenderPreemptionArgs,
     b'{"Pod": {}, "NodeNameToMetaVictims": {"n": {"Pods": [{"UID": 7}]}}}', 422, "schema", "UID"),
    ("binding name a list", ExtenderBindingArgs, b'{"PodName": ["x"], "PodNamespace": "d", "Node": "n"}', 422,
     "schema", "PodName"),
]


@pytest.mark.parametrize("name,model,body,status,reason,text", REJECTED, ids=[r[0] for r in REJECTED])
def test_parse_args_rejects(name, model, body, status, reason, text):
    with pytest.raises(BodyError) as info:
        parse_args(model, body, max_nodes=2)
    assert (info.value.status, info.value.reason) == (status, reason)
    assert text in info.value.detail


@pytest.mark.parametrize("model,body", [
    (ExtenderArgs, b'{"Pod": {}, "NodeNames": ["a", "b"]}'),
    (ExtenderArgs, b'{"pod": {}, "nodenames": ["\\ud83d\\ude00"]}'),  # a surrogate pair is one character
    (ExtenderArgs, b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a"}}, {}]}, "NodeNames": null}'),
    (ExtenderPreemptionArgs, b'{"Pod": {}, "NodeNameToVictims": {"n": {"Pods": [null, {"metadata": {"uid": "u"}}]}}}'),
    (ExtenderBindingArgs, b'{"PodName": "p", "PodNamespace": "d", "Node": "n"}'),
])
def test_parse_args_accepts(model, body):
    assert isinstance(parse_args(model, body, max_nodes=2), model)


def test_a_huge_key_is_cut_in_the_detail():
    body = json.dumps({"Pod": {}, "NodeNameToMetaVictims": {"k" * 100_000: {"NumPDBViolations": "x"}}}).encode()
    with pytest.raises(BodyError) as info:
        parse_args(ExtenderPreemptionArgs, body, max_nodes=10)
    assert info.value.status == 422 and len(info.value.detail) < 1000


def _node_list(n: int) -> dict:
    proto = json.loads((SAMPLES / "nocache-filter-1-request.json").read_text())["Nodes"]["items"][0]
    items = []
    for i in range(n):
        node = copy.deepcopy(proto)
        node["metadata"]["name"] = f"big-{i}"
        items.append(node)
    return {"metadata": {}, "items": items}


async def test_large_bodies_are_parsed_on_a_thread(nats_url, monkeypatch):
    threads: list[str] = []

    def spy(*args):
        threads.append(threading.current_thread().name)
        return parse_args(*args)
    monkeypatch.setattr(extender_routes, "parse_args", spy)
    async with running(nats_url, extender_budget_ms=5000) as r:
        small = await r.client.post("/filter", json={"Pod": pod_json(), "NodeNames": ["node-0"]})
        big = await r.client.post("/filter", json={"Pod": pod_json(), "Nodes": _node_list(300), "NodeNames": None})
        assert small.status_code == big.status_code == 200
        assert len(big.json()["Nodes"]["items"]) + len(big.json()["FailedNodes"]) == 300
    assert threads[0] == threading.current_thread().name  # the event loop's thread
    assert threads[1].startswith("extender-body")


async def test_a_parse_that_outlasts_the_budget(nats_url):
    """1 ms of budget: a 300-node list cannot be read and parsed in it. Prioritize answers no scores at
    once; filter, which has to name the nodes that pass, passes every node on once parsed."""
    async with running(nats_url, extender_budget_ms=1) as r:
        body = json.dumps({"Pod": pod_json(), "Nodes": _node_list(300), "NodeNames": None}).encode()
        assert len(body) > extender_routes.INLINE_BYTES
        scores = await r.client.post("/prioritize", content=body, headers={"Content-Type": "application/json"})
        assert scores.status_code == 200 and scores.json() == []
        assert r.fallbacks("parse_timeout") == 1
        passed = await r.client.post("/filter", content=body, headers={"Content-Type": "application/json"})
        assert passed.status_code == 200
        assert [n["metadata"]["name"] for n in passed.json()["Nodes"]["items"]] == [f"big-{i}" for i in range(300)]
        assert r.fallbacks("filter_timeout") == 1
        # too many nodes is still 413, however late
        many = json.dumps({"Pod": pod_json(), "NodeNames": [f"n{i}" for i in range(20_000)]}).encode()
        assert (await r.client.post("/filter", content=many)).status_code == 413


def test_the_answer_is_the_json_of_the_host_priority_list_whatever_the_scores():
    """priorities_json writes a HostPriorityList from per-host entries kept for each score 0..10: the same bytes
    as serialising the list of {"Host", "Score"} objects, for names JSON must escape, every score, one node list
    after another, and scores outside 0..10 (written out, never looked up from the wrong end)."""
    import numpy as np

    from agmarl_inference.extender_wire import priorities_json

    def plain(scores):
        return json.dumps([{"Host": h, "Score": int(v)} for h, v in scores.items()], separators=(",", ":")).encode()

    rng = np.random.default_rng(3)
    names = [f"node-{i}" for i in range(300)] + ['we"ird\\name', "ünïcode-node", "tab\there"]
    for _ in range(6):  # the same node lists again and others: the kept entries serve only their own list
        hosts = names if rng.random() < 0.5 else names[::-1][:200]
        scores = dict(zip(hosts, rng.integers(0, 11, len(hosts)).tolist()))
        assert priorities_json(scores) == plain(scores)
    for odd in (-1, 11, 5.0, True):
        scores = {"a": 3, "b": odd, "c": 10}
        assert priorities_json(scores) == plain(scores), odd
    assert priorities_json({}) == b"[]"
