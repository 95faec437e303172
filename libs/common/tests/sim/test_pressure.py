"""High-pressure synthetic variants and the simulator's scripted node loss."""

import numpy as np
import pytest

from agmarl_common.core.cluster.model import Node, Pod
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import dynamic, synthetic
from agmarl_common.core.sim.synthetic import PRESSURE_VARIANTS, generate, sim_options, synthetic_cluster

NODES = synthetic_cluster(20, seed=0)
HORIZON = 1800.0


def requested_share(pods: list[Pod], times: np.ndarray, nodes) -> tuple[np.ndarray, np.ndarray]:
    """(cpu, GPU milli) requested by pods alive at each time / capacity."""
    start = np.array([p.creation_time for p in pods])
    end = start + np.array([p.duration for p in pods])
    cpu = np.array([p.cpu_milli for p in pods], float)
    gpu = np.array([p.gpu_milli_total for p in pods], float)
    alive = (start[None, :] <= times[:, None]) & (times[:, None] < end[None, :])
    return (alive @ cpu / sum(n.cpu_milli for n in nodes),
            alive @ gpu / (1000.0 * sum(n.gpu_count for n in nodes)))


@pytest.mark.parametrize("name", sorted(PRESSURE_VARIANTS))
def test_pressure_variants_keep_the_cluster_near_full_from_the_start(name):
    opts = PRESSURE_VARIANTS[name]
    shares = [requested_share(generate(name, list(NODES), horizon_s=HORIZON, seed=s), np.arange(0.0, HORIZON, 10.0),
                              NODES) for s in (5, 6, 7)]
    cpu, gpu = np.mean([c for c, _ in shares], axis=0), np.mean([g for _, g in shares], axis=0)
    assert cpu.mean() == pytest.approx(opts["target"], rel=0.1) and cpu.mean() >= 0.8
    assert cpu[:30].mean() >= 0.75  # warm start: under pressure in the first five minutes already
    assert gpu.mean() == pytest.approx(opts["gpu_target"], rel=0.3)  # few GPU pods on 4 GPU nodes: noisy


def test_gpu_fragmentation_variant_mixes_whole_and_fractional_gpu_pods():
    pods = generate("pressure_gpu_frag", list(NODES), horizon_s=HORIZON, seed=1)
    gpu = [p for p in pods if p.num_gpu]
    shares = {p.gpu_milli for p in gpu if p.is_gpu_share}
    whole = {p.num_gpu for p in gpu if not p.is_gpu_share}
    assert shares == {250, 500} and whole == {1, 2, 4}
    assert 0.3 < len([p for p in gpu if not p.is_gpu_share]) / len(gpu) < 0.5


def test_burst_variant_arrives_in_bursts_and_the_others_do_not():
    def peak(name: str) -> float:
        t = np.array([p.creation_time for p in generate(name, list(NODES), horizon_s=HORIZON, seed=2)])
        counts, _ = np.histogram(t[t > 0], np.arange(0.0, HORIZON + 1, 60.0))
        return counts.max() / np.median(counts)
    assert peak("pressure_burst") > 3.0 > 1.6 > peak("pressure_load")


def test_sim_options_name_the_timeout_and_the_node_loss():
    assert sim_options("diurnal", 900.0) == {}
    assert sim_options("pressure_load", 900.0) == {"pending_timeout_s": synthetic.PRESSURE_PENDING_TIMEOUT_S}
    loss = sim_options("pressure_node_loss", 900.0)
    assert loss["node_loss_at_s"] == pytest.approx(300.0) and loss["node_loss_s"] == pytest.approx(300.0)
    assert loss["node_loss_fraction"] == 0.2
    dynamic.SimConfig(**loss)  # valid settings


def test_scripted_node_loss_evicts_requeues_and_recovers():
    nodes = [Node(f"n{i}", 1000, 1000) for i in range(10)]
    pods = [Pod(f"p{i}", 600, 100, creation_time=0.0, duration=0.0) for i in range(10)]
    config = dynamic.SimConfig(horizon_s=100.0, node_loss_at_s=5.0, node_loss_fraction=0.3, node_loss_s=10.0)
    state = dynamic.run(get_policy("kube-default"), nodes, pods, config, seed=4, record_every=1.0).final_state
    lost = dynamic.lost_nodes(10, 0.3, 4)
    assert len(lost) == 3 and lost == dynamic.lost_nodes(10, 0.3, 4) != dynamic.lost_nodes(10, 0.3, 5)
    c = state.counters
    assert c.node_failures == 3 and c.node_recoveries == 3 and c.evicted == 3 and c.restarted == 3
    assert not state.down and len(state.running) == 10  # requeued, bound again after the recovery


def test_node_loss_happens_once_and_only_when_time_crosses_it():
    nodes = [Node(f"n{i}", 1000, 1000) for i in range(5)]
    config = dynamic.SimConfig(node_loss_at_s=3.0, node_loss_fraction=0.4, node_loss_s=100.0)
    state = dynamic.reset(nodes, [], config, seed=0)
    downs = []
    for _ in range(6):
        state, events = dynamic.advance(state, 1.0, config)
        downs.append(len(state.down))
    assert downs == [0, 0, 2, 2, 2, 2] and sorted(state.down) == dynamic.lost_nodes(5, 0.4, 0)
    with pytest.raises(ValueError):
        dynamic.SimConfig(node_loss_fraction=1.5)
