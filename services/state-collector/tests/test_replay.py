"""The inflation trace replay as a cluster source: the eval harness's plan, announcements (one at a time
until a decider answers, then in flight up to a limit and a rate), binding with the hard filter, the result."""

import numpy as np

from agmarl_common.core.cluster.model import Node, Pod
from agmarl_common.core.cluster.specs import TIE_ORDER_LABEL
from agmarl_common.core.sim.inflation import plan
from agmarl_state_collector.replay import InflationReplay

NODES = tuple(Node(f"n{k}", 8000, 16000, gpu_count=2, gpu_model="T4") for k in range(4))
PODS = tuple(Pod(f"p{k}", 1000, 1000, num_gpu=1, gpu_milli=500 if k % 2 else 1000) for k in range(12))


def test_the_plan_and_node_order_are_the_harness_own():
    r = InflationReplay(NODES, PODS, seed=3)
    arrivals, rank = plan(NODES, PODS, np.random.default_rng(3))
    assert r.arrivals == arrivals
    assert [int(nd.labels[TIE_ORDER_LABEL]) for nd in r.state.cluster.nodes] == rank.tolist()


def test_one_pod_until_a_decision_then_in_flight_and_rate():
    r = InflationReplay(NODES, PODS, seed=3, in_flight=4, rate=10.0, retry_s=2.0)
    first = r.due(0.0)
    assert len(first) == 1 and r.due(0.5) == []  # nobody answered yet: nothing more, no repeat before retry
    assert [p.key for p in r.due(2.6)] == [first[0].key]  # nobody answered for retry_s: announced again
    assert r.bind(first[0].key, "n0", (0,), now=3.0).ok
    assert len(r.due(3.05)) == 1  # the rate's clock starts with the first decision: 10 pods/s
    assert len(r.due(3.35)) == 3  # 0.35 s later: 4 pods due in all (in flight: at most 4)
    assert r.due(10.0) == [] or len(r.state.pending) <= 4


def test_bind_rechecks_the_hard_filter_and_the_result_counts_allocation():
    r = InflationReplay(NODES[:1], PODS[:4], seed=1, in_flight=10)
    pods = r.due(0.0)
    assert r.bind(pods[0].key, "n0", (0,), 0.0).ok
    assert not r.bind(pods[0].key, "n0", (1,), 0.0).ok  # not pending any more
    pods = r.due(0.1)
    whole = [p for p in pods if p.gpu_milli == 1000]
    if whole:
        assert not r.bind(whole[0].key, "n0", (0,), 0.1).ok  # device 0 is (partly) taken
    for p in list(r.state.pending.values()):
        r.unschedulable(p.key, 0.2)
    while not r.done:
        for p in r.due(1.0):
            r.unschedulable(p.key, 1.0)
    res = r.result()
    assert res["pods"] == len(r.arrivals) == res["decided"] and res["scheduled"] == 1
    assert res["placements"][0] == [r.arrivals[0].key, "n0"]
