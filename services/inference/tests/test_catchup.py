"""The decision log's catch-up: pods kube-scheduler bound alone before inference listened get an ``unassisted``
entry, once, on a real nats-server's EVENTS and DECISIONS streams."""

from __future__ import annotations

import datetime
import time
import uuid

import pytest

from agmarl_common.core.cluster.model import Pod, to_dict
from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_testing.secure_nats import auth, secure_server
from agmarl_inference.catchup import catch_up, unlogged

EXT = "agmarl-scheduler"


def bound(cluster: str, seq: int, name: str, node: str, at: float, scheduler: str = EXT,
          namespace: str = "default") -> m.ClusterEvent:
    pod = Pod(name, 100, 128, namespace=namespace, scheduler_name=scheduler, node_name=node)
    return m.ClusterEvent(cluster=cluster, seq=seq, epoch="e1", type="pod_bound", pod_key=pod.key, node=node,
                          time=at, pod=to_dict(pod))


def entry(cluster: str, key: str, node: str) -> m.Decision:
    ns = key.partition("/")[0]
    return m.Decision(decision_id=f"d-{key}", cluster=cluster, namespace=ns, pod_key=key, node=node, bound_node=node,
                      policy="model:default", mode="hybrid", seen_at=1.0, decided_at=1.0, source="extender")


def test_only_pods_of_the_extenders_schedulers_never_logged_and_never_asked_about():
    c = "c"
    events = [bound(c, 1, "logged", "n1", 10.0), bound(c, 2, "alone", "n2", 11.0),
              bound(c, 3, "other", "n3", 12.0, scheduler="default-scheduler"),
              bound(c, 4, "late", "n4", 30.0), bound(c, 5, "alone", "n5", 13.0),  # bound again: the last counts
              m.ClusterEvent(cluster=c, seq=6, type="pod_deleted", pod_key="default/gone", time=14.0)]
    found = unlogged(events, {"default/logged"}, [EXT])
    assert [(e.pod_key, e.node) for e in found] == [("default/late", "n4"), ("default/alone", "n5")]
    # "late": a pod this process's extender was asked about (its entry may not be out yet) is not logged here
    assert [e.pod_key for e in unlogged(events, {"default/logged", "default/late"}, [EXT])] == ["default/alone"]
    assert unlogged(events, set(), []) == []
    # an event whose pod the state-collector's cache did not hold carries none: the view's scheduler decides
    bare = m.ClusterEvent(cluster=c, seq=7, type="pod_bound", pod_key="default/bare", node="n6", time=15.0)
    assert unlogged([bare], set(), [EXT]) == []
    assert unlogged([bare], set(), [EXT], known={"default/bare": EXT}) == [bare]
    assert unlogged([bare], set(), [EXT], known={"default/bare": "default-scheduler"}) == []


async def test_the_pods_bound_alone_are_logged_once_as_unassisted(nats_url):
    cluster = f"catchup-{uuid.uuid4().hex[:6]}"
    bus = await Bus.connect(nats_url, name="test-catchup")
    try:
        await bus.ensure_streams()
        now = time.time()
        for ev in (bound(cluster, 1, "logged", "n1", now - 30), bound(cluster, 2, "alone", "n2", now - 20,
                                                                        namespace="team-a"),
                   bound(cluster, 3, "other", "n3", now - 10, scheduler="default-scheduler")):
            await bus.js_publish(subjects.event(cluster), ev)
        d = entry(cluster, "default/logged", "n1")
        await bus.js_publish(subjects.decision(cluster, d.namespace), d, msg_id=d.decision_id)

        async def publish(decision: m.Decision) -> None:
            await bus.js_publish(subjects.decision(cluster, decision.namespace), decision,
                                 msg_id=decision.decision_id)

        first = await catch_up(bus, publish, cluster, [EXT], 600.0, now, "hybrid")
        assert (first.logged, first.events, first.entries) == (1, 3, 1)
        again = await catch_up(bus, publish, cluster, [EXT], 600.0, now, "hybrid")  # it finds its entry
        assert (again.logged, again.entries) == (0, 2)
        since = datetime.datetime.fromtimestamp(now - 600, datetime.timezone.utc)
        log = await bus.read_back(subjects.decision_wildcard(cluster), since, lambda b: m.decode(m.Decision, b), 2.0)
        [new] = [e for e in log if e.source == m.UNASSISTED]
        assert (new.pod_key, new.namespace, new.node, new.bound_node, new.policy) == (
            "team-a/alone", "team-a", "n2", "n2", "")
        assert "without a decision of the services" in new.explanation["reason"]
        assert len(log) == 2
        assert (await catch_up(bus, publish, cluster, [EXT], 0.0, now, "hybrid")).logged == 0  # off
    finally:
        await bus.close()


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A real nats-server that knows only the generated identities (their least-privilege permissions)."""
    yield from secure_server(tmp_path_factory)


async def test_inferences_identity_may_read_the_bindings_and_the_log_back(secure):
    # what `agmarl up` and the deployments run: inference reads EVENTS (written by the state-collector) and
    # DECISIONS through ordered consumers under its own identity (without the permission: a nats timeout)
    server, creds = secure
    cluster = f"catchup-{uuid.uuid4().hex[:6]}"
    collector = await Bus.connect(server.url, "state-collector", auth=auth(creds, "state-collector"))
    inference = await Bus.connect(server.url, "inference", auth=auth(creds, "inference"))
    try:
        await inference.ensure_streams()
        now = time.time()
        await collector.js_publish(subjects.event(cluster), bound(cluster, 1, "alone", "n2", now - 5))

        async def publish(decision: m.Decision) -> None:
            await inference.js_publish(subjects.decision(cluster, decision.namespace), decision,
                                       msg_id=decision.decision_id)

        assert (await catch_up(inference, publish, cluster, [EXT], 600.0, now, "hybrid")).logged == 1
        assert (await catch_up(inference, publish, cluster, [EXT], 600.0, now, "hybrid")).logged == 0
    finally:
        await inference.close()
        await collector.close()
