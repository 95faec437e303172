"""Regime features, the gate and the expert library."""

import pytest

from agmarl_common.core.adaptive.features import MIX_CELLS, RegimeFeatures, mix_cell, mix_counts, regime_features, shares
from agmarl_common.core.adaptive.gate import (ExpertLibrary, GateConfig, choose_expert, gate_init, gate_update,
                                         regime_weights)
from agmarl_common.core.cluster.model import ZONE_LABEL, ClusterState, Node, Pod, PodAffinityTerm, LabelSelector, bind


@pytest.mark.parametrize("pod,cell", [
    (Pod("g", 1, 1, num_gpu=1, gpu_milli=500, qos="LS", node_selector={"a": "b"}), "gpu-ls-aff"),
    (Pod("c", 1, 1, qos="BE"), "cpu-be-plain"),
    (Pod("c", 1, 1, qos="LS", pod_anti_affinity=(PodAffinityTerm(LabelSelector({"app": "x"}), ZONE_LABEL),)),
     "cpu-ls-aff"),
    (Pod("c", 1, 1), "cpu-be-plain"),  # no qos counts as BE
])
def test_mix_cell(pod, cell):
    assert MIX_CELLS[mix_cell(pod)] == cell


def test_shares_of_a_mix():
    pods = [Pod("a", 1, 1, num_gpu=1, gpu_milli=1000, qos="BE"), Pod("b", 1, 1, qos="LS", node_selector={"x": "y"}),
            Pod("c", 1, 1, qos="LS"), Pod("d", 1, 1, qos="BE")]
    assert shares(mix_counts(pods)) == pytest.approx(
        {"gpu_share": 0.25, "ls_share": 0.5, "be_share": 0.5, "affinity_share": 0.25})
    assert shares([0] * 8)["ls_share"] == 0.0


def test_regime_features_from_state():
    s = ClusterState.empty([Node("a", 1000, 1000), Node("b", 1000, 1000, ready=False)])
    s = bind(s, Pod("p", 500, 500), 0)
    f = regime_features(s, mix_counts([Pod("x", 1, 1, qos="LS")]), arrival_rate=2.0)
    assert f.arrival_rate == 2.0 and f.ls_share == 1.0
    assert f.load == pytest.approx(0.5 if s.schedulable.sum() == 1 else 0.25)
    assert f.nodes_down_share == pytest.approx(1.0 - s.schedulable.sum() / 2)
    assert set(f.as_dict()["mix"]) == set(MIX_CELLS)


def feats(load=0.3, aff=0.0):
    return RegimeFeatures(load=load, affinity_share=aff)


@pytest.mark.parametrize("stream,regimes", [
    ([feats(0.3), feats(0.7), feats(0.6), feats(0.5)], ["low_load", "batch", "batch", "low_load"]),
    ([feats(0.3, 0.4), feats(0.8, 0.3), feats(0.8, 0.1)], ["affinity", "affinity", "batch"]),
])
def test_gate_regimes_with_hysteresis(stream, regimes):
    g, got = gate_init(GateConfig(min_dwell_s=0.0)), []
    for t, f in enumerate(stream):
        g, _ = gate_update(g, f, float(t))
        got.append(g.regime)
    assert got == regimes


def test_gate_respects_minimum_dwell():
    g = gate_init(GateConfig(min_dwell_s=10.0))
    g, changed = gate_update(g, feats(0.9), 0.0)
    assert changed and g.regime == "batch"
    g, changed = gate_update(g, feats(0.1), 5.0)
    assert not changed and g.regime == "batch"
    g, changed = gate_update(g, feats(0.1), 10.0)
    assert changed and g.regime == "low_load"


@pytest.mark.parametrize("f,top", [(feats(0.2), "low_load"), (feats(0.9), "batch"), (feats(0.2, 0.5), "affinity")])
def test_regime_weights_sum_to_one_and_favour_the_regime(f, top):
    w = regime_weights(f)
    assert sum(w.values()) == pytest.approx(1.0)
    assert max(w, key=w.get) == top


def test_expert_library_and_quarantine():
    lib = ExpertLibrary()
    assert len(lib.names()) >= 3
    assert choose_expert(lib, "batch", {}, 0.0) == "most-allocated"
    assert choose_expert(lib, "batch", {"most-allocated": 100.0}, 50.0) == lib.baseline
    assert choose_expert(lib, "batch", {"most-allocated": 100.0}, 150.0) == "most-allocated"
    with pytest.raises(ValueError):
        ExpertLibrary(experts={"batch": "x"})
