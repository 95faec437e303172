"""Property-based fuzzing of the extender's HTTP edge: whatever arrives at filter, prioritize, bind and
preempt, the answer is 200, 400, 413 or 422 (never 500), a 200 is JSON kube-scheduler can read, every
decision the extender logs can be encoded and published, and the service stays healthy.

Volume runs in-process (the FastAPI app as the service builds it, over httpx's ASGI transport, one event
loop for the module): hypothesis generates requests from pods and nodes shaped like kube-scheduler's,
mutated (fields deleted, retyped, made huge), arbitrary JSON and raw bytes; then every recorded request
in /work/shared/k8s/extender-samples/ is mutated field by field. A handful of the worst go over real
HTTP to the real service (nats-server, ServiceRuntime, uvicorn), which must keep deciding afterwards.
Figures: run with ``-s`` to see requests and statuses per verb.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from pydantic_core import from_json

from agmarl_common.kube import convert as kc
from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.cluster.model import Pod
from agmarl_common.core.cluster.view import ClusterView
from agmarl_common.core.policies.registry import get_policy
from agmarl_inference.extender import ExtenderMetrics, ExtenderService
from agmarl_inference.extender_log import decision_subject
from agmarl_inference.http import build_app
from agmarl_inference.settings import InferenceSettings
from agmarl_testing.extender import LOADED, SAMPLES, names, pod_json, prioritize, running, sample_nodes

ALLOWED = {200, 400, 413, 422}
MAX_NODES = 40  # the fuzzed service's node limit: lists up to 50 cross it
MAX_BODY = 192 * 1024  # its body limit: huge values cross it, and bodies over 64 KiB are parsed on a thread
# generated examples per test: each filter/prioritize body goes to both verbs, so 10,000 requests in all
EXAMPLES = {("filter", "prioritize"): 2500, ("bind",): 2500, ("preempt",): 2500}
FUZZ = settings(deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
TOKEN = re.compile(r"[!-~]{1,63}")


# --- the service under test, in-process ----------------------------------------------------------------

class Source:
    """The inference app as the extender sees it: a model, the default scoring, a rollout mode."""

    def __init__(self) -> None:
        self.policy, self.default = get_policy("most-allocated"), get_policy("kube-resources")
        self.model_version, self.mode = "fuzz", "full"

    def set_mode(self, mode: str, reason: str) -> None:
        self.mode = mode


class Log:
    """Stands in for the decision publisher: after each answer (as the publisher does), builds every
    offered decision, encodes and decodes it and checks its subject's tokens."""

    def __init__(self) -> None:
        self.offered: list = []
        self.built = 0

    def offer(self, build, ctx) -> bool:
        self.offered.append(build)
        return True

    def publish_all(self) -> None:
        while self.offered:
            decision = self.offered.pop()()
            assert m.decode(m.Decision, m.encode(decision)) == decision
            subject = decision_subject(decision)
            assert all(TOKEN.fullmatch(t) for t in subject.split(".")), subject
            self.built += 1


class Binder:
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        if name.startswith("x"):
            raise RuntimeError("the API refused it")


class Harness:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.settings = InferenceSettings(cluster="fuzz", extender_budget_ms=1000, max_body_bytes=MAX_BODY,
                                          extender_max_nodes=MAX_NODES)
        view = ClusterView()
        busy = [Pod(f"busy-{k}", 4000, 16384, namespace="load", node_name=LOADED) for k in range(3)]
        view.apply_snapshot("fuzz", 1, kc.pods_on_nodes(sample_nodes(), busy))
        self.log = Log()
        self.ext = ExtenderService(self.settings, Source(), view, ExtenderMetrics(CollectorRegistry()),
                                   publisher=self.log, binder=Binder())
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(self.ext)),
                                        base_url="http://extender", timeout=30.0)
        self.counts: dict[str, Counter] = {}
        self.seconds: dict[str, float] = {}

    def post(self, verb: str, body: bytes) -> httpx.Response:
        resp = self.loop.run_until_complete(self.client.post(
            f"/ext/{verb}", content=body, headers={"Content-Type": "application/json"}))
        self.counts.setdefault(verb, Counter())[resp.status_code] += 1
        check(verb, resp)
        self.log.publish_all()
        return resp

    def healthy(self) -> None:
        assert self.loop.run_until_complete(self.client.get("/healthz")).status_code == 200
        body = {"Pod": pod_json(), "Nodes": None, "NodeNames": names()}
        resp = self.post("prioritize", json.dumps(body).encode())
        assert resp.status_code == 200 and max(h["Score"] for h in resp.json()) > 0  # still scoring

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.ext.close()
        self.loop.close()


def check(verb: str, resp: httpx.Response) -> None:
    """The status is one kube-scheduler can be given; a 200 is strict JSON of the verb's answer shape."""
    assert resp.status_code in ALLOWED, (verb, resp.status_code, resp.text[:500])
    answer = from_json(resp.content, allow_inf_nan=False)  # UTF-8, no NaN: Go's encoding/json reads it
    if resp.status_code != 200:
        assert isinstance(answer.get("detail"), str)
    elif verb == "filter":
        assert isinstance(answer, dict) and answer.get("Error", "") == ""
        assert answer.get("NodeNames") is not None or answer.get("Nodes") is not None
    elif verb == "prioritize":
        assert all(isinstance(h["Host"], str) and 0 <= h["Score"] <= 10 for h in answer)
    elif verb == "bind":
        assert set(answer) == {"Error"}
    else:
        assert all(v is not None for v in answer["NodeNameToMetaVictims"].values())


@pytest.fixture(scope="module")
def harness():
    h = Harness()
    yield h
    h.healthy()
    print("\nextender fuzz (in-process):")
    for verb, counts in h.counts.items():
        print(f"  {verb:10s} {sum(counts.values()):6d} requests  {dict(sorted(counts.items()))}")
    print("  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in h.seconds.items()))
    print(f"  decisions built, encoded and given a subject: {h.log.built}")
    h.close()


# --- strategies -------------------------------------------------------------------------------------------

NODE_OBJECTS = json.loads((SAMPLES / "nocache-filter-1-request.json").read_text())["Nodes"]["items"][:3]
SAMPLE_POD = json.loads((SAMPLES / "cache-filter-1-request.json").read_text())["Pod"]
NODE_NAMES = names()

leaf = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20))
anything = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
huge = st.sampled_from([10 ** 40, -(10 ** 40), 2 ** 63, 1e308, "x" * 100_000, "é" * 70_000, ["n"] * 5000,
                        {f"k{i}": i for i in range(3000)}, "9" * 5000, "1e999999", "-1"])
name = st.sampled_from(NODE_NAMES) | st.text(max_size=12) | st.sampled_from(["", "a" * 4100, "node-0.x", ">"])
namespace = st.sampled_from(["default", "team-a", "", "n" * 4100, "a.b c", "*", ">", "\u00e9\u00e9"]) \
    | st.text(max_size=70)
quantity = (st.sampled_from(["100m", "1", "2Gi", "0", "-1", "1e3", "1e100", "0.5", "lots", "", "1Ki", "1E18",
                             "9223372036854775807", "100000000000000000000Ei", ".5", "1m", "+1", "0x10"])
            | st.integers(-(2 ** 70), 2 ** 70) | st.floats(allow_nan=False, allow_infinity=False) | anything)
resources = st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage", "pods"]),
                            quantity, max_size=3)
container = st.fixed_dictionaries({"name": st.text(max_size=5)}, optional={
    "resources": st.fixed_dictionaries({}, optional={"requests": resources, "limits": resources}),
    "restartPolicy": st.sampled_from(["Always", "Never", 3])})
selector_term = st.fixed_dictionaries({"matchExpressions": st.lists(st.fixed_dictionaries({
    "key": st.sampled_from(["kubernetes.io/hostname", "zone", ""]) | anything,
    "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Bogus"]),
    "values": st.lists(st.text(max_size=6) | st.integers(), max_size=2)}), max_size=2)})
pod_term = st.fixed_dictionaries({"topologyKey": st.sampled_from(["kubernetes.io/hostname", ""]) | anything},
                                 optional={"labelSelector": st.fixed_dictionaries({}, optional={
                                     "matchLabels": st.dictionaries(st.text(max_size=5), st.text(max_size=5)
                                                                    | anything, max_size=2)})})
spec = st.fixed_dictionaries({"containers": st.lists(container, max_size=2)}, optional={
    "initContainers": st.lists(container, max_size=1),
    "overhead": resources,
    "nodeName": name,
    "nodeSelector": st.dictionaries(st.text(max_size=8), st.text(max_size=8) | anything, max_size=2),
    "priority": st.integers(-(2 ** 40), 2 ** 40) | anything,
    "tolerations": st.lists(st.fixed_dictionaries({}, optional={
        "key": st.text(max_size=8), "operator": st.sampled_from(["Exists", "Equal", "Bad"]),
        "value": st.text(max_size=5) | anything, "effect": st.sampled_from(["NoSchedule", "NoExecute", "x"]),
        "tolerationSeconds": st.integers() | anything}), max_size=2),
    "affinity": st.fixed_dictionaries({}, optional={
        "nodeAffinity": st.fixed_dictionaries({}, optional={
            "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries(
                {"nodeSelectorTerms": st.lists(selector_term, max_size=1)}),
            "preferredDuringSchedulingIgnoredDuringExecution": st.lists(st.fixed_dictionaries(
                {"weight": st.integers(-5, 200) | anything, "preference": selector_term}), max_size=1)}),
        "podAffinity": st.fixed_dictionaries({}, optional={
            "requiredDuringSchedulingIgnoredDuringExecution": st.lists(pod_term, max_size=1)}),
        "podAntiAffinity": st.fixed_dictionaries({}, optional={
            "requiredDuringSchedulingIgnoredDuringExecution": st.lists(pod_term, max_size=1)})}),
    "topologySpreadConstraints": st.lists(st.fixed_dictionaries({
        "maxSkew": st.integers(-2, 5) | anything, "topologyKey": st.text(max_size=10),
        "whenUnsatisfiable": st.sampled_from(["DoNotSchedule", "ScheduleAnyway", "?"])}), max_size=1),
    "resources": st.fixed_dictionaries({}, optional={"requests": resources}),
})
metadata = st.fixed_dictionaries({"name": name, "namespace": namespace}, optional={
    "uid": st.text(max_size=36), "labels": st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    "annotations": st.dictionaries(st.sampled_from(["alibabacloud.com/gpu-milli", "alibabacloud.com/gpu-count",
                                                    "agmarl.io/gpu-models", "other"]),
                                   st.sampled_from(["500", "1000", "0", "2", "-3", "x", "A100|V100", "99999"])
                                   | st.text(max_size=5), max_size=2)})
pod = st.fixed_dictionaries({"metadata": metadata, "spec": spec}, optional={
    "status": st.fixed_dictionaries({}, optional={"phase": st.sampled_from(["Pending", "Running", "Succeeded"])})})


def paths(doc: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every (container, key) path of a JSON document, depth first."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from paths(value, prefix + (key,))


def at(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutated(draw, base: st.SearchStrategy) -> Any:
    """A document from ``base`` with up to two fields deleted or given another type, then maybe one
    made huge (last, so that no mutation lands inside a huge value)."""
    doc = copy.deepcopy(draw(base))
    actions = draw(st.lists(st.sampled_from(["delete", "retype"]), max_size=2)) + draw(st.sampled_from([[], ["huge"]]))
    for action in actions:
        found = list(paths(doc))
        if not found:
            break
        path = draw(st.sampled_from(found))
        parent, key = at(doc, path[:-1]), path[-1]
        if action == "delete":
            del parent[key]
        else:
            parent[key] = copy.deepcopy(draw(anything if action == "retype" else huge))
    return doc


node_list = st.fixed_dictionaries({"metadata": st.just({}), "items": st.lists(
    st.sampled_from(NODE_OBJECTS).map(copy.deepcopy) | mutated(st.sampled_from(NODE_OBJECTS)), max_size=4)})
some_pod = pod | st.just(SAMPLE_POD) | mutated(st.just(SAMPLE_POD)) | anything
node_names = st.lists(name, max_size=12) | st.lists(st.sampled_from(NODE_NAMES), min_size=30, max_size=50)
extender_args = st.fixed_dictionaries({"Pod": some_pod}, optional={
    "Nodes": st.none() | node_list | anything, "NodeNames": st.none() | node_names | anything})
binding_args = st.fixed_dictionaries({"PodName": name, "PodNamespace": namespace, "Node": name},
                                    optional={"PodUID": st.text(max_size=36)}) | st.dictionaries(
    st.sampled_from(["PodName", "PodNamespace", "PodUID", "Node", "podname", "node"]), name | anything, max_size=4)
meta_victims = st.dictionaries(name, st.none() | st.fixed_dictionaries({}, optional={
    "Pods": st.lists(st.fixed_dictionaries({"UID": st.text(max_size=36) | anything}) | anything, max_size=3)
    | anything, "NumPDBViolations": st.integers(-(2 ** 70), 2 ** 70) | anything}) | anything, max_size=5)
victims = st.dictionaries(name, st.none() | st.fixed_dictionaries({}, optional={
    "Pods": st.lists(st.none() | st.just(SAMPLE_POD) | anything | st.fixed_dictionaries({"metadata": st.fixed_dictionaries(
        {"uid": st.text(max_size=36) | anything})}), max_size=3) | anything,
    "NumPDBViolations": st.integers(-(2 ** 70), 2 ** 70) | anything}) | anything, max_size=5)
preemption_args = st.fixed_dictionaries({"Pod": st.just(SAMPLE_POD) | anything}, optional={
    "NodeNameToVictims": st.none() | victims | anything, "NodeNameToMetaVictims": st.none() | meta_victims | anything})
DOCS = {"filter": extender_args, "prioritize": extender_args, "bind": binding_args, "preempt": preemption_args}


@st.composite
def body(draw, verb: str) -> bytes:
    """Mostly a request document, often mutated, keys sometimes lower-cased; else broken bytes."""
    kind = draw(st.sampled_from(["doc"] * 5 + ["mutated"] * 3 + ["lowercase", "raw", "cut"]))
    if kind == "raw":
        return draw(st.binary(max_size=64) | st.sampled_from([
            b"", b"null", b"[]", b"{", b"{}", b'"x"', b"1e999", b'{"Pod": NaN}', b'{"Pod": Infinity}',
            b"[" * 1000 + b"]" * 1000, b'{"a":' * 300 + b"1" + b"}" * 300, b"\xff\xfe{}", b'{"Pod": "\xc3"}',
            b'{"Pod": {}, "NodeNames": ["\\ud800"]}', b'{"Pod": {}, "NodeNames": ["\\udfff\\ud800"]}',
            b'{"Pod": {"metadata": {"name": "\\ud83d"}}}', b'\xef\xbb\xbf{"Pod": {}}', b'{"Pod": {}}' * 2]))
    doc = draw(DOCS[verb] if kind != "mutated" else mutated(DOCS[verb]))
    if kind == "lowercase" and isinstance(doc, dict):
        doc = {k.lower(): v for k, v in doc.items()}
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    if kind == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    return text.encode("utf-8")


# --- generated requests -----------------------------------------------------------------------------------

def _fuzz(harness: Harness, verbs: tuple[str, ...]) -> None:
    started = time.perf_counter()
    before = sum(sum(harness.counts.get(v, Counter()).values()) for v in verbs)

    @settings(FUZZ, max_examples=EXAMPLES[verbs])
    @given(data=body(verbs[0]))
    def one(data: bytes) -> None:
        for verb in verbs:
            harness.post(verb, data)
    one()
    harness.seconds["+".join(verbs)] = time.perf_counter() - started
    sent = sum(sum(harness.counts[v].values()) for v in verbs) - before
    assert sent >= EXAMPLES[verbs] * len(verbs)
    harness.healthy()


@pytest.mark.parametrize("verbs", list(EXAMPLES), ids="+".join)
def test_generated_requests_never_fail(harness, verbs):
    _fuzz(harness, verbs)


# --- the recorded samples, mutated field by field --------------------------------------------------------

RETYPED = [None, True, 7, "x", [1], {"k": "v"}]
HUGE = [10 ** 40, "x" * 100_000]


def _field_paths(doc: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every field path, descending into the first element of each list only (the others are alike)."""
    items = doc.items() if isinstance(doc, dict) else list(enumerate(doc))[:1] if isinstance(doc, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from _field_paths(value, prefix + (key,))


def sample_mutations() -> Iterator[tuple[str, dict]]:
    """(verb, request): each field of the recorded requests deleted, retyped and made huge, once per
    verb and field path (the samples of one verb share most fields)."""
    done: set[tuple] = set()
    for path in sorted(SAMPLES.glob("*-request.json")):
        verb, doc = _verb(path), json.loads(path.read_text())
        for field in _field_paths(doc):
            if (verb, field) in done:
                continue
            done.add((verb, field))
            parent, key = field[:-1], field[-1]
            for action in ["delete", *RETYPED, *HUGE]:
                out = copy.deepcopy(doc)
                if action == "delete":
                    del at(out, parent)[key]
                else:
                    at(out, parent)[key] = copy.deepcopy(action)
                yield verb, out


def _verb(path: Path) -> str:
    return path.name.removesuffix("-request.json").rsplit("-", 2)[-2]


def test_recorded_samples_mutated_field_by_field(harness):
    started, sent = time.perf_counter(), 0
    for verb, doc in sample_mutations():
        harness.post(verb, json.dumps(doc).encode())
        sent += 1
    harness.seconds["samples"] = time.perf_counter() - started
    print(f"\nrecorded samples mutated field by field: {sent} requests in {harness.seconds['samples']:.1f} s")
    assert sent > 2000
    harness.healthy()


# --- a handful over real HTTP, to the real service ----------------------------------------------------------

WORST = [
    ("filter", b"[" * 1000 + b"]" * 1000, 400),
    ("prioritize", b'{"Pod": {}, "NodeNames": ["\\ud800"]}', 400),
    ("preempt", json.dumps({"Pod": pod_json(), "NodeNameToVictims": {"n": {"Pods": [1, "x"]}}}).encode(), 422),
    ("preempt", json.dumps({"Pod": pod_json(), "NodeNameToVictims": {"n": {"NumPDBViolations": "many"}}}).encode(),
     422),
    ("bind", b'{"PodName": ["x"]}', 422),
    ("prioritize", json.dumps({"Pod": pod_json(), "NodeNames": ["node-0"] * 20_000}).encode(), 413),
    ("prioritize", json.dumps({"Pod": pod_json(namespace="n" * 4100), "NodeNames": names()}).encode(), 200),
    ("filter", json.dumps({"Pod": pod_json(namespace="a.b >*"), "NodeNames": names()}).encode(), 200),
]


async def test_the_worst_over_real_http_leave_the_service_deciding(nats_url):
    async with running(nats_url, extender_budget_ms=2000) as r:
        got = await r.bus.subscribe(subjects.decision_wildcard(r.cluster))
        for verb, data, status in WORST:
            resp = await r.client.post(f"/ext/{verb}", content=data, headers={"Content-Type": "application/json"})
            assert resp.status_code == status, (verb, data[:60], resp.text[:300])
            check(verb, resp)
        scores = await prioritize(r)
        assert scores[LOADED] == max(scores.values()) > 0
        r.ext.service.sweep(time.time() + 3600)  # scored decisions wait for their binding: none will come here
        seen: list[m.Decision] = []
        while not any(d.namespace == "default" for d in seen):
            seen.append(m.decode(m.Decision, (await got.next_msg(timeout=5)).data))
        assert any(d.namespace == "n" * 4100 for d in seen)  # published, under a hashed subject token
        # NATS kept the connection (a 4,100-character namespace once made a subject the server refused): a round
        # trip after those publishes finds it never dropped
        await r.rt.bus.flush()
        assert r.rt.bus.is_connected and r.rt.bus.nc.stats["reconnects"] == 0
        assert (await r.client.get("/healthz")).status_code == 200
