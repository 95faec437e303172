"""Batch mode: the pure joint decision + arbiter + ledger on tiny literal clusters, and the binder
against a STAND-IN API server (agmarl_testing.k8s_api: real HTTP, the official kubernetes client;
there is no Kubernetes API here) with a real nats-server."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from kubernetes import client

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.filters import filter_node, violations
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, state_to_dict, to_dict
from agmarl_common.core.cluster.specs import AGMARL_BATCH_SCHEDULER, AGMARL_SCHEDULER
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.kube.names import InvalidName
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_testing.k8s_api import StandInApiServer, node_json, pod_json
from agmarl_inference.batch import BatchConfig, start_batch_mode
from agmarl_inference.bindworker import create_binding
from agmarl_inference.batchcore import Ledger, batch_order, decide_batch
from agmarl_inference.settings import InferenceSettings

NODES = (Node("a", 4000, 8192), Node("b", 4000, 8192), Node("c", 4000, 8192))


def pod(name: str, cpu: int, mem: int = 512, **kw) -> Pod:
    return Pod(name, cpu, mem, scheduler_name=AGMARL_BATCH_SCHEDULER, **kw)


# --- the pure core ------------------------------------------------------------------------------

@pytest.mark.parametrize("policy,ranks", [("kube-default", [0, 1, 2]), ("trimaran-lvrb", [0, 1, 2]),
                                          ("kube-resources", [0, 0, 0]), ("most-allocated", [0, 0, 0])])
def test_batch_that_fits_only_one_per_node_gets_different_nodes(policy, ranks):
    pods = [pod("p1", 3000), pod("p2", 3000), pod("p3", 3000)]
    placements, final = decide_batch(pods, ClusterState.empty(NODES), get_policy(policy))
    assert sorted(p.node for p in placements) == ["a", "b", "c"]
    assert violations(final) == []
    # every pod was proposed node "a" first (same score, lowest index): the arbiter moved the later ones
    # down their proposals; a policy with local scores proposes against the state the earlier grants left
    # (a full node is no longer a candidate), so each gets its first proposal
    assert [p.rank for p in placements] == ranks


@pytest.mark.parametrize("policy,pods,expected", [
    # (cpu requests), expected node per pod name; "" = left pending. kube-default (scores not local): the
    # largest request first, with the batch's starting scores
    ("kube-default", [("small", 1000), ("big", 3500), ("mid", 2000)], {"big": "a", "mid": "b", "small": "b"}),
    ("kube-default", [("huge", 9000), ("ok", 1000)], {"huge": "", "ok": "a"}),
    ("kube-default", [("x", 4000), ("y", 4000), ("z", 4000), ("w", 4000)], {"w": "a", "x": "b", "y": "c", "z": ""}),
    # kube-resources (local scores): kube-scheduler's queue order (here the given order: equal priority and
    # age), each pod scored on the state the earlier ones left, as LeastAllocated one pod at a time
    ("kube-resources", [("small", 1000), ("big", 3500), ("mid", 2000)], {"small": "a", "big": "b", "mid": "c"}),
    ("kube-resources", [("x", 4000), ("y", 4000), ("z", 4000), ("w", 4000)],
     {"x": "a", "y": "b", "z": "c", "w": ""}),
])
def test_arbiter_order_and_never_overcommits(policy, pods, expected):
    batch = [pod(n, c) for n, c in pods]
    chosen = get_policy(policy)
    placements, final = decide_batch(batch, ClusterState.empty(NODES), chosen)
    assert {p.pod.name: p.node for p in placements} == expected
    assert [p.pod.name for p in placements] == [p.name for p in batch_order(batch, chosen)]
    assert violations(final) == []


def test_local_scores_follow_the_queue_order_priority_then_arrival():
    """A local-score policy's batch in kube-scheduler's queue order: priority, then the order the pods came
    in (the ledger's oldest announcement first); the others: priority, then the largest request."""
    batch = [pod("first", 1000, creation_time=5.0), pod("urgent", 500, priority=10, creation_time=9.0),
             pod("second", 3000, creation_time=1.0), pod("third", 2000, creation_time=5.0)]
    assert [p.name for p in batch_order(batch, get_policy("fgd"))] == ["urgent", "first", "second", "third"]
    assert [p.name for p in batch_order(batch, get_policy("kube-default"))] == ["urgent", "second", "third", "first"]


def test_infeasible_pod_is_never_placed_and_says_why():
    hdd = Node("t", 64000, 65536, labels={"disk": "hdd"})
    nodes = NODES + (Node("gpu", 64000, 65536, gpu_count=1, unschedulable=True),)
    state = ClusterState.empty(nodes + (hdd,))
    picky = pod("picky", 100, node_selector={"disk": "ssd"})
    gpu = pod("gpu", 100, num_gpu=1, gpu_milli=1000)
    placements, _ = decide_batch([picky, gpu], state, get_policy("kube-resources"))
    by_name = {p.pod.name: p for p in placements}
    assert by_name["picky"].node == ""
    assert by_name["picky"].reason == ("0/5 nodes are available: 4 node(s) didn't match Pod's node "
                                       "affinity/selector, 1 node(s) were unschedulable")
    assert by_name["gpu"].node == "" and by_name["gpu"].reason.startswith("0/5 nodes are available")


def test_every_placement_passes_the_hard_filter_in_the_state_before_it():
    pods = [pod(f"p{i}", 700 + 300 * (i % 4), 1024 * (1 + i % 3)) for i in range(12)]
    state = ClusterState.empty(NODES)
    placements, final = decide_batch(pods, state, get_policy("most-allocated"))
    replay = state
    for pl in placements:
        if pl.node:
            assert filter_node(pl.pod, replay, pl.node_index).ok
            replay = bind(replay, pl.pod, pl.node_index, pl.gpus)
        else:
            assert not any(filter_node(pl.pod, replay, i).ok for i in range(replay.n_nodes))
    assert violations(final) == []


def test_arbiter_applies_the_policys_admission_to_the_state_after_earlier_picks():
    """capped:most-allocated: every pod proposes the same packed node first; the arbiter re-checks the
    load cap after each grant, so no node ends above 80 % cpu (uncapped, the first node takes two)."""
    state = ClusterState.empty(NODES)
    for i in range(3):
        state = bind(state, pod(f"base{i}", 2000, qos="BE"), i)
    batch = [pod(f"p{i}", 1000, qos="BE") for i in range(3)]
    packed, _ = decide_batch(batch, state, get_policy("most-allocated"))
    assert sorted(p.node for p in packed).count("a") == 2
    capped, final = decide_batch(batch, state, get_policy("capped:most-allocated"))
    assert sorted(p.node for p in capped) == ["a", "b", "c"]
    assert (final.cpu_used / final.cpu_cap).max() <= 0.8
    # a fourth pod has no admitting node left: unplaced, and the reason names the admission
    late, _ = decide_batch([pod("late", 500, qos="BE")], final, get_policy("capped:most-allocated"))
    assert late[0].node == "" and "none admits the pod" in late[0].reason and "LoadCap" in late[0].reason
    ls, _ = decide_batch([pod("ls", 500, qos="LS")], final, get_policy("capped:most-allocated"))
    assert ls[0].node  # latency-sensitive pods are not held back


def test_ledger_keeps_every_pod_in_exactly_one_status():
    led = Ledger()
    pods = [pod(f"p{i}", 100) for i in range(4)]
    assert all(led.offer(p, 1.0) for p in pods)
    assert not led.offer(pods[0], 1.0)  # announced again: no duplicate
    assert [p.name for p in led.due(0.0, 10)] == ["p0", "p1", "p2", "p3"]
    led.binding("default/p0", "a")
    led.binding("default/p1", "b")
    led.unschedulable("default/p2", "0/3 nodes are available", not_before=5.0)
    assert [p.name for p in led.due(1.0, 10)] == ["p3"]
    assert led.attempt_failed("default/p1", "HTTP 500") == 1
    led.release("default/p1", "binding failed", not_before=2.0)
    led.bound("default/p0")
    led.gone("default/p3", "deleted")
    assert led.counts() == {"queued": 1, "binding": 0, "bound": 1, "unschedulable": 1, "gone": 1}
    assert sum(led.counts().values()) == 4
    assert [p.name for p in led.due(5.0, 10)] == ["p1", "p2"]
    assert led.entries["default/p1"].releases == 1
    assert led.entries["default/p1"].history == ["queued", "binding: b", "attempt 1 failed: HTTP 500",
                                                 "queued: binding failed"]
    assert led.offer(pods[0], 9.0)  # a bound pod announced pending again is queued again
    assert led.entries["default/p0"].status == "queued"


def test_batch_config_reads_batch_settings():
    s = InferenceSettings(batch_scheduler_name="my-sched", rollout_mode="hybrid", kubeconfig="/k", kube_context="c")
    cfg = BatchConfig.from_settings(s)
    assert (cfg.scheduler_name, cfg.mode, cfg.window_s) == ("my-sched", "hybrid", 0.2)
    assert (cfg.kubeconfig, cfg.kube_context) == ("/k", "c")  # the one kubeconfig setting (KubeSettings)
    assert BatchConfig().scheduler_name == AGMARL_BATCH_SCHEDULER
    assert cfg.max_pods == BatchConfig().max_pods == InferenceSettings().batch_max_pods  # one default
    sized = BatchConfig.from_settings(InferenceSettings(batch_max_pods=32, batch_window_s=0.05))
    assert (sized.max_pods, sized.window_s) == (32, 0.05)


def test_batch_scheduler_is_never_the_extender_profile():
    """kube-scheduler with the extender owns agmarl-scheduler's pods: batch mode may not claim them too."""
    with pytest.raises(ValueError, match="agmarl-scheduler"):
        InferenceSettings(batch_scheduler_name=AGMARL_SCHEDULER)


# --- the binder against the stand-in ---------------------------------------------------------------

class Harness:
    """Stand-in API with 3 nodes, a runtime running the batch binder, a bus recording decisions."""

    def __init__(self, standin, rt, binder, bus, decisions, cluster):
        self.standin, self.rt, self.binder, self.bus, self.decisions, self.cluster = \
            standin, rt, binder, bus, decisions, cluster

    async def snapshot(self, pending: list[Pod]) -> None:
        state = ClusterState.empty(NODES)
        await self.bus.publish(subjects.snapshot(self.cluster), m.ClusterSnapshot(
            cluster=self.cluster, seq=1, time=time.time(), state=state_to_dict(state),
            pending=[to_dict(p) for p in pending]))

    async def offer(self, pods: list[Pod]) -> None:
        for p in pods:
            self.standin.add_pod(pod_json(p.name, cpu=f"{p.cpu_milli}m", scheduler_name=AGMARL_BATCH_SCHEDULER))
            await self.bus.publish(subjects.pending(self.cluster), m.PendingPod(
                cluster=self.cluster, pod=to_dict(p), seen_at=time.time(), seq=1))


async def until(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


@pytest.fixture
async def harness(nats_url, tmp_path):
    standin = StandInApiServer().start()
    for n in NODES:
        standin.add_node(node_json(n.name, cpu="4", memory="8Gi"))
    cluster = f"b{uuid.uuid4().hex[:8]}"
    settings = InferenceSettings(nats_url=nats_url, cluster=cluster, trace_dir=str(tmp_path),
                                 batch_scheduler_name=AGMARL_BATCH_SCHEDULER)
    rt = ServiceRuntime(f"inference-batch-{cluster}", settings)
    api = client.ApiClient(client.Configuration(host=standin.url))
    cfg = BatchConfig(window_s=0.1, bind_attempts=3, bind_backoff_s=0.05, bind_timeout_s=2.0, retry_s=0.3)
    binder = start_batch_mode(rt, settings, api_client=api, cfg=cfg)
    await rt.start()
    await rt.bus.ensure_streams()
    bus = await Bus.connect(nats_url, "test-batch")
    decisions: list[m.Decision] = []

    async def on_decision(msg):
        decisions.append(m.decode(m.Decision, msg.data))

    await bus.subscribe(subjects.decision_wildcard(cluster), on_decision)
    h = Harness(standin, rt, binder, bus, decisions, cluster)
    try:
        yield h
    finally:
        await binder.stop()
        await bus.close()
        await rt.shutdown()
        standin.stop()
        api.close()


def bound_nodes(standin) -> dict[str, str]:
    return dict(standin.bindings)


async def test_binder_binds_a_batch_conflict_free(harness):
    pods = [pod("p1", 3000), pod("p2", 3000), pod("p3", 3000)]
    await harness.snapshot(pods)
    await harness.offer(pods)
    assert await until(lambda: len(harness.standin.bindings) == 3)
    assert sorted(bound_nodes(harness.standin).values()) == ["a", "b", "c"]
    assert await until(lambda: len(harness.decisions) == 3)
    d = harness.decisions
    assert {x.source for x in d} == {"batch"} and {x.node for x in d} == {"a", "b", "c"}
    assert len({x.explanation["batch_id"] for x in d}) == 1  # decided together
    assert harness.binder.ledger.counts()["bound"] == 3
    assert all(harness.standin.pod(f"default/{p.name}")["spec"]["nodeName"] for p in pods)


async def test_infeasible_pod_stays_pending_with_a_reason(harness):
    big, ok = pod("big", 9000), pod("ok", 1000)
    await harness.snapshot([big, ok])
    await harness.offer([big, ok])
    assert await until(lambda: len(harness.decisions) == 2)
    await asyncio.sleep(0.5)  # retried after retry_s: still infeasible, still not bound, no repeat decision
    assert bound_nodes(harness.standin) == {"default/ok": "a"}
    e = harness.binder.ledger.entries["default/big"]
    assert e.status == "unschedulable" and "Insufficient cpu" in e.reason
    assert harness.standin.pod("default/big")["spec"].get("nodeName") is None
    nodeless = [x for x in harness.decisions if not x.node]
    assert len(nodeless) == 1 and "Insufficient cpu" in nodeless[0].explanation["reason"]
    assert harness.binder.batches >= 2


async def test_failed_binding_is_retried_with_backoff(harness):
    p = pod("retry", 1000)
    harness.standin.fail_bindings(2, 500)
    await harness.snapshot([p])
    await harness.offer([p])
    assert await until(lambda: bound_nodes(harness.standin).get("default/retry") == "a")
    posts = [r for r in harness.standin.requests if r.method == "POST"]
    assert len(posts) == 3
    assert posts[2].at - posts[1].at >= 0.09 > 0 and posts[1].at - posts[0].at >= 0.045  # 0.05, then 0.1
    assert await until(lambda: len(harness.decisions) == 1)
    assert harness.decisions[0].explanation["bind_attempts"] == 3
    assert harness.binder.ledger.entries["default/retry"].status == "bound"


async def test_binding_released_after_the_bound_then_bound_later_nothing_lost(harness):
    pods = [pod("r1", 1000), pod("r2", 1000)]
    harness.standin.fail_bindings(6, 500)  # 3 attempts each for both pods: both released once
    await harness.snapshot(pods)
    await harness.offer(pods)
    led = harness.binder.ledger
    # the API server records a binding before the binder has read its answer: wait for both
    assert await until(lambda: len(harness.standin.bindings) == 2 and led.counts()["bound"] == 2, timeout=30.0)
    assert led.counts() == {"queued": 0, "binding": 0, "bound": 2, "unschedulable": 0, "gone": 0}
    assert all(led.entries[f"default/{p.name}"].releases == 1 for p in pods)
    assert await until(lambda: len(harness.decisions) == 4)
    released = [x for x in harness.decisions if not x.node]
    assert len(released) == 2 and all("binding failed 3 times" in x.explanation["reason"] for x in released)
    assert sorted(x.pod_key for x in harness.decisions if x.node) == ["default/r1", "default/r2"]


async def test_conflict_releases_and_redecides(harness):
    p = pod("c1", 1000)
    harness.standin.fail_bindings(1, 409)
    await harness.snapshot([p])
    await harness.offer([p])
    e = harness.binder.ledger.entries
    assert await until(lambda: "default/c1" in e and e["default/c1"].status == "bound")
    assert bound_nodes(harness.standin) == {"default/c1": "a"}
    e = e["default/c1"]
    assert e.releases == 1
    assert any("conflict" in h for h in e.history)


async def test_unpublished_decision_does_not_unbind_a_bound_pod(harness):
    """JetStream too slow to ack the Decision after the Binding was accepted: the pod stays bound (before,
    the publish error was taken for a failed binding: a retry got 409 and released the bound pod)."""
    p = pod("slow-ack", 1000)
    publish = harness.binder._publish

    async def no_ack(pl, policy, batch_id, size, attempts, reason, released=False):
        if pl.node and not released and not reason:
            raise TimeoutError("nats: timeout")
        await publish(pl, policy, batch_id, size, attempts, reason, released)

    harness.binder._publish = no_ack
    await harness.snapshot([p])
    await harness.offer([p])
    led = harness.binder.ledger
    assert await until(lambda: "default/slow-ack" in led.entries and led.entries["default/slow-ack"].status == "bound")
    await asyncio.sleep(0.3)
    e = led.entries["default/slow-ack"]
    assert e.status == "bound" and e.releases == 0 and e.attempts == 0
    assert len([r for r in harness.standin.requests if r.method == "POST"]) == 1
    assert bound_nodes(harness.standin) == {"default/slow-ack": "a"}
    assert harness.binder.results.labels(result="decision_unpublished")._value.get() == 1


def published(binder, result: str = "decision_published") -> int:
    return int(binder.results.labels(result=result)._value.get())


async def stored_decisions(harness) -> int:
    """Messages the DECISIONS stream holds on this cluster's decision subject (the default namespace)."""
    subject = subjects.decision(harness.cluster, "default")
    info = await harness.bus.js.stream_info(subjects.DECISIONS.name, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


class JetStreamDouble:
    """Wraps the binder's ``publish_async``: ``lose`` sends go out but their PubAck never reaches the binder;
    ``refuse`` sends are answered with an error without being sent. Records every send's Nats-Msg-Id."""

    def __init__(self, js, lose: int = 0, refuse: int = 0):
        self.js, self.lose, self.refuse, self.sent = js, lose, refuse, []

    def __getattr__(self, name):  # everything else: the real JetStream context
        return getattr(self.js, name)

    async def publish_async(self, subject, payload, **kw):
        self.sent.append(kw["headers"]["Nats-Msg-Id"])
        if self.refuse:
            self.refuse -= 1
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(RuntimeError("nats: stream refused the message"))
            return fut
        ack = await self.js.publish_async(subject, payload, **kw)
        if self.lose:
            self.lose -= 1
            return asyncio.get_running_loop().create_future()  # the real one is acked; this one never is
        return ack


async def offer_through(harness, name: str, **double):
    """The binder publishing through a ``JetStreamDouble(**double)`` (PubAcks awaited 0.3 s), then one pod offered."""
    binder = harness.binder
    binder.rt.bus.js = JetStreamDouble(binder.rt.bus.js, **double)
    binder.outbox.timeout = 0.3
    p = pod(name, 1000)
    await harness.snapshot([p])
    await harness.offer([p])
    return binder, binder.rt.bus.js


async def test_every_decision_of_a_batch_is_published_and_acked(harness):
    pods = [pod("a1", 3000), pod("a2", 3000), pod("a3", 3000), pod("a4", 9000)]  # a4 fits nowhere
    await harness.snapshot(pods)
    await harness.offer(pods)
    binder = harness.binder
    assert await until(lambda: binder.ledger.counts()["bound"] == 3 and published(binder) == 4)
    assert not binder.outbox.pending and not binder.outbox.resends
    assert published(binder, "decision_unpublished") == 0
    assert await stored_decisions(harness) == 4  # each acked Decision is in the stream
    assert len({d.explanation["batch_id"] for d in harness.decisions}) == 1


async def test_decision_whose_puback_is_lost_is_sent_again_and_stored_once(harness):
    binder, double = await offer_through(harness, "lost-ack", lose=1)
    assert await until(lambda: published(binder) == 1)
    assert len(double.sent) == 2 and double.sent[0] == double.sent[1]  # the same Nats-Msg-Id, sent twice
    assert published(binder, "decision_unpublished") == 0
    assert await stored_decisions(harness) == 1  # JetStream kept one copy
    assert binder.ledger.entries["default/lost-ack"].status == "bound"


async def test_stop_waits_for_the_acks_of_decisions_already_sent(harness):
    binder, double = await offer_through(harness, "stopping", lose=1)
    led = binder.ledger
    assert await until(lambda: "default/stopping" in led.entries and led.entries["default/stopping"].status == "bound")
    assert published(binder) == 0 and len(double.sent) == 1  # sent, its PubAck lost
    await binder.stop()  # what the service's shutdown runs (rt.on_stop)
    assert published(binder) == 1 and len(double.sent) == 2
    assert not binder.outbox.pending and not binder.outbox.resends


async def test_decision_refused_on_every_send_is_counted_and_the_pod_stays_bound(harness, caplog):
    binder, double = await offer_through(harness, "refused", refuse=3)
    assert await until(lambda: published(binder, "decision_unpublished") == 1)
    assert len(double.sent) == 3 == binder.cfg.publish_attempts and len(set(double.sent)) == 1
    assert published(binder) == 0
    assert binder.ledger.entries["default/refused"].status == "bound"
    assert bound_nodes(harness.standin) == {"default/refused": "a"}
    assert any("not published after 3 sends" in r.getMessage() for r in caplog.records)
    assert await stored_decisions(harness) == 0


async def test_pod_with_a_name_kubernetes_refuses_is_gone_without_a_request(harness):
    bad = pod("Bad_Name", 1000)
    await harness.snapshot([bad])
    await harness.bus.publish(subjects.pending(harness.cluster), m.PendingPod(
        cluster=harness.cluster, pod=to_dict(bad), seen_at=time.time(), seq=1))
    led = harness.binder.ledger
    assert await until(lambda: "default/Bad_Name" in led.entries and led.entries["default/Bad_Name"].status == "gone")
    assert "invalid pod name" in led.entries["default/Bad_Name"].reason
    assert not [r for r in harness.standin.requests if r.method == "POST"]


def test_create_binding_reads_the_status_answer_and_raises_on_errors():
    with StandInApiServer() as standin:
        standin.add_node(node_json("a"))
        standin.add_pod(pod_json("p"))
        api = client.CoreV1Api(client.ApiClient(client.Configuration(host=standin.url)))
        create_binding(api, "default", "p", "a", 2.0)  # the API's Status answer is not an error
        assert standin.bindings == [("default/p", "a")]
        with pytest.raises(client.exceptions.ApiException) as conflict:
            create_binding(api, "default", "p", "a", 2.0)  # already bound
        assert conflict.value.status == 409
        with pytest.raises(client.exceptions.ApiException) as missing:
            create_binding(api, "default", "nope", "a", 2.0)
        assert missing.value.status == 404
        posts = len([r for r in standin.requests if r.method == "POST"])
        for namespace, name, node in (("Default", "p", "a"), ("default", "p/../x", "a"), ("default", "p", "a b"),
                                      ("default", "-p", "a"), ("default", "p" * 254, "a"), ("n" * 64, "p", "a")):
            with pytest.raises(InvalidName):
                create_binding(api, namespace, name, node, 2.0)
        assert len([r for r in standin.requests if r.method == "POST"]) == posts  # refused before any request


# --- the bind worker process under the binder ------------------------------------------------------

async def test_bind_worker_that_dies_with_a_binding_in_flight_is_replaced_and_the_pod_bound(harness):
    """The worker process ends while the API holds its Binding: the Binding counts as a failed attempt,
    a new worker is started (counted) and the retry through it binds the pod."""
    binder, standin = harness.binder, harness.standin
    assert await until(lambda: binder.worker.alive)
    first = binder.worker.proc
    standin.hold_bindings(1)
    p = pod("orphan", 1000)
    await harness.snapshot([p])
    await harness.offer([p])
    assert await until(lambda: standin.held == 1)
    first.kill()
    led = binder.ledger
    assert await until(lambda: led.entries["default/orphan"].status == "bound")
    e = led.entries["default/orphan"]
    assert any("WorkerGone" in h for h in e.history) and e.releases == 0
    assert binder.worker_restarts._value.get() == 1 and binder.worker.proc.pid != first.pid
    assert bound_nodes(standin) == {"default/orphan": "a"}  # by the retry; the held request is still held
    assert await until(lambda: len(harness.decisions) == 1)
    assert harness.decisions[0].explanation["bind_attempts"] == 2
    standin.release_bindings()


async def test_stop_lets_the_bindings_in_flight_finish(harness):
    """stop() drains: a Binding the API is still answering ends bound (not cancelled back to the queue), its
    Decision is published, and the worker process exits by itself."""
    binder, standin = harness.binder, harness.standin
    standin.hold_bindings(1)
    p = pod("draining", 1000)
    await harness.snapshot([p])
    await harness.offer([p])
    assert await until(lambda: standin.held == 1)
    stopping = asyncio.create_task(binder.stop())
    assert await until(lambda: binder.loop_task.done())
    assert not stopping.done()
    standin.release_bindings()
    await asyncio.wait_for(stopping, 10.0)
    assert binder.ledger.entries["default/draining"].status == "bound"
    assert bound_nodes(standin) == {"default/draining": "a"}
    assert published(binder) == 1
    assert binder.worker.proc.returncode == 0
