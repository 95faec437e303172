"""The reward-calculator process on a real nats-server: every component and the configured scheme
are published; a decision delivered twice yields one reward and one experience in the EXPERIENCE stream; a
refused bind and a decision whose pod the snapshot shows elsewhere are acked without a reward."""

from __future__ import annotations

import asyncio
import time

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, state_to_dict
from agmarl_testing.fixtures import wait_healthy

CLUSTER = "reward-it"


def decision(did: str = "dedup-1", pod: str = "p", node: str = "a") -> m.Decision:
    now = time.time() - 1.0
    return m.Decision(decision_id=did, cluster=CLUSTER, namespace="default", pod_key=f"default/{pod}", node=node,
                      policy="kube-resources", mode="full", seen_at=now, decided_at=now)


def snapshot(seq: int, bound: tuple[str, ...] = ("p",)) -> m.ClusterSnapshot:
    state = ClusterState.empty([Node("a", 1000, 1000), Node("b", 1000, 1000)])
    for name in bound:
        state = bind(state, Pod(name, 100, 100, qos="LS"), 0)
    return m.ClusterSnapshot(cluster=CLUSTER, seq=seq, time=float(seq), state=state_to_dict(state),
                             stats={"bound": float(seq), "pending": 0.0, "violations": 0.0}, epoch="e")


async def held(bus: Bus, n: int) -> bool:
    """Every decision delivered, ``n`` of them not acked yet."""
    info = await bus.js.consumer_info(subjects.DECISIONS.name, subjects.durable("reward-calculator", CLUSTER))
    return info.num_pending == 0 and info.num_ack_pending == n


async def all_acked(bus: Bus) -> bool:
    return await held(bus, 0)


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
        await bus.publish(subjects.snapshot(CLUSTER), snapshot(3, ("p", "r", "s")))  # r is on a, not b
        assert await until(lambda: rewarded(2)) and await until(lambda: all_acked(bus)), proc.output()[-3000:]
        assert [r.decision_id for r in rewards] == ["dedup-1", "ok-2"]
        r = rewards[0]
        assert r.scheme == "lexicographic" and 0.0 <= r.total <= 1.0
        assert {"utilisation", "balance", "sla", "constraints", "business"} <= set(r.components)
        assert all(0.0 <= v <= 1.0 for v in r.components.values())

        sub = await bus.js.subscribe(subjects.experience(CLUSTER), ordered_consumer=True)
        got = []
        try:
            while True:
                got.append(m.decode(m.Experience, (await sub.next_msg(timeout=1.0)).data))
        except asyncio.TimeoutError:
            pass
        await sub.unsubscribe()
        assert [e.id for e in got] == ["dedup-1", "ok-2"]
        # the first delivery came before any snapshot: the transition says it lacks the cluster it was made on
        assert got[0].state["missing"] == "no_snapshot" and got[0].action["node"] == "a"
        assert got[0].action["pod"]["name"] == "p" and got[0].next_state["snapshot_seq"] == 1
    finally:
        await bus.close()
