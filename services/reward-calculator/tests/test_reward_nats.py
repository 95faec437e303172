"""The reward-calculator process on a real nats-server: every component and the configured scheme
are published, and a decision delivered twice yields one experience in the EXPERIENCE stream."""

from __future__ import annotations

import asyncio
import time

from agmarl_common import messages as m
from agmarl_common import subjects
from agmarl_common.bus import Bus
from agmarl_common.cluster.model import ClusterState, Node, Pod, bind, state_to_dict
from agmarl_common.testing import wait_healthy

CLUSTER = "reward-it"


def decision() -> m.Decision:
    now = time.time() - 1.0
    return m.Decision(decision_id="dedup-1", cluster=CLUSTER, namespace="default", pod_key="default/p", node="a",
                      policy="kube-resources", mode="full", seen_at=now, decided_at=now)


def snapshot(seq: int) -> m.ClusterSnapshot:
    state = bind(ClusterState.empty([Node("a", 1000, 1000), Node("b", 1000, 1000)]), Pod("p", 500, 500, qos="LS"), 0)
    return m.ClusterSnapshot(cluster=CLUSTER, seq=seq, time=float(seq), state=state_to_dict(state),
                             stats={"bound": float(seq), "pending": 0.0, "violations": 0.0})


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
        for seq in (1, 2):  # the same decision twice (a redelivery), each followed by a snapshot
            await bus.js_publish(subjects.decision(CLUSTER, "default"), decision())
            await asyncio.sleep(0.2)
            await bus.publish(subjects.snapshot(CLUSTER), snapshot(seq))
            await bus.flush()
            for _ in range(50):
                if len(rewards) >= seq:
                    break
                await asyncio.sleep(0.1)
        assert len(rewards) == 2, proc.output()[-3000:]
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
        assert [e.id for e in got] == ["dedup-1"]
        # the first delivery came before any snapshot: the transition says it lacks the cluster it was made on
        assert got[0].state["missing"] == "no_snapshot" and got[0].action["node"] == "a"
        assert got[0].action["pod"]["name"] == "p" and got[0].next_state["snapshot_seq"] == 1
    finally:
        await bus.close()
