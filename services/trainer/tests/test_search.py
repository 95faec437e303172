"""Search-based policy improvement (search.py) on tiny openb sub-clusters: it runs, the labels never lose
allocation against the policy's own pick, the KL trust region holds, and the best held-out iteration is kept."""

import numpy as np
import pytest
import torch

from agmarl_trainer import search
from agmarl_trainer.config import config_from_dict
from agmarl_trainer.model import NetConfig, PolicyNet
from agmarl_trainer.train import load_start, train

TINY = {"name": "search-test", "seed": 0, "workers": 1, "train_workloads": ["default"], "time_budget_s": 300,
        "torch_threads": 1, "net": {"hidden": 8, "heads": 2, "encoder_layers": 2, "mlp": 16},
        "sim": {"nodes_min": 24, "nodes_max": 30}, "imitation": {"episodes": 0, "dynamic_episodes": 0},
        "rl": {"iterations": 0},
        "search": {"iterations": 2, "episodes_per_iter": 2, "decisions": 4, "window": [0.5, 1.0], "top_k": 3,
                   "horizon": 25, "epochs": 3, "batch_graphs": 4, "lr": 0.05, "anchor": 0.0, "kl_max": 0.02},
        "eval": {"sub_nodes": 24, "sub_seeds": [1000], "workloads": ["default"]}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny search run from a random start network saved as a checkpoint (``search.start``)."""
    tmp = tmp_path_factory.mktemp("search")
    torch.manual_seed(3)
    start = PolicyNet(NetConfig(hidden=8, mlp=16))
    torch.save({"state_dict": start.state_dict(), "net": NetConfig(hidden=8, mlp=16)}, tmp / "start.pt")
    cfg = config_from_dict({**TINY, "search": {**TINY["search"], "start": str(tmp / "start.pt")}})
    result = train(cfg, tmp / "runs")
    return cfg, result


def test_search_reports_a_learning_curve_and_keeps_the_best_held_out_iteration(run):
    cfg, result = run
    report = result.history["search"][0]
    curve = report["curve"]
    assert [c["iteration"] for c in curve] == [0, 1, 2]
    means = [float(np.mean(row)) for row in report["held_out_per_seed"]]
    assert report["kept_iteration"] == int(np.argmax(means))
    assert report["kept_held_out"] == max(c["held_out"] for c in curve) >= report["start_held_out"]
    assert all(c["labels"] > 0 for c in curve[1:])
    # the returned network is the kept iteration's: re-evaluating it gives the kept score on the same seeds
    state = {k: v.clone() for k, v in result.net.state_dict().items()}
    again = search.held_out(state, result.config)
    assert again == pytest.approx(report["held_out_per_seed"][report["kept_iteration"]], abs=1e-3)
    assert result.eval["alloc_at_100"] == report["kept_held_out"]


def test_search_stays_inside_the_kl_trust_region_to_the_start(run):
    cfg, result = run
    report = result.history["search"][0]
    # lr 0.05 with no anchor term: without the trust region the policy runs far from its start
    assert any(c["stopped_by_kl"] for c in report["curve"][1:])
    assert all(c["kl"] <= cfg.search.kl_max for c in report["curve"])
    start, _ = load_start(result.config)
    data = [s for samples, _ in search.run_search_tasks(search.search_tasks(cfg, np.random.default_rng(5)), 1,
                                                          start.state_dict(), result.config.net) for s in samples]
    assert search.mean_kl(start, start, data) == pytest.approx(0.0, abs=1e-6)


def test_labels_never_allocate_less_than_the_policys_own_pick():
    torch.manual_seed(0)
    net = PolicyNet(NetConfig(hidden=8, mlp=16))
    for seed in (1, 2):
        task = search.SearchTask("default", 30, seed, 6, (0.5, 1.0), 4, 40, "fgd-pack")
        search.init_worker(net.state_dict(), NetConfig(hidden=8, mlp=16))
        samples, stats = search.search_episode(task)
        labelled = [s for s in samples if s.action[0] >= 0]
        assert stats["searched"] == len(labelled) > 0 and len(samples) > len(labelled)  # + the anchor's states
        assert stats["gain_milli"] >= 0 and 0 <= stats["changed"] <= stats["searched"]
        assert all(s.action[0] < s.graph.n_cand for s in labelled)


def test_select_best_prefers_the_start_on_a_tie():
    assert search.select_best([95.0, 95.0, 94.0]) == 0
    assert search.select_best([95.0, 94.9, 95.1]) == 2


def test_pod_kl_is_zero_for_equal_policies_and_positive_otherwise():
    cand_pod = torch.tensor([0, 0, 0, 1, 1])
    a = torch.log(torch.tensor([0.2, 0.3, 0.5, 0.5, 0.5]))
    b = torch.log(torch.tensor([0.6, 0.2, 0.2, 0.9, 0.1]))
    assert float(search.pod_kl(a, a, cand_pod, 2)) == pytest.approx(0.0, abs=1e-7)
    expect = (sum(p * np.log(p / q) for p, q in ((0.2, 0.6), (0.3, 0.2), (0.5, 0.2)))
              + sum(p * np.log(p / q) for p, q in ((0.5, 0.9), (0.5, 0.1)))) / 2
    assert float(search.pod_kl(a, b, cand_pod, 2)) == pytest.approx(expect, rel=1e-5)
