"""Dynamic metrics on tiny literal clusters, values computed by hand."""

from dataclasses import replace

import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.cluster import metrics as state_metrics
from agmarl_common.core.sim import metrics


def _two_nodes() -> ClusterState:
    nodes = (Node("n0", cpu_milli=1000, memory_mib=1000), Node("n1", cpu_milli=1000, memory_mib=3000, gpu_count=2))
    s = ClusterState.empty(nodes)
    s = bind(s, Pod("a", cpu_milli=500, memory_mib=250, qos="BE"), 0)
    s = bind(s, Pod("b", cpu_milli=900, memory_mib=750, qos="LS"), 1)
    s = bind(s, Pod("g", cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=500, qos="LS"), 1, (0,))
    return s


def test_utilisation_is_requested_over_capacity_of_schedulable_nodes():
    s = _two_nodes()
    u = state_metrics.utilisation(s)
    assert u["cpu"] == pytest.approx(1400 / 2000)
    assert u["mem"] == pytest.approx(1000 / 4000)
    assert u["gpu"] == pytest.approx(500 / 2000)
    down = replace(s, schedulable=np.array([True, False]))
    assert state_metrics.utilisation(down) == {"cpu": 0.5, "mem": 0.25, "gpu": 0.0}


def test_utilisation_of_an_empty_cluster_is_zero():
    assert state_metrics.utilisation(ClusterState.empty(())) == {"cpu": 0.0, "mem": 0.0, "gpu": 0.0}


@pytest.mark.parametrize("schedulable, expected", [
    ((True, True), 0.2),  # std([0.5, 0.9])
    ((True, False), 0.0),  # one node: nothing to balance
])
def test_balance_is_std_of_node_cpu_utilisation(schedulable, expected):
    s = replace(_two_nodes(), schedulable=np.array(schedulable))
    assert state_metrics.balance(s) == pytest.approx(expected)


@pytest.mark.parametrize("load, threshold, hot", [
    (None, 0.8, [False, True]),  # requested 0.5 / 0.9
    ([850.0, 0.0], 0.8, [True, True]),  # measured load above requests counts
    ([0.0, 0.0], 0.9, [False, False]),  # strictly above the threshold
    (None, 0.4, [True, True]),
])
def test_hot_nodes_use_max_of_requested_and_load(load, threshold, hot):
    s = _two_nodes()
    if load is not None:
        s = replace(s, cpu_load=np.array(load))
    assert state_metrics.hot_nodes(s, threshold).tolist() == hot


def test_sla_violators_are_ls_pods_on_hot_nodes():
    s = _two_nodes()
    bad, total = state_metrics.sla_violators(s)
    assert sorted(bad) == ["default/b", "default/g"]
    assert total == 2
    s2 = replace(s, cpu_load=np.array([950.0, 0.0]))  # node 0 hot holds only a BE pod
    assert sorted(state_metrics.sla_violators(s2)[0]) == ["default/b", "default/g"]
    assert state_metrics.sla_violators(s, threshold=0.95) == ([], 2)


@pytest.mark.parametrize("samples, q, expected", [
    ([1, 2, 3, 4], 50, 2.5),
    ([1, 11], 99, 10.9),
    ([7], 99, 7.0),
    ([], 50, 0.0),
])
def test_percentile(samples, q, expected):
    assert metrics.percentile(samples, q) == pytest.approx(expected)


def test_summarise_hand_computed():
    rows = [(1.0, 0.5, 0.2, 0.0, 0.1, 2, 3, 1, 2), (2.0, 0.7, 0.4, 1.0, 0.3, 0, 3, 0, 2)]
    series = metrics.series_from_rows(rows)
    assert series.time.tolist() == [1.0, 2.0]
    assert series.pending.tolist() == [2.0, 0.0]
    out = metrics.summarise(series, np.array([1.0, 3.0]), {"arrived": 4, "bound": 2}, sla_pods=1, hard_violations=0)
    assert out["util_cpu_mean"] == pytest.approx(0.6)
    assert out["util_mem_mean"] == pytest.approx(0.3)
    assert out["util_gpu_mean"] == pytest.approx(0.5)
    assert out["balance_mean"] == pytest.approx(0.2)
    assert out["pending_mean"] == pytest.approx(1.0)
    assert out["pending_time_p50_s"] == pytest.approx(2.0)
    assert out["pending_time_mean_s"] == pytest.approx(2.0)
    assert out["sla_violation_rate"] == pytest.approx(1 / 4)
    assert out["sla_violating_pods"] == 1.0
    assert out["arrived"] == 4.0 and out["bound"] == 2.0
    assert all(isinstance(v, float) for v in out.values())


def test_summarise_of_no_samples_is_zero_not_nan():
    out = metrics.summarise(metrics.series_from_rows([]), np.array([]), {}, 0, 0)
    assert out["pending_time_p99_s"] == 0.0 and out["sla_violation_rate"] == 0.0 and out["util_cpu_mean"] == 0.0
