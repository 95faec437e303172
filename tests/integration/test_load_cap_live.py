"""The load cap in the live loop: ``capped:kube-default`` selected through the control plane (KV, as
``agmarl policy set`` writes it) is served by inference, which holds best-effort pods back when every
node they fit would go past 80 % cpu (a decision without a node, its reason ``not admitted by the
policy``), while latency-sensitive pods keep being placed and the state stays legal.

Three services as real processes on the session's nats-server (state-collector with the simulated
cluster, graph-builder, inference); the simulated cluster is small (6 nodes) and its arrival rate
high enough to overload it within seconds (``AGMARL_SIM_RATE``), the clock 20x. The shared KV selection is restored afterwards.
"""

from __future__ import annotations

import functools
import time
from collections import Counter

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.adaptive import history as hist
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.filters import violations
from agmarl_common.core.cluster.model import state_from_dict
from agmarl_testing.fixtures import ask_health, wait_healthy

from .conftest import module_of, wait_for

CLUSTER = "loadcap"
POLICY = "capped:kube-default"
ENV = {"state-collector": {"AGMARL_SIM_NODES": "6", "AGMARL_SIM_RATE": "3.0", "AGMARL_SIM_TIME_SCALE": "20",
                           "AGMARL_SIM_SEED": "7"}}


async def test_capped_policy_holds_best_effort_pods_back_in_the_live_loop(nats_url, service_processes):
    bus = await Bus.connect(nats_url, name="test-load-cap")
    decisions: list[m.Decision] = []
    snapshots: list[bytes] = []
    kv = await bus.kv(subjects.CONFIG_BUCKET)
    before = {key: await bus.kv_get(subjects.CONFIG_BUCKET, key)
              for key in (subjects.KEY_ACTIVE_POLICY, hist.KEY_POLICY_HISTORY)}
    try:
        sel = m.PolicySelection(policy=POLICY, reason="manual: test the load cap", time=time.time())
        await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.encode(sel))
        await bus.kv_put(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY,
                         hist.encode_history([sel.model_dump(exclude={"v"})]))

        async def on(kind, msg):
            if kind == "decision":
                decisions.append(m.decode(m.Decision, msg.data))
            else:
                snapshots.append(msg.data)
        await bus.subscribe(subjects.decision_wildcard(CLUSTER), functools.partial(on, "decision"))
        await bus.subscribe(subjects.snapshot(CLUSTER), functools.partial(on, "snapshot"))
        await bus.flush()
        common = {"NATS_URL": nats_url, "AGMARL_CLUSTER": CLUSTER, "AGMARL_HTTP_PORT": "0"}
        for service in ("state-collector", "graph-builder", "inference"):
            proc = service_processes(module_of(service), env={**common, **ENV.get(service, {})})
            await wait_healthy(bus, service, timeout=60, proc=proc)

        async def serving():
            status = await ask_health(bus, "inference", timeout=1.0)  # None: busy, ask again
            return status is not None and status.details.get("policy") == POLICY
        assert await wait_for(serving, 30), "inference does not serve the KV selection"

        def held_back():
            return [d for d in decisions if not d.node and d.explanation.get("reason") == "not admitted by the policy"]
        assert await wait_for(held_back, 60), (
            f"no pod held back in {len(decisions)} decisions: {Counter(d.policy for d in decisions)}, reasons "
            f"{Counter(d.explanation.get('reason') for d in decisions)}")
        refused = held_back()[0]
        assert refused.policy == POLICY and "LoadCap" in refused.explanation["admission"]
        assert refused.explanation["candidates"] >= 1  # nodes it fits, none of them admitting it
        placed = [d for d in decisions if d.node]
        assert placed and all(d.policy == POLICY for d in placed)  # none on the start-up policy either
        for raw in snapshots[-5:]:
            snap = m.decode(m.ClusterSnapshot, raw)
            assert snap.stats.get("violations", 0) == 0 and violations(state_from_dict(snap.state)) == []
    finally:  # the KV bucket is shared by the session's tests: leave it as it was
        for key, raw in before.items():
            if raw is None:
                await kv.delete(key)
            else:
                await bus.kv_put(subjects.CONFIG_BUCKET, key, raw)
        await bus.close()
