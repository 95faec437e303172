"""Synthetic clusters and workloads: labels, shapes, rates following the curve, seed determinism."""

from collections import Counter

import numpy as np
import pytest

from agmarl_common.core.cluster.model import HOSTNAME_LABEL, RACK_LABEL, ZONE_LABEL, Node
from agmarl_common.core.sim import synthetic
from agmarl_common.core.sim.loadcurve import LoadCurve, fit_to_horizon, flat_curve, load_curve, sinusoid_curve
from agmarl_common.core.sim.synthetic import SYNTHETIC_WORKLOADS, generate, synthetic_cluster

FLAT = flat_curve()


def test_cluster_has_zones_racks_hostnames_and_kinds():
    nodes = synthetic_cluster(n_nodes=40, zones=2, racks_per_zone=4, gpu_fraction=0.25, seed=1)
    assert len(nodes) == 40 and len({n.name for n in nodes}) == 40
    assert Counter(n.labels[ZONE_LABEL] for n in nodes) == {"zone-a": 20, "zone-b": 20}
    racks = {n.labels[RACK_LABEL] for n in nodes}
    assert racks == {f"zone-{z}-rack-{r}" for z in "ab" for r in range(4)}
    assert all(n.labels[RACK_LABEL].startswith(n.labels[ZONE_LABEL]) for n in nodes)
    assert all(n.labels[HOSTNAME_LABEL] == n.name for n in nodes)
    gpu = [n for n in nodes if n.gpu_count]
    assert len(gpu) == 10
    assert {n.gpu_model for n in gpu} <= {"T4", "A10", "V100"} and all(n.gpu_model for n in gpu)
    assert all(not n.gpu_model for n in nodes if not n.gpu_count)
    assert {n.cpu_milli for n in nodes} - {32000, 48000, 64000} == set()
    assert any(n.labels.get(synthetic.LOCAL_SSD_LABEL) == "true" for n in nodes)
    assert not any(n.taints for n in nodes)  # taint_fraction defaults to 0


def test_cluster_taints_only_cpu_nodes_when_asked():
    nodes = synthetic_cluster(n_nodes=60, taint_fraction=0.5, seed=2)
    tainted = [n for n in nodes if n.taints]
    assert 10 < len(tainted) < 50
    assert all(n.taints == (synthetic.DEDICATED_TAINT,) and n.gpu_count == 0 for n in tainted)


def test_cluster_is_deterministic_for_a_seed():
    assert synthetic_cluster(30, seed=5) == synthetic_cluster(30, seed=5)
    assert synthetic_cluster(30, seed=5) != synthetic_cluster(30, seed=6)
    with pytest.raises(ValueError):
        synthetic_cluster(0)


def test_auto_rate_is_littles_law():
    nodes = [Node("a", cpu_milli=10000, memory_mib=1), Node("b", cpu_milli=30000, memory_mib=1)]
    assert synthetic.auto_rate(nodes, mean_cpu_milli=1000, mean_duration_s=100, target=0.5) == pytest.approx(0.2)


def test_arrivals_follow_the_curve():
    curve = sinusoid_curve(period_s=3600.0, amplitude=0.8, steps=360)
    rate, horizon = 20.0, 3600.0
    times = synthetic.arrival_times(curve, horizon, rate, np.random.default_rng(0))
    assert np.all(np.diff(times) >= 0) and times.min() >= 0 and times.max() < horizon
    edges = np.linspace(0, horizon, 11)
    observed, _ = np.histogram(times, edges)
    fine = np.linspace(0, horizon, 36001)[:-1] + 0.05
    m = curve.multiplier(fine) / curve.multiplier(fine).mean()
    expected = np.array([rate * m[(fine >= a) & (fine < b)].sum() * 0.1 for a, b in zip(edges[:-1], edges[1:])])
    assert np.all(np.abs(observed - expected) < 5 * np.sqrt(expected))
    assert observed.max() > 4 * observed.min()  # peak vs trough of a 0.8-amplitude sinusoid
    assert len(times) == pytest.approx(rate * horizon, rel=0.03)


def test_diurnal_rate_follows_a_step_shaped_curve():
    # 0.2 for the first half of the period, 1.8 for the second (linear ramps between samples)
    curve = LoadCurve(values=np.array([0.2] * 50 + [1.8] * 50), step_s=36.0)
    pods = synthetic.diurnal(synthetic_cluster(20, seed=0), horizon_s=3600.0, rate=5.0, seed=0, curve=curve)
    t = np.array([p.creation_time for p in pods])
    low, high = np.sum((t > 100) & (t < 1700)), np.sum((t > 1900) & (t < 3500))
    assert high / low == pytest.approx(9.0, rel=0.25)


@pytest.mark.parametrize("name", sorted(SYNTHETIC_WORKLOADS))
def test_generators_produce_valid_sorted_unique_pods(name):
    nodes = synthetic_cluster(20, gpu_fraction=0.3, seed=0)
    pods = generate(name, nodes, horizon_s=600.0, rate=2.0, seed=3, curve=FLAT)
    # about rate * horizon after t = 0 (the pressure variants' warm-start population arrives at t = 0)
    assert 600 < len([p for p in pods if p.creation_time > 0]) < 1800
    times = [p.creation_time for p in pods]
    assert times == sorted(times)
    assert min(times) >= 0 and max(times) < 610  # online replicas may be a few seconds late
    assert len({p.key for p in pods}) == len(pods)
    assert all(p.duration > 0 and p.cpu_milli > 0 and p.memory_mib > 0 and not p.node_name for p in pods)
    assert all(p.num_gpu == 0 or p.gpu_milli in (250, 500, 1000) for p in pods)


@pytest.mark.parametrize("name", sorted(SYNTHETIC_WORKLOADS))
def test_generators_are_deterministic_for_a_seed(name):
    nodes = synthetic_cluster(10, seed=0)
    a = generate(name, nodes, horizon_s=300.0, rate=1.0, seed=7, curve=FLAT)
    assert a == generate(name, nodes, horizon_s=300.0, rate=1.0, seed=7, curve=FLAT)
    assert a != generate(name, nodes, horizon_s=300.0, rate=1.0, seed=8, curve=FLAT)


def test_default_curve_is_the_real_trace_and_rate_defaults_to_half_the_cluster():
    nodes = synthetic_cluster(10, seed=0)
    pods = synthetic.diurnal(nodes, horizon_s=3600.0, seed=1)
    expected = synthetic.auto_rate(nodes, 1000, 600.0) * 3600.0
    assert len(pods) == pytest.approx(expected, rel=0.1)
    busy = synthetic.diurnal(nodes, horizon_s=3600.0, rate=5.0, seed=1)
    counts, _ = np.histogram([p.creation_time for p in busy], np.linspace(0, 3600, 25))
    day = fit_to_horizon(load_curve("alibaba2018"), 3600.0).values.reshape(24, 12).mean(axis=1)
    assert np.corrcoef(counts, day)[0, 1] > 0.8  # the first Alibaba day's shape, not a flat rate


def test_batch_online_mix_shapes():
    nodes = synthetic_cluster(20, gpu_fraction=0.3, seed=0)
    pods = synthetic.batch_online_mix(nodes, horizon_s=1800.0, rate=3.0, seed=2, curve=FLAT)
    ls = [p for p in pods if p.qos == "LS"]
    be = [p for p in pods if p.qos == "BE"]
    assert ls and be and len(ls) + len(be) == len(pods)
    assert all(p.pod_anti_affinity[0].topology_key == HOSTNAME_LABEL for p in ls)
    assert all(p.topology_spread[0].topology_key == ZONE_LABEL and p.topology_spread[0].max_skew == 1 for p in ls)
    assert min(p.duration for p in ls) >= 0.5 * 1800.0 > np.median([p.duration for p in be])
    replicas = Counter(p.service for p in ls)
    assert min(replicas.values()) >= 2 and max(replicas.values()) <= 5
    job_sizes = Counter((p.service, p.creation_time) for p in be)
    assert max(job_sizes.values()) > 5  # tasks of a job arrive together
    assert any(p.is_gpu_share for p in be)
    assert all(synthetic.BATCH_TOLERATION in p.tolerations for p in be)


def test_affinity_heavy_uses_every_constraint_kind():
    nodes = synthetic_cluster(20, seed=0)
    pods = synthetic.affinity_heavy(nodes, horizon_s=600.0, rate=1.0, seed=0, curve=FLAT)
    assert any(p.node_selector == {synthetic.LOCAL_SSD_LABEL: "true"} for p in pods)
    assert any(p.required_node_affinity for p in pods)
    assert any(p.pod_affinity for p in pods)
    assert any(p.pod_anti_affinity and p.topology_spread for p in pods)
    assert any(p.preferred_node_affinity and p.preferred_pod_anti_affinity for p in pods)


def test_burst_has_windows_well_above_the_base_rate():
    nodes = synthetic_cluster(10, seed=0)
    pods = synthetic.burst(nodes, horizon_s=3600.0, rate=2.0, seed=4, curve=FLAT, burst_factor=8.0)
    counts, _ = np.histogram([p.creation_time for p in pods], np.arange(0, 3601, 60))
    assert counts.max() > 4 * np.median(counts)


def test_generate_rejects_unknown_names_and_matches_direct_calls():
    nodes = synthetic_cluster(5, seed=0)
    with pytest.raises(ValueError, match="unknown synthetic workload"):
        generate("openb", nodes)
    assert generate("burst", nodes, 300.0, 1.0, seed=1, curve=FLAT) == synthetic.burst(
        nodes, 300.0, 1.0, seed=1, curve=FLAT)
