"""The load cap (``capped:<policy>``): admission holds non-latency-sensitive pods off nodes they would
push above 80 % cpu; harnesses apply it (``select_node``, the dynamic simulator)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, bind
from agmarl_common.core.policies.base import admission_reason, admitted, select_node
from agmarl_common.core.policies.loadcap import CAP, LoadCapPolicy, admit_under_cap
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import dynamic, synthetic
from agmarl_common.core.cluster.metrics import node_cpu_pressure
from agmarl_testing.states import node, pod


def three_nodes() -> ClusterState:
    """a: 700/1000 cpu requested, b: 100/1000, c: empty."""
    s = ClusterState.empty([node("a", cpu=1000), node("b", cpu=1000), node("c", cpu=1000)])
    return bind(bind(s, pod("x", cpu=700), 0), pod("y", cpu=100), 1)


@pytest.mark.parametrize("qos, cpu, expected", [
    ("BE", 100, [True, True, True]),     # 800/1000 on a: exactly at the cap
    ("BE", 101, [False, True, True]),    # above it on a
    ("", 800, [False, False, True]),     # b would reach 900; c is empty: any pod fits an empty node
    ("BE", 1000, [False, False, True]),  # a pod as big as a node still has the empty node
    ("LS", 300, [True, True, True]),     # latency-sensitive: never held back
    ("Guaranteed", 300, [True, True, True]),
    ("Burstable", 300, [False, True, True]),
])
def test_admission_at_and_above_the_cap(qos, cpu, expected):
    s = three_nodes()
    assert admit_under_cap(pod("p", cpu=cpu, qos=qos), s, np.arange(3)).tolist() == expected


def test_measured_load_counts_when_above_the_requests():
    loaded = replace(three_nodes(), cpu_load=np.array([0, 750, 0], np.int64))
    assert admit_under_cap(pod("p", cpu=100, qos="BE"), loaded, np.arange(3)).tolist() == [True, False, True]


def test_capped_policy_scores_like_its_base_and_select_node_skips_what_it_does_not_admit():
    s = three_nodes()
    base, capped = get_policy("most-allocated"), get_policy("capped:most-allocated")
    assert isinstance(capped, LoadCapPolicy) and capped.name == "capped:most-allocated" and capped.cap == CAP
    be = pod("p", cpu=200, qos="BE")
    cand = np.arange(3)
    assert np.array_equal(capped.score(be, s, cand), base.score(be, s, cand))
    assert select_node(base, be, s, cand) == 0  # most-allocated packs onto a (900/1000)
    assert select_node(capped, be, s, cand) == 1  # a is over the cap: the next best admitted node
    assert admitted(capped, be, s, np.array([0])).size == 0 and select_node(capped, be, s, np.array([0])) is None
    assert admitted(base, be, s, cand).tolist() == [0, 1, 2]  # no admit: every candidate
    assert "80%" in admission_reason(capped, be) and "capped:most-allocated" in admission_reason(capped, be)
    with pytest.raises(KeyError):
        get_policy("capped:")
    with pytest.raises(ValueError):
        LoadCapPolicy(base, cap=0.0)


def test_capped_policy_delegates_workload_and_objective_to_its_base():
    capped = get_policy("capped:reward-aware")
    assert capped.config is capped.policy.config  # attributes of the base are reachable
    with pytest.raises(AttributeError):
        capped.no_such_attribute  # noqa: B018


def test_in_the_dynamic_simulator_no_best_effort_pod_lands_past_the_cap():
    """A saturated cluster: uncapped, batch pods take nodes past 80 % cpu; capped, a BE pod never
    makes a node's cpu pressure exceed the cap (it waits instead), LS pods still run."""
    nodes = synthetic.synthetic_cluster(8, seed=3)
    workload = synthetic.batch_online_mix(nodes, 600.0, seed=3, rate=synthetic.auto_rate(nodes, 1000, 300.0, target=1.4))
    config = dynamic.SimConfig(tick_s=1.0, horizon_s=600.0, pending_timeout_s=300.0)
    hot = {}
    for name in ("kube-resources", "capped:kube-resources"):
        policy = get_policy(name)
        state, retry, worst = dynamic.reset(nodes, workload, config, 3), {}, 0.0
        for _ in range(600):
            state, _ = dynamic.advance(state, 1.0, config)
            before = {p.key for ps in state.cluster.bound for p in ps}
            state = dynamic.schedule_pending(policy, state, config, retry)
            pressure = node_cpu_pressure(state.cluster)
            for i, ps in enumerate(state.cluster.bound):
                new = [p for p in ps if p.key not in before]
                # a BE pod bound this tick to a node that had pods (and no LS pod bound there after it)
                if new and len(ps) > len(new) and all(p.qos != "LS" for p in new):
                    worst = max(worst, float(pressure[i]))
        hot[name] = worst
        assert state.counters.bound > 0
    assert hot["kube-resources"] > CAP  # the workload does push nodes past the hot line
    assert hot["capped:kube-resources"] <= CAP + 1e-9
