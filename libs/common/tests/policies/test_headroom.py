"""Headroom expert: fragmentation against the recent shape mix, and the choices it changes, on tiny clusters."""

from __future__ import annotations

import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.policies.base import Policy, select_node
from agmarl_common.core.policies.headroom import (
    HeadroomConfig,
    HeadroomPolicy,
    ShapeRecord,
    score_headroom_gain,
    score_ls_guard,
    shape_fragmentation,
)
from agmarl_common.core.policies.registry import get_policy, policy_names
from agmarl_common.core.policies.rewardaware import RewardAwarePolicy

CAP = 10000
BIG = (8000, 8000)


def pod(name="p", cpu=1000, mem=1000, **kw) -> Pod:
    return Pod(name=name, cpu_milli=cpu, memory_mib=mem, qos="BE", **kw)


def cluster(loads: list[tuple[int, int]]) -> ClusterState:
    """Nodes of CAP milli / CAP MiB; node k holds one pod of ``loads[k]`` (cpu, mem)."""
    s = ClusterState.empty([Node(f"n{k}", CAP, CAP) for k in range(len(loads))])
    for k, (c, m) in enumerate(loads):
        if c or m:
            s = bind(s, pod(f"old{k}", cpu=c, mem=m), k)
    return s


def all_of(s: ClusterState) -> np.ndarray:
    return np.arange(s.n_nodes)


def seen(policy: HeadroomPolicy, shapes: list[tuple[int, int]]) -> HeadroomPolicy:
    """Let ``policy`` score one pod of each shape (on a throwaway cluster), as a queue pass would."""
    s = cluster([(0, 0)])
    for k, (c, m) in enumerate(shapes):
        policy.score(pod(f"seen{k}", cpu=c, mem=m), s, all_of(s))
    return policy


# --- fragmentation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("free, shapes, share, want", [
    ([10000, 10000], [BIG], [1.0], 0.0),  # the big shape fits: nothing is lost
    ([5000, 5000], [BIG], [1.0], 0.5),  # it does not: all the free half is lost
    ([9000, 5000], [BIG], [1.0], 0.7),  # memory short: the free cpu is lost too (mean of 0.9, 0.5)
    ([5000, 5000], [BIG, (1000, 1000)], [0.25, 0.75], 0.125),  # only the big quarter of the mix loses
    ([0, 0], [BIG], [1.0], 0.0),  # a full node has nothing to lose
])
def test_shape_fragmentation(free, shapes, share, want):
    got = shape_fragmentation(np.array([free], dtype=float), np.array([[CAP, CAP]], dtype=float),
                              np.array(shapes, dtype=float), np.array(share))
    assert got.tolist() == pytest.approx([want])


def test_headroom_gain_penalises_breaking_a_big_node_and_rewards_filling_a_broken_one():
    s = cluster([(2000, 2000), (5000, 5000), (0, 0)])  # n0 still fits BIG, n1 cannot, n2 empty
    shapes, share = np.array([BIG, (1000, 1000)], dtype=float), np.array([0.25, 0.75])
    got = score_headroom_gain(pod(cpu=1000, mem=1000), s, all_of(s), shapes, share)
    # n0: 8000 free -> 7000, BIG no longer fits: frag 0 -> 0.25 * 0.7; n1: 0.25 * (0.5 - 0.4); n2: fits after
    assert got.tolist() == pytest.approx([-0.175, 0.025, 0.0])


# --- the shape record ---------------------------------------------------------------------------------

def test_shape_record_counts_a_pod_once_and_forgets_the_oldest():
    r = ShapeRecord(window=2)
    r.add(pod("a", cpu=1000, mem=1000))
    r.add(pod("a", cpu=1000, mem=1000))  # the same pending pod retried
    r.add(pod("b", *BIG))
    shapes, share = r.mix()
    assert shapes.tolist() == [[1000, 1000], list(BIG)] and share.tolist() == [0.5, 0.5]
    r.add(pod("c", *BIG))  # window 2: "a" drops out
    shapes, share = r.mix()
    assert shapes.tolist() == [list(BIG)] and share.tolist() == [1.0]
    with pytest.raises(ValueError):
        ShapeRecord(window=0)


# --- choices -------------------------------------------------------------------------------------------

def test_small_pod_keeps_the_only_node_that_still_fits_a_big_shape():
    s = cluster([(2000, 2000), (5000, 5000)])  # only n0 can still host a BIG pod
    small = pod("small")
    assert select_node(RewardAwarePolicy(), small, s, all_of(s)) == 0  # balance alone: the emptier node
    policy = seen(HeadroomPolicy(), [BIG, BIG, (1000, 1000), (1000, 1000)])
    assert select_node(policy, small, s, all_of(s)) == 1


def test_without_big_shapes_it_places_like_reward_aware():
    s = cluster([(2000, 2000), (5000, 5000)])
    policy = seen(HeadroomPolicy(), [(1000, 1000), (500, 2000)])
    small = pod("small")
    np.testing.assert_allclose(policy.score(small, s, all_of(s)), RewardAwarePolicy().score(small, s, all_of(s)))


def test_big_pod_gains_most_on_the_node_it_fills_best():
    s = cluster([(2000, 2000), (0, 0), (0, 0)])
    shapes, share = np.array([BIG], dtype=float), np.array([1.0])
    got = score_headroom_gain(pod("big", *BIG), s, all_of(s), shapes, share)
    # n0 is left full (nothing lost); an empty node is left with 0.2 free that no BIG pod can use
    assert got.tolist() == pytest.approx([0.0, -0.2, -0.2])


def test_weight_zero_is_reward_aware():
    s = cluster([(2000, 2000), (5000, 5000)])
    policy = seen(HeadroomPolicy(HeadroomConfig(weight=0.0)), [BIG, BIG])
    p = pod("small")
    np.testing.assert_array_equal(policy.score(p, s, all_of(s)), RewardAwarePolicy().score(p, s, all_of(s)))
    for bad in ({"weight": -1.0}, {"guard": -1.0}, {"window": 0}):
        with pytest.raises(ValueError):
            HeadroomConfig(**bad)


def ls_cluster(loads: list[tuple[int, int]], ls: list[int]) -> ClusterState:
    s = cluster(loads)
    for k, n in enumerate(ls):
        for j in range(n):
            s = bind(s, Pod(name=f"ls{k}-{j}", cpu_milli=1, memory_mib=1, qos="LS"), k)
    return s


def test_ls_guard_charges_cpu_below_the_threshold_by_ls_density():
    s = ls_cluster([(5000, 0), (5000, 0), (7500, 0), (8500, 0)], [3, 1, 0, 4])  # mean 2 LS pods per node
    got = score_ls_guard(pod(cpu=1000, mem=0), s, all_of(s))
    # n0: 0.1 below 80 % x 3/2; n1: 0.1 x 1/2; n2: no LS pod; n3: already hot, nothing left to lose
    assert got.tolist() == pytest.approx([-0.15, -0.05, 0.0, 0.0], abs=1e-3)
    assert score_ls_guard(pod(), cluster([(0, 0)]), np.array([0])).tolist() == [0.0]  # no LS pod anywhere


def test_guard_sends_a_batch_pod_away_from_ls_nodes_but_not_an_ls_pod():
    s = ls_cluster([(3000, 3000), (4000, 4000)], [6, 0])  # balance prefers n0, which holds the LS pods
    p = pod("be", cpu=2000, mem=2000)
    assert select_node(RewardAwarePolicy(), p, s, all_of(s)) == 0
    assert select_node(HeadroomPolicy(HeadroomConfig(weight=0.0, guard=1.0)), p, s, all_of(s)) == 1
    ls_pod = Pod(name="ls", cpu_milli=2000, memory_mib=2000, qos="LS")  # skip_ls: placed as reward-aware does
    guarded = HeadroomPolicy(HeadroomConfig(weight=0.0, guard=1.0))
    np.testing.assert_array_equal(guarded.score(ls_pod, s, all_of(s)), RewardAwarePolicy().score(ls_pod, s, all_of(s)))


def test_registered_fresh_and_deterministic():
    assert "reward-aware-headroom" in policy_names()
    a, b = get_policy("reward-aware-headroom", 1), get_policy("reward-aware-headroom", 2)
    assert isinstance(a, Policy) and isinstance(a, HeadroomPolicy) and a is not b
    s = cluster([(2000, 2000), (5000, 5000)])
    for p in (seen(a, [BIG, (1000, 1000)]), seen(b, [BIG, (1000, 1000)])):
        assert p.score(pod("small"), s, all_of(s)).tolist() == a.score(pod("small"), s, all_of(s)).tolist()
    assert get_policy("reward-aware-headroom").shapes.mix()[0].shape == (0, 2)  # no state shared between runs


def test_guard_expert_is_the_guard_alone_with_lighter_preferences():
    g = get_policy("reward-aware-guard")
    assert g.name == "reward-aware-guard" and isinstance(g, HeadroomPolicy)
    assert (g.headroom.weight, g.headroom.guard, g.config.preference_weight) == (0.0, 0.3, 0.05)
    s = ls_cluster([(3000, 3000), (4000, 4000)], [6, 0])
    assert select_node(g, pod("be", cpu=2000, mem=2000), s, all_of(s)) == 1  # away from the LS node
