"""Search-based improvement in the dynamic simulator (search_dynamic.py): a candidate's value is the composite
reward of a paired rollout, the label is the best of them (the policy's pick on a tie), and a tiny run through
``train`` keeps its best held-out iteration."""

import numpy as np
import pytest
import torch

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import dynamic, synthetic
from agmarl_trainer import search_dynamic as sd
from agmarl_trainer.config import config_from_dict
from agmarl_trainer.model import NetConfig, PolicyNet
from agmarl_trainer.train import train

TINY = {"name": "search-dynamic-test", "seed": 0, "workers": 1, "train_workloads": ["default"], "time_budget_s": 300,
        "torch_threads": 1, "net": {"hidden": 8, "heads": 2, "encoder_layers": 2, "mlp": 16},
        "sim": {"dynamic_nodes": 8, "dynamic_horizon_s": 120, "dynamic_tick_s": 2, "dynamic_workloads": ["burst"]},
        "imitation": {"episodes": 0, "dynamic_episodes": 0}, "rl": {"iterations": 0},
        "search": {"protocol": "dynamic", "admission": "capped", "iterations": 2, "episodes_per_iter": 1,
                   "decisions": 4, "window": [0.1, 1.0], "top_k": 3, "horizon": 30, "rollout_policy": "reward-aware",
                   "epochs": 2, "batch_graphs": 4, "lr": 0.01, "anchor": 0.3, "kl_max": 0.5},
        "eval": {"sub_nodes": 8, "sub_seeds": [9001], "workloads": ["default"]}}


def _queued_state(seed: int = 4):
    """A burst workload on 8 nodes, run by reward-aware until a pod with 3+ feasible nodes is queued."""
    nodes = synthetic.synthetic_cluster(8, seed=seed)
    pods = synthetic.generate("burst", nodes, horizon_s=300.0, seed=seed)
    config = dynamic.SimConfig(tick_s=2.0, horizon_s=300.0, pending_timeout_s=300.0, backoff_max_s=10.0)
    policy = get_policy("reward-aware")
    state, retry = dynamic.reset(nodes, pods, config, seed), {}
    for _ in range(150):
        state, _ = dynamic.advance(state, 2.0, config)
        for pp in state.pending.values():
            cand = feasible_nodes(pp.pod, state.cluster)
            if cand.size >= 3 and state.time > 60:
                return state, pp.pod, cand, config, retry
        state = dynamic.schedule_pending(policy, state, config, retry)
    raise AssertionError("no queued pod with three candidates")


def test_rollout_values_are_paired_and_the_label_is_the_best_candidate():
    state, pod, cand, config, retry = _queued_state()
    rollout = get_policy("reward-aware")
    values = [sd.rollout_value(state, pod, int(c), (), config, retry, rollout, 40.0, 2.0) for c in cand]
    again = [sd.rollout_value(state, pod, int(c), (), config, retry, rollout, 40.0, 2.0) for c in cand]
    assert values == again  # same arrivals, failures and evictions for every candidate: deterministic
    assert all(np.isfinite(values)) and max(values) > 0
    logits = np.arange(cand.size, dtype=np.float64)[::-1].copy()  # the policy prefers cand[0], then cand[1], ...
    choose = rollout.choose_gpus
    label, gain = sd.improve(state, pod, cand, logits, choose, config, retry, rollout, cand.size, 40.0, 2.0)
    assert values[label] == max(values)
    assert gain == pytest.approx(max(values) - values[0])
    if values[0] == max(values):
        assert label == 0  # the policy's own pick wins a tie
    # only the policy's pick tried: its own label, no gain
    assert sd.improve(state, pod, cand, logits, choose, config, retry, rollout, 1, 40.0, 2.0) == (0, 0.0)


def test_a_tiny_dynamic_search_run_keeps_its_best_held_out_iteration(tmp_path):
    torch.manual_seed(3)
    start = PolicyNet(NetConfig(hidden=8, mlp=16))
    torch.save({"state_dict": start.state_dict(), "net": NetConfig(hidden=8, mlp=16)}, tmp_path / "start.pt")
    cfg = config_from_dict({**TINY, "search": {**TINY["search"], "start": str(tmp_path / "start.pt")}})
    result = train(cfg, tmp_path / "runs")
    report = result.history["search"][0]
    assert report["protocol"] == "dynamic" and [c["iteration"] for c in report["curve"]] == [0, 1, 2]
    means = [float(np.mean(row)) for row in report["held_out_per_seed"]]
    assert report["kept_iteration"] == int(np.argmax(means))
    assert all(c["labels"] > 0 and c["kl"] <= cfg.search.kl_max for c in report["curve"][1:])
    assert result.eval == {"reward_total": report["kept_held_out"], "reference_reward_total": report["reference_held_out"]}
    # the returned network is the kept iteration's: re-evaluated on the held-out episode it scores the kept total
    state = {k: v.clone() for k, v in result.net.state_dict().items()}
    assert sd.held_out(state, result.config) == pytest.approx(report["held_out_per_seed"][report["kept_iteration"]],
                                                              abs=1e-3)


def test_episodes_of_a_pressure_variant_run_with_its_simulator_settings():
    task = sd.DynamicSearchTask("pressure_node_loss", 8, seed=1, horizon_s=600.0, tick_s=2.0)
    config = sd.episode_config(task)
    assert config.node_loss_fraction == 0.2 and config.node_loss_at_s == pytest.approx(200.0)
    assert config.pending_timeout_s == synthetic.PRESSURE_PENDING_TIMEOUT_S and config.backoff_max_s == 10.0
    plain = sd.episode_config(sd.DynamicSearchTask("burst", 8, seed=1, horizon_s=600.0, tick_s=2.0))
    assert plain == dynamic.SimConfig(tick_s=2.0, horizon_s=600.0, pending_timeout_s=300.0, backoff_max_s=10.0)
