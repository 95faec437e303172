"""``RewardAwarePolicy.score_batch`` (the gains of many pods against one state, vectorised over pairs)
equals ``score`` called pod by pod, on states with LS, IO-heavy and network-heavy pods, cordoned nodes
and every reward scheme; the learned policy's ``reward_gain`` input uses it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState
from agmarl_common.core.cluster.state import bind
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.policies.rewardaware import RewardAwarePolicy
from agmarl_common.core.scoring import rewardaware as ra
from agmarl_common.core.scoring.rewardaware import (
    GAINS,
    RewardAwareConfig,
    reward_gains_batch,
    score_reward_aware,
    score_reward_aware_batch,
)
from agmarl_common.core.reward import IO_HEAVY_LABEL, NETWORK_HEAVY_LABEL, SCHEMES
from agmarl_common.core.sim import dynamic, synthetic


def declared(pods):
    """LS pods network-heavy, every third of them IO-heavy too (as the regime-shift scenario declares)."""
    out = []
    for k, p in enumerate(pods):
        if p.qos == "LS":
            labels = {**p.labels, NETWORK_HEAVY_LABEL: "true", **({IO_HEAVY_LABEL: "true"} if k % 3 == 0 else {})}
            p = replace(p, labels=labels)
        out.append(p)
    return out


@pytest.fixture(scope="module")
def busy_state():
    nodes = synthetic.synthetic_cluster(30, seed=5)
    nodes[3] = replace(nodes[3], unschedulable=True)  # cordoned: outside the balance's node set
    rate = synthetic.auto_rate(nodes, 1000, 300.0, target=0.7)
    workload = declared(synthetic.batch_online_mix(nodes, 900.0, rate=rate, seed=5, online_fraction=0.5))
    config = dynamic.SimConfig(tick_s=1.0, horizon_s=600.0)
    state, retry, policy = dynamic.reset(nodes, workload, config, 5), {}, get_policy("kube-default")
    for _ in range(600):
        state, _ = dynamic.advance(state, 1.0, config)
        state = dynamic.schedule_pending(policy, state, config, retry)
    pending = declared(synthetic.batch_online_mix(nodes, 300.0, rate=rate, seed=6, online_fraction=0.5))[:64]
    return state.cluster, pending


@pytest.mark.parametrize("scheme", SCHEMES)
def test_score_batch_equals_score_pod_by_pod(busy_state, scheme):
    cluster, pods = busy_state
    assert sum(p.qos == "LS" for ps in cluster.bound for p in ps) > 0  # LS pods to protect
    policy = RewardAwarePolicy(RewardAwareConfig(scheme=scheme))
    cands = [feasible_nodes(p, cluster) for p in pods]
    cands[1] = cands[1][:0]  # a pod without candidates keeps its place
    batch = policy.score_batch(pods, cluster, cands)
    assert [b.size for b in batch] == [c.size for c in cands]
    for p, c, b in zip(pods, cands, batch):
        np.testing.assert_allclose(b, policy.score(p, cluster, c), rtol=0, atol=1e-12)
    assert any(np.ptp(b) > 0 for b in batch if b.size)


def test_the_busy_state_exercises_every_gain(busy_state):
    cluster, pods = busy_state
    gains = reward_gains_batch(pods, cluster, [feasible_nodes(p, cluster) for p in pods])
    assert all(np.abs(g).max() > 0 for g in gains.values()), {k: float(np.abs(g).max()) for k, g in gains.items()}


def test_a_subclass_that_adds_to_score_is_batch_scored_with_its_own_score(busy_state):
    cluster, pods = busy_state
    guard = get_policy("reward-aware-guard")  # HeadroomPolicy: reward-aware plus the LS guard term
    cands = [feasible_nodes(p, cluster) for p in pods[:12]]
    for p, c, b in zip(pods, cands, guard.score_batch(pods[:12], cluster, cands)):
        np.testing.assert_array_equal(b, guard.score(p, cluster, c))


def test_guard_and_empty_batches(busy_state):
    cluster, pods = busy_state
    assert RewardAwarePolicy().score_batch([], cluster, []) == []
    assert [b.size for b in RewardAwarePolicy().score_batch(pods[:2], cluster, [np.zeros(0, np.int64)] * 2)] == [0, 0]


def test_the_gains_of_one_pod_are_bit_equal_to_its_slice_of_the_batch(busy_state):
    """The one-pod path (per-pod values as scalars, terms that are zero everywhere skipped: the knee, LS,
    IO) gives the same bits as the batch, on the busy state (every node above the knee) and on the same
    nodes empty with one big pod that crosses the knee (the others stay below it: the shortcut)."""
    cluster, pods = busy_state
    light = ClusterState.empty(cluster.nodes)
    top = int(np.argmax(light.cpu_cap))
    big = replace(pods[0], name="big", cpu_milli=int(0.9 * light.cpu_cap[top]), memory_mib=int(0.9 * light.mem_cap[top]))
    knee = set()
    for state, batch_pods in ((cluster, pods), (light, pods + [big])):
        cands = [feasible_nodes(p, state) for p in batch_pods]
        batch = reward_gains_batch(batch_pods, state, cands)
        start = 0
        for p, c in zip(batch_pods, cands):
            one = reward_gains_batch([p], state, [c])
            for name in GAINS:
                assert one[name].tobytes() == batch[name][start:start + c.size].tobytes(), (p.name, name)
            if c.size:
                knee.add(bool(np.all(one["utilisation"] == 0)))
            start += c.size
    assert knee == {True, False}  # both the shortcut (all below the knee) and the computed gain ran
    assert {p.qos == "LS" for p in pods} == {True, False}
    assert {p.labels.get(IO_HEAVY_LABEL) == "true" for p in pods} == {True, False}


def test_score_reward_aware_batch_is_bit_equal_to_score_reward_aware(busy_state):
    cluster, pods = busy_state
    cands = [feasible_nodes(p, cluster) for p in pods]
    for scheme in SCHEMES:
        config = RewardAwareConfig(scheme=scheme)
        for p, c, b in zip(pods, cands, score_reward_aware_batch(pods, cluster, cands, config)):
            assert b.tobytes() == score_reward_aware(p, cluster, c, config).tobytes()


def test_state_terms_are_computed_once_per_state_and_never_reused_for_another(busy_state):
    """``state_terms`` (what the gains read of the state alone) is memoised per state object, as the live loop
    computes it between pods: the gains are the same with the terms ready or computed inside, and a new state
    (a pod bound) gets its own terms, not the last state's."""
    cluster, pods = busy_state
    pod = next(p for p in pods if p.qos == "LS")
    cands = feasible_nodes(pod, cluster)
    ra._TERMS = None
    fresh = score_reward_aware(pod, cluster, cands)
    terms = ra.state_terms(cluster)
    assert ra.state_terms(cluster) is terms  # once per state object
    assert np.array_equal(score_reward_aware(pod, cluster, cands), fresh)
    hot = int(np.argmax(terms.pressure * np.isin(np.arange(cluster.n_nodes), cands)))
    after = bind(cluster, replace(pod, name="heavy", cpu_milli=int(cluster.cpu_cap[hot])), hot)
    moved = ra.state_terms(after)
    assert moved is not terms and moved.pressure[hot] > terms.pressure[hot] and moved.util[hot] > terms.util[hot]
    with_moved = score_reward_aware(pod, after, cands)
    ra._TERMS = (after, terms)  # the previous state's terms under the new state: the scores read the memo
    stale = score_reward_aware(pod, after, cands)
    ra._TERMS = None
    assert np.array_equal(score_reward_aware(pod, after, cands), with_moved)
    assert not np.array_equal(stale, with_moved)
