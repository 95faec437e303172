"""Rollouts: the inflation loop replays sim.inflation.run_inflation; the dynamic arbiter re-checks picks;
batching and segment softmax."""

import numpy as np
import pytest
import torch

from agmarl_common.core.cluster.model import Node, Pod
from agmarl_common.core.features import EDGE_FEATURES, F_EDGE, F_NODE, F_POD, POD_FEATURES, HeteroGraph
from agmarl_common.core.policies.fgd import BestFitPolicy, FgdPolicy
from agmarl_common.core.reward import Outcomes, reward_components, total_reward
from agmarl_common.core.sim import dynamic, traces
from agmarl_common.core.sim.inflation import run_inflation
from agmarl_trainer.rollout import collate, run_dynamic_episode, run_inflation_episode, segment_log_softmax, sub_cluster

FLAG, GAIN = POD_FEATURES.index("objective_composite"), EDGE_FEATURES.index("reward_gain")


def test_expert_episode_replays_run_inflation():
    nodes = sub_cluster(traces.load_openb_nodes(), 40, np.random.default_rng(3))
    pods = traces.load_openb_pods()
    for policy in (FgdPolicy, BestFitPolicy):
        ref = run_inflation(nodes, pods, policy(), np.random.default_rng(11))
        ep = run_inflation_episode(nodes, pods, np.random.default_rng(11), expert=policy(), record_prob=0.5)
        assert ep.alloc_final == 100.0 * ref.used_milli[-1] / ref.total_gpu_milli
        assert ep.samples and all(s.graph.n_pods == 1 and 0 <= s.action[0] < s.graph.n_cand for s in ep.samples)
        # the inflation protocol's objective is GPU allocation: no composite flag, no reward_gain column
        assert all(not s.graph.pod_x[:, FLAG].any() and not s.graph.cand_attr[:, GAIN].any() for s in ep.samples)


def test_dynamic_episodes_ask_for_the_composite_reward():
    from agmarl_common.core.policies.rewardaware import RewardAwarePolicy
    from agmarl_common.core.sim import synthetic

    nodes = synthetic.synthetic_cluster(10, seed=2)
    pods = synthetic.generate("batch_online_mix", nodes, horizon_s=300, seed=2)
    samples, _ = run_dynamic_episode(nodes, pods, 2, dynamic.SimConfig(tick_s=5.0, horizon_s=300),
                                     expert=RewardAwarePolicy())
    assert samples and all(s.graph.pod_x[:, FLAG].all() for s in samples)
    gains = np.concatenate([s.graph.cand_attr[:, GAIN] for s in samples])
    assert gains.min() == -1.0 and gains.max() == 0.0
    # the expert's pick is a candidate the reward_gain column ranks first (reward-aware is the gain's source)
    for s in samples:
        for k in np.flatnonzero(s.action >= 0):
            assert s.graph.cand_attr[s.action[k], GAIN] == 0.0


def test_arbiter_refuses_picks_made_stale_by_earlier_ones():
    nodes = [Node("n0", 1000, 4096), Node("n1", 1000, 4096)]
    pods = [Pod(f"p{k}", 600, 100, creation_time=0.0, duration=0.0) for k in range(3)]
    first = lambda g: -g.cand_node.astype(np.float64)  # noqa: E731  every agent wants the lowest node
    cfg = dynamic.SimConfig(tick_s=1.0, horizon_s=3.0, pending_timeout_s=0.0)
    samples, stats = run_dynamic_episode(nodes, pods, 0, cfg, scorer=first)
    assert stats["bound"] == 2 and stats["bind_rejected"] >= 2 and stats["pending"] == 1
    assert stats["hard_violations"] == 0
    assert samples[0].graph.n_pods == 3 and 0.0 <= samples[0].reward <= 1.0
    # the round's reward counts outcomes as the reward module does: the two refused picks are failures, the
    # two pods left pending have waited the round's 1 s
    state, _ = dynamic.advance(dynamic.reset(nodes, pods, cfg, 0), 1.0, cfg)
    state, outcome = dynamic.bind(state, pods[0].key, "n0")
    assert outcome.ok
    counted = total_reward(reward_components(state.cluster, Outcomes(pending=2, scheduled=1, failed=2,
                                                                     pending_time_s=1.0)))
    assert samples[0].reward == pytest.approx(counted)
    assert counted < total_reward(reward_components(state.cluster, Outcomes(pending=2, scheduled=1, failed=0)))


def graph(n, p, per):
    rng = np.random.default_rng(n)
    return HeteroGraph(rng.random((n, F_NODE), dtype=np.float32), rng.random((p, F_POD), dtype=np.float32),
                       np.stack([np.arange(n)] * 2), np.stack([np.arange(p)] * 2),
                       np.repeat(np.arange(p), per), np.tile(np.arange(per), p),
                       rng.random((p * per, F_EDGE), dtype=np.float32), np.full(p * per, -1))


def test_collate_offsets_and_segment_softmax():
    gs = [graph(5, 2, 3), graph(4, 1, 4)]
    b = collate(gs)
    assert b["node_x"].shape == (9, F_NODE) and int(b["n_pods"]) == 3
    assert b["cand_node"].tolist() == [0, 1, 2, 0, 1, 2, 5, 6, 7, 8]
    assert b["cand_pod"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert b["pod_batch"].tolist() == [0, 0, 1] and b["cand_offset"].tolist() == [0, 0, 6]
    logits = torch.randn(10)
    out = segment_log_softmax(logits, b["cand_pod"], 3)
    ref = torch.cat([torch.log_softmax(logits[:3], 0), torch.log_softmax(logits[3:6], 0),
                     torch.log_softmax(logits[6:], 0)])
    assert torch.allclose(out, ref, atol=1e-6)


def test_each_agent_carries_its_own_difference_reward():
    from agmarl_common.core.credit import difference_reward
    from agmarl_common.core.policies.kube import KubeDefaultPolicy
    from agmarl_common.core.policies.rewardaware import RewardAwarePolicy
    from agmarl_common.core.sim import synthetic

    nodes = synthetic.synthetic_cluster(8, seed=1)
    pods = [p for p in synthetic.generate("pressure_load", nodes, horizon_s=60, seed=1) if not p.num_gpu]
    cfg = dynamic.SimConfig(tick_s=5.0, horizon_s=60)
    # the expert is its own reference: every agent the arbiter bound did exactly what the reference does
    same, _ = run_dynamic_episode(nodes, pods, 1, cfg, expert=KubeDefaultPolicy(), credit=True)
    assert same and all(s.credit.shape == (s.graph.n_pods,) for s in same)
    assert max(s.graph.n_pods for s in same) > 1
    assert all(c <= 1e-12 for s in same for c in s.credit)  # 0, or negative for a refused pick
    assert sum(c == 0.0 for s in same for c in s.credit) > 0.9 * sum(s.graph.n_pods for s in same)
    # another expert: its agents' credits differ from each other and from the round's shared reward
    other, _ = run_dynamic_episode(nodes, pods, 1, cfg, expert=RewardAwarePolicy(), credit=True)
    credits = np.concatenate([s.credit for s in other])
    assert (credits > 0).any() and len(set(credits.round(9))) > 3
    # and each is the core difference reward of that agent's pick on the round's cluster
    first = other[0]
    state, _ = dynamic.advance(dynamic.reset(nodes, pods, cfg, 1), cfg.tick_s, cfg)
    pod = next(pp.pod for pp in state.pending.values())
    mine = int(first.graph.cand_node[first.action[0]])
    ref = int(first.graph.cand_node[first.graph.cand_pod == 0][np.argmax(
        KubeDefaultPolicy().score(pod, state.cluster, first.graph.cand_node[first.graph.cand_pod == 0]))])
    want = difference_reward(state.cluster, pod, mine, (), ref, ()).total
    assert first.credit[0] == pytest.approx(want)


def test_credit_is_on_for_a_scorer_off_for_expert_labels_unless_asked():
    from agmarl_common.core.policies.kube import KubeDefaultPolicy
    from agmarl_common.core.sim import synthetic

    nodes = synthetic.synthetic_cluster(6, seed=1)
    pods = synthetic.generate("diurnal", nodes, horizon_s=60, seed=1)
    cfg = dynamic.SimConfig(tick_s=5.0, horizon_s=60)
    first = lambda g: -g.cand_node.astype(np.float64)  # noqa: E731
    acted, _ = run_dynamic_episode(nodes, pods, 1, cfg, scorer=first)
    assert acted and all(s.credit.shape == (s.graph.n_pods,) for s in acted)
    off, _ = run_dynamic_episode(nodes, pods, 1, cfg, scorer=first, credit=False)
    labels, _ = run_dynamic_episode(nodes, pods, 1, cfg, expert=KubeDefaultPolicy())
    assert all(s.credit.size == 0 for s in off + labels)


def test_the_round_reward_counts_how_long_pending_pods_have_waited():
    from agmarl_trainer.rollout import _round_reward

    nodes = [Node("n0", cpu_milli=1000, memory_mib=1000)]
    pods = [Pod("big", cpu_milli=5000, memory_mib=10, creation_time=0.0)]  # fits nowhere: it waits
    state = dynamic.reset(nodes, pods)
    before = state.counters
    state, _ = dynamic.advance(state, 60.0)
    waited = reward_components(state.cluster, Outcomes(pending=1, pending_time_s=60.0))
    assert _round_reward(state, before) == pytest.approx(total_reward(waited))
    assert _round_reward(state, before) < total_reward(reward_components(state.cluster, Outcomes(pending=1)))
