"""Reward components on tiny literal clusters."""

import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.reward import (Outcomes, balance_std, reward_components, score_balance, score_utilisation,
                                  total_reward, utilisation_by_resource)


def two_nodes() -> ClusterState:
    return ClusterState.empty([Node("a", 1000, 1000), Node("b", 1000, 1000)])


@pytest.mark.parametrize("util,expected", [(0.0, 0.0), (0.4, 0.5), (0.8, 1.0), (0.9, 0.75), (1.0, 0.5)])
def test_score_utilisation_peaks_at_knee(util, expected):
    assert score_utilisation(util) == pytest.approx(expected)


@pytest.mark.parametrize("std,expected", [(0.0, 1.0), (0.25, 0.5), (0.5, 0.0), (0.7, 0.0)])
def test_score_balance(std, expected):
    assert score_balance(std) == pytest.approx(expected)


def test_utilisation_and_balance_from_state():
    s = bind(two_nodes(), Pod("p", 500, 500), 0)
    assert utilisation_by_resource(s)["cpu"] == pytest.approx(0.25)
    # node a at 0.5, node b at 0 -> std 0.25
    assert balance_std(s) == pytest.approx(0.25)


def test_components_in_unit_interval_and_violation_zeroes_constraints():
    s = bind(two_nodes(), Pod("p", 500, 500), 0)
    ok = reward_components(s, Outcomes(pending=1, scheduled=3, failed=0, violations=0))
    bad = reward_components(s, Outcomes(pending=1, scheduled=3, failed=0, violations=2))
    assert all(0.0 <= v <= 1.0 for v in ok.values())
    assert ok["pending"] == pytest.approx(0.75)
    assert ok["constraints"] == 1.0 and bad["constraints"] == 0.0
    assert total_reward(bad) < total_reward(ok)


# ---------------------------------------------------------------------------------------------
# components_after: one more placement without rebuilding the cluster, equal to the full computation


def _random_cluster(rng, n_nodes: int, n_pods: int, with_load: bool):
    from dataclasses import replace

    from agmarl_common.core.cluster.filters import feasible_nodes
    from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, choose_gpus
    from agmarl_common.core.cluster.specs import ZONE_LABEL
    from agmarl_common.core.reward import IO_HEAVY_LABEL, LOCAL_SSD_LABEL, NETWORK_HEAVY_LABEL

    nodes = [Node(f"n{i}", int(rng.choice([2000, 4000, 8000])), int(rng.choice([4096, 8192])),
                  gpu_count=int(rng.choice([0, 0, 2, 4])),
                  labels={ZONE_LABEL: f"z{rng.integers(3)}", **({LOCAL_SSD_LABEL: "true"} if rng.random() < 0.4 else {})},
                  unschedulable=bool(rng.random() < 0.1)) for i in range(n_nodes)]
    state = ClusterState.empty(nodes)
    if with_load:
        state = replace(state, cpu_load=rng.integers(0, 3000, n_nodes).astype(np.float64))

    def pod(k: int) -> Pod:
        gpu = rng.random() < 0.3
        labels = {**({IO_HEAVY_LABEL: "true"} if rng.random() < 0.3 else {}),
                  **({NETWORK_HEAVY_LABEL: "true"} if rng.random() < 0.4 else {})}
        return Pod(f"p{k}", int(rng.integers(100, 1500)), int(rng.integers(64, 1024)), qos=str(rng.choice(["LS", "BE"])),
                   num_gpu=1 if gpu else 0, gpu_milli=int(rng.choice([300, 500, 1000])) if gpu else 0,
                   service=str(rng.choice(["", "api", "db"])), namespace=str(rng.choice(["a", "b"])), labels=labels)

    for k in range(n_pods):
        p = pod(k)
        cands = feasible_nodes(p, state)
        if len(cands):
            i = int(cands[rng.integers(len(cands))])
            gpus = choose_gpus(p, state.gpu_free()[i]) if p.num_gpu else ()
            if gpus is not None:
                state = bind(state, p, i, gpus)
    return state, [pod(1000 + k) for k in range(12)]


@pytest.mark.parametrize("seed", range(12))
def test_components_after_one_placement_equal_the_full_computation(seed):
    from agmarl_common.core.cluster.filters import feasible_nodes
    from agmarl_common.core.cluster.model import bind, choose_gpus
    from agmarl_common.core.reward import Outcomes, components_after, placement_base, reward_components

    rng = np.random.default_rng(seed)
    state, pods = _random_cluster(rng, int(rng.integers(1, 14)), int(rng.integers(0, 40)), with_load=seed % 2 == 1)
    base = placement_base(state)
    checked = 0
    for p in pods:
        for i in feasible_nodes(p, state):
            gpus = choose_gpus(p, state.gpu_free()[int(i)]) if p.num_gpu else ()
            if gpus is None:
                continue
            out = Outcomes(scheduled=1, pending=int(rng.integers(3)), pending_time_s=float(rng.random() * 60))
            want = reward_components(bind(state, p, int(i), gpus), out)
            got = components_after(base, p, int(i), gpus, out)
            assert got.keys() == want.keys()
            for k in want:
                assert got[k] == pytest.approx(want[k], abs=1e-12), (k, p, int(i))
            checked += 1
    assert checked > 0 or state.n_nodes <= 2  # most seeds check many placements
