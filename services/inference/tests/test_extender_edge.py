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
    """priorities_json writes a HostPriorityList from the host list's bytes kept with blank scores: the list of
    {"Host", "Score"} objects, every host once in request order, for names JSON must escape, every score, one
    host list after another; a score as two characters (JSON allows the space: byte for byte the compact
    list once the spaces are gone); scores outside 0..10 or not ints, and a host named twice, written out."""
    import numpy as np

    from agmarl_inference.extender_wire import Priorities, priorities_json

    def plain(pairs):
        return json.dumps([{"Host": h, "Score": int(v)} for h, v in pairs], separators=(",", ":")).encode()

    rng = np.random.default_rng(3)
    names = [f"node-{i}" for i in range(300)] + ['we"ird\\name', "ünïcode-node", "tab\there", "Score:10 }"]
    for _ in range(8):  # the same host lists again and others: the kept bytes serve only their own list
        hosts = names if rng.random() < 0.5 else names[::-1][:200]
        scores = rng.integers(0, 11, len(hosts))
        written = priorities_json(Priorities(hosts, scores))
        assert json.loads(written) == [{"Host": h, "Score": int(v)} for h, v in zip(hosts, scores)]
        assert written.replace(b" ", b"") == plain(zip(hosts, scores)).replace(b" ", b"")
        assert len(written) == len(plain(zip(hosts, scores))) + int((scores < 10).sum())
    for odd in (-1, 11, 5.0):  # written out: the numbers as they are
        hosts, values = ["a", "b", "c"], [3, odd, 10]
        assert priorities_json(Priorities(hosts, np.asarray(values))) == plain(zip(hosts, np.asarray(values))), odd
    # a host named twice: one entry, as a dict of the scores
    assert priorities_json(Priorities(["a", "b", "a"], np.array([1, 2, 1]))) == plain([("a", 1), ("b", 2)])
    assert priorities_json(Priorities([], np.zeros(0, np.int64))) == b"[]"
    assert priorities_json(Priorities.neutral(["x", "y"])) == b'[{"Host":"x","Score": 0},{"Host":"y","Score": 0}]'


def test_the_explanation_top_nodes_and_the_candidate_names_read_lazily():
    """``_top`` gives the first k of the stable descending order (ties by index, NaN last) without sorting
    every candidate; ``CandidateNames`` reads the names of the candidates it is asked for, finds a node's
    position by the state's index, and is a sequence (len, slices, membership)."""
    import numpy as np

    from agmarl_common.core.cluster.model import ClusterState, Node
    from agmarl_inference.extender import CandidateNames
    from agmarl_inference.extender_scoring import _top

    rng = np.random.default_rng(5)
    for t in range(500):
        n, k = int(rng.integers(1, 60)), int(rng.integers(1, 6))
        v = rng.integers(0, 4, n).astype(float) if t % 2 else rng.random(n)
        if t % 5 == 0 and n > 2:
            v[rng.integers(0, n)] = np.nan
        assert np.array_equal(_top(v, k)[:min(k, n)], np.argsort(-v, kind="stable")[:min(k, n)]), (v, k)
    state = ClusterState.empty([Node(f"n{i}", 1000, 1024) for i in range(10)])
    names = CandidateNames(state, np.array([7, 2, 9, 2], np.int64))
    assert len(names) == 4 and list(names) == ["n7", "n2", "n9", "n2"] and names[1:3] == ["n2", "n9"]
    assert names.index("n2") == 1 and names.index("n2", 2) == 3 and "n9" in names
    assert "n3" not in names and "nowhere" not in names and 7 not in names
    with pytest.raises(ValueError):
        names.index("n3")
