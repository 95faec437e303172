"""The objective input: what the learned policy is asked to optimise (``features.OBJECTIVES``).

Under ``composite`` the pod rows carry ``objective_composite = 1`` and the ``reward_gain`` pair column is
reward-aware's score of each candidate rescaled to [-1, 0]; under ``allocation`` (the inflation protocol)
both are 0. The harnesses tell a policy their objective; a model trained before a feature existed is fed
the columns its manifest names.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.features import (EDGE_FEATURES, POD_FEATURES, FeatureContext, build_graph, identical_pods,
                                    objective_gains)
from agmarl_common.core.policies.kube import KubeDefaultPolicy
from agmarl_common.serving.onnx_model import input_columns
from agmarl_common.core.policies.rewardaware import RewardAwarePolicy
from agmarl_common.core.reward import IO_HEAVY_LABEL
from agmarl_common.core.sim import dynamic, inflation, synthetic, traces

GAIN = EDGE_FEATURES.index("reward_gain")
FLAG = POD_FEATURES.index("objective_composite")


def busy_synthetic(seed: int = 3) -> tuple[ClusterState, list[Pod]]:
    """A synthetic cluster after 600 s of kube-default scheduling, and pods still to come."""
    nodes = synthetic.synthetic_cluster(30, seed=seed)
    pods = synthetic.generate("batch_online_mix", nodes, horizon_s=1200, seed=seed)
    state = dynamic.run(KubeDefaultPolicy(), nodes, pods, dynamic.SimConfig(horizon_s=600), seed=seed).final_state
    return state.cluster, pods[-40:]


def test_composite_rows_carry_the_flag_and_reward_awares_ranking():
    state, pods = busy_synthetic()
    ctx = FeatureContext.from_workload(pods, "composite")
    cands = [feasible_nodes(p, state) for p in pods[:12]]
    g = build_graph(pods[:12], state, cands, ctx)
    assert np.all(g.pod_x[:, FLAG] == 1.0)
    gain = g.cand_attr[:, GAIN]
    assert gain.min() >= -1.0 and gain.max() <= 0.0
    off, ranked = 0, 0
    for pod, c in zip(pods[:12], cands):
        col, score = gain[off:off + c.size], RewardAwarePolicy().score(pod, state, c)
        off += c.size
        if np.ptp(score) > 0:  # the best candidate gets 0, the worst -1, the order is reward-aware's
            assert col.max() == 0.0 and col.min() == -1.0
            assert np.array_equal(np.argsort(-col, kind="stable"), np.argsort(-score.astype(np.float32), kind="stable"))
            ranked += 1
    assert ranked >= 6


def test_allocation_rows_are_zero_and_unknown_objectives_are_refused():
    state, pods = busy_synthetic()
    ctx = FeatureContext.from_workload(pods, "allocation")
    cands = [feasible_nodes(p, state) for p in pods[:5]]
    g = build_graph(pods[:5], state, cands, ctx)
    assert np.all(g.pod_x[:, FLAG] == 0.0) and np.all(g.cand_attr[:, GAIN] == 0.0)
    with pytest.raises(ValueError, match="unknown objective"):
        FeatureContext.from_workload(pods, "throughput")
    with pytest.raises(ValueError, match="unknown objective"):
        objective_gains(pods[:1], state, cands[:1], "throughput")


def test_pods_differing_only_in_what_the_reward_reads_are_not_merged_under_composite():
    pod = Pod("a", 500, 1024, service="web", qos="BE")
    io = replace(pod, name="b", labels={IO_HEAVY_LABEL: "true"})
    cand = [np.arange(4), np.arange(4)]
    assert identical_pods([pod, io], cand, "allocation")[0] == [0]
    assert identical_pods([pod, io], cand, "composite")[0] == [0, 1]
    assert identical_pods([pod, replace(pod, name="c")], cand, "composite")[0] == [0]


def test_input_columns_feed_an_older_model_the_columns_it_knows():
    names = ("a", "b", "c")
    assert input_columns({"contract": {"pod_features": ["a", "b", "c"]}}, "pod_features", names) is None
    assert input_columns({}, "pod_features", names) is None
    assert input_columns({"contract": {"pod_features": ["a", "c"]}}, "pod_features", names).tolist() == [0, 2]
    with pytest.raises(ValueError, match="does not compute"):
        input_columns({"version": "v9", "contract": {"pod_features": ["a", "z"]}}, "pod_features", names)


class Recording(KubeDefaultPolicy):
    """kube-default that records the objectives a harness sets."""

    def __init__(self):
        super().__init__()
        self.objectives: list[str] = []

    def set_objective(self, objective: str) -> None:
        self.objectives.append(objective)


def test_each_harness_tells_the_policy_its_objective():
    nodes = [n for n in traces.load_openb_nodes() if n.gpu_count > 0][:20]
    pods = traces.load_openb_pods(traces.openb_pod_path("default"))
    policy = Recording()
    inflation.run_inflation(nodes, pods, policy, np.random.default_rng(0))
    assert policy.objectives == [inflation.OBJECTIVE] == ["allocation"]
    snodes = synthetic.synthetic_cluster(8, seed=1)
    spods = synthetic.generate("diurnal", snodes, horizon_s=60, seed=1)
    policy = Recording()
    dynamic.run(policy, snodes, spods, dynamic.SimConfig(horizon_s=60), seed=1)
    assert policy.objectives == [dynamic.OBJECTIVE] == ["composite"]


def test_the_gain_follows_the_reward_scheme():
    from agmarl_common.core.scoring.rewardaware import RewardAwareConfig

    state, pods = busy_synthetic()
    cands = [feasible_nodes(p, state) for p in pods[:8]]
    for scheme in ("fixed", "load_conditional", "lexicographic"):
        gain = objective_gains(pods[:8], state, cands, "composite", scheme)
        off = 0
        for pod, c in zip(pods[:8], cands):
            score = RewardAwarePolicy(RewardAwareConfig(scheme=scheme)).score(pod, state, c)
            col = gain[off:off + c.size]
            off += c.size
            if np.ptp(score) > 0:
                assert np.allclose(col, (score - score.max()) / np.ptp(score))
