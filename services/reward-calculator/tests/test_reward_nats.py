"""The reward-calculator process on a real nats-server: every component and the configured scheme
are published; a decision delivered twice yields one reward and one experience in the EXPERIENCE stream; a
refused bind and a decision whose pod the snapshot shows elsewhere are acked without a reward. Killed with
SIGKILL while it holds decisions, the next process rewards every bound one exactly once, even when the pods
have left the cluster before the decisions come again: it reads the bind outcomes back from EVENTS."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import httpx

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, state_to_dict, to_dict
from agmarl_testing.fixtures import decisions_taken_up, health_until, wait_healthy

CLUSTER = "reward-it"


def decision(did: str = "dedup-1", pod: str = "p", node: str = "a", cluster: str = CLUSTER,
             age: float = 1.0) -> m.Decision:
    now = time.time() - age
    return m.Decision(decision_id=did, cluster=cluster, namespace="default", pod_key=f"default/{pod}", node=node,
                      policy="kube-resources", mode="full", seen_at=now, decided_at=now)


def snapshot(seq: int, bound: tuple[str, ...] = ("p",), cluster: str = CLUSTER,
             pending: tuple[str, ...] = ()) -> m.ClusterSnapshot:
    state = ClusterState.empty([Node("a", 1000, 1000), Node("b", 1000, 1000)])
    for name in bound:
        state = bind(state, Pod(name, 100, 100, qos="LS"), 0)
    return m.ClusterSnapshot(cluster=cluster, seq=seq, time=float(seq), state=state_to_dict(state),
                             pending=[to_dict(Pod(name, 100, 100, qos="LS")) for name in pending],
                             stats={"bound": float(seq), "pending": float(len(pending)), "violations": 0.0}, epoch="e")


async def held(bus: Bus, n: int, cluster: str = CLUSTER) -> bool:
    """Every decision delivered, ``n`` of them not acked yet."""
    info = await bus.js.consumer_info(subjects.DECISIONS.name, subjects.durable("reward-calculator", cluster))
    return info.num_pending == 0 and info.num_ack_pending == n


async def all_acked(bus: Bus, cluster: str = CLUSTER) -> bool:
    return await held(bus, 0, cluster)


async def until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_components_scheme_and_experience_dedup(nats_url, service_processes):
    bus = await Bus.connect(nats_url, name="test-reward")
    try:
        await bus.ensure_streams()
        rewards: list[m.Reward] = []

        async def on_reward(msg):
            rewards.append(m.decode(m.Reward, msg.data))

        await bus.subscribe(subjects.reward(CLUSTER), on_reward)
        await bus.flush()
        proc = service_processes("agmarl_reward_calculator", env={
            "NATS_URL": nats_url, "AGMARL_CLUSTER": CLUSTER, "AGMARL_SCHEME": "lexicographic"})
        await wait_healthy(bus, "reward-calculator", timeout=30, proc=proc)

        async def rewarded(n: int):
            return len(rewards) >= n

        # the same decision twice (a redelivery: no message id): held unacked until a snapshot shows it bound,
        # then the second delivery is acked at once, with no second reward
        await bus.js_publish(subjects.decision(CLUSTER, "default"), decision())
        assert await until(lambda: held(bus, 1)), proc.output()[-3000:]
        await bus.publish(subjects.snapshot(CLUSTER), snapshot(1))
        assert await until(lambda: all_acked(bus)) and await until(lambda: rewarded(1)), proc.output()[-3000:]
        await bus.js_publish(subjects.decision(CLUSTER, "default"), decision())
        assert await until(lambda: all_acked(bus)), proc.output()[-3000:]
        await bus.publish(subjects.snapshot(CLUSTER), snapshot(2))
        # a refused bind (event) and a decision for a pod the snapshot shows on another node: no reward
        await bus.js_publish(subjects.decision(CLUSTER, "default"), decision("refused-1", "q", "b"))
        await bus.publish(subjects.event(CLUSTER), m.ClusterEvent(
            cluster=CLUSTER, seq=3, type="bind_rejected", pod_key="default/q", node="b", time=3.0,
            decision_id="refused-1", epoch="e"))
        await bus.js_publish(subjects.decision(CLUSTER, "default"), decision("elsewhere-1", "r", "b"))
        await bus.js_publish(subjects.decision(CLUSTER, "default"), decision("ok-2", "s", "a"))
        # the decisions reach the process before the snapshot that settles them (a snapshot first would leave them
        # for the next one, which this test never sends; refused-1 may be settled by its event already)
        await decisions_taken_up(bus, CLUSTER, proc=proc)
        await bus.publish(subjects.snapshot(CLUSTER), snapshot(3, ("p", "r", "s")))  # r is on a, not b
        assert await until(lambda: rewarded(2)) and await until(lambda: all_acked(bus)), proc.output()[-3000:]
        assert [r.decision_id for r in rewards] == ["dedup-1", "ok-2"]
        r = rewards[0]
        assert r.scheme == "lexicographic" and 0.0 <= r.total <= 1.0
        assert {"utilisation", "balance", "sla", "constraints", "business"} <= set(r.components)
        assert all(0.0 <= v <= 1.0 for v in r.components.values())

        got = await read_experience(bus, CLUSTER)
        assert [e.id for e in got] == ["dedup-1", "ok-2"]
        # the first delivery came before any snapshot: the first one, within late_seconds of the decision, stands
        # for the cluster it was made on (it already shows the pod bound: taken back to before)
        assert "missing" not in got[0].state and got[0].state["snapshot_seq"] == 1 and got[0].action["node"] == "a"
        assert got[0].state["cluster"]
        assert got[0].action["pod"]["name"] == "p" and got[0].next_state["snapshot_seq"] == 1
    finally:
        await bus.close()


async def read_experience(bus: Bus, cluster: str) -> list[m.Experience]:
    sub = await bus.js.subscribe(subjects.experience(cluster), ordered_consumer=True)
    got = []
    try:
        while True:
            got.append(m.decode(m.Experience, (await sub.next_msg(timeout=1.0)).data))
    except asyncio.TimeoutError:
        pass
    await sub.unsubscribe()
    return got


async def test_a_killed_process_s_bound_decisions_are_rewarded_after_their_pods_left(nats_url, service_processes):
    """kill -9 while five decisions are held; their outcomes come while it is down (one before the kill); the
    pods have finished and left by the time the next process gets the decisions again (after ack_wait):
    every bound one has exactly one experience, the refused and the never-bound ones none."""
    cluster = "reward-kill"
    env = {"NATS_URL": nats_url, "AGMARL_CLUSTER": cluster, "AGMARL_DECISION_ACK_WAIT": "2"}
    bus = await Bus.connect(nats_url, name="test-reward-kill")
    seq = iter(range(1, 1000))

    async def event(etype: str, did: str, pod: str, node: str = "a") -> None:
        n = next(seq)
        bound = {**to_dict(Pod(pod, 100, 100, qos="LS")), "node_name": node} if etype == "pod_bound" else {}
        await bus.publish(subjects.event(cluster), m.ClusterEvent(
            cluster=cluster, seq=n, type=etype, pod_key=f"default/{pod}", node=node, time=float(n), decision_id=did,
            epoch="e", pod=bound))

    try:
        await bus.ensure_streams()
        proc = service_processes("agmarl_reward_calculator", env=env)
        await wait_healthy(bus, "reward-calculator", timeout=30, proc=proc)
        pods = ("p1", "p2", "p3", "p4")
        first = next(seq)
        await bus.publish(subjects.snapshot(cluster), snapshot(first, (), cluster, pending=pods))
        await health_until(bus, "reward-calculator", lambda h: h.details.get("snapshot_seq", -1) >= first,
                           proc=proc, what="on the snapshot before the decisions")
        for i, pod in enumerate(pods, 1):
            await bus.js_publish(subjects.decision(cluster, "default"), decision(f"d{i}", pod, "a", cluster))
        assert await until(lambda: held(bus, 4, cluster)), proc.output()[-3000:]
        await event("pod_bound", "d1", "p1")  # seen by this process, never by the next one
        await health_until(bus, "reward-calculator", lambda h: h.details.get("outcomes_seen", 0) >= 1, proc=proc,
                           what="told d1 is bound")
        os.kill(proc.pid, signal.SIGKILL)
        proc.proc.wait(10)
        # while it is down: d2 bound, d3 refused, d4 never applied; d5 decided and bound
        await event("pod_bound", "d2", "p2")
        await event("bind_rejected", "d3", "p3", "b")
        await bus.js_publish(subjects.decision(cluster, "default"), decision("d5", "p5", "a", cluster))
        await event("pod_bound", "d5", "p5")
        # d6: an entry for a pod kube-scheduler placed alone (inference's catch-up): settled, never rewarded
        alone = decision("d6", "p6", "a", cluster).model_copy(update={"source": "unassisted"})
        await bus.js_publish(subjects.decision(cluster, "default"), alone)
        await bus.flush()
        proc = service_processes("agmarl_reward_calculator", env=env)
        health = await wait_healthy(bus, "reward-calculator", timeout=30, proc=proc)

        async def settled():  # a snapshot now and then: every pod has finished and left the cluster
            await bus.publish(subjects.snapshot(cluster), snapshot(next(seq), (), cluster))
            return await all_acked(bus, cluster)

        assert await until(settled, timeout=30), proc.output()[-3000:]
        metrics = httpx.get(f"http://127.0.0.1:{health.metrics_port}/metrics", timeout=5.0).text
        got = await read_experience(bus, cluster)
    finally:
        await bus.close()
    assert sorted(e.id for e in got) == ["d1", "d2", "d5"], proc.output()[-3000:]
    for e in got:  # the pods left before any snapshot of this process: each from its pod_bound event
        assert e.action["node"] == "a" and e.action["pod_key"] == f"default/p{e.id[1]}"
        assert e.action["pod"]["name"] == f"p{e.id[1]}" and "node_name" not in e.action["pod"]
    # d5 was decided while the new process started: its first snapshot is at most late_seconds after it
    late = {e.id for e in got if e.state.get("missing") == "late"}
    assert late <= {"d1", "d2", "d5"}
    samples = dict(re.findall(r'^(agmarl_(?:outcomes_recalled|decisions_unrewarded)_total\{[^}]*\}) (\S+)$', metrics,
                              re.M))
    assert samples == {'agmarl_outcomes_recalled_total{type="pod_bound"}': "3.0",
                       'agmarl_outcomes_recalled_total{type="bind_rejected"}': "1.0",
                       'agmarl_decisions_unrewarded_total{reason="not_bound"}': "1.0",  # d4
                       'agmarl_decisions_unrewarded_total{reason="refused"}': "1.0",  # d3
                       'agmarl_decisions_unrewarded_total{reason="unassisted"}': "1.0"}, samples  # d6
