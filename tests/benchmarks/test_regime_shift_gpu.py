"""The GPU batch phase of the regime-shift scenario (benchmarks/regime_scenario.py, ``--batch-kind gpu``): shapes, rate, workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod
from agmarl_common.core.cluster.node_checks import fits_resources
from agmarl_common.core.sim import synthetic
from agmarl_common.core.sim.traces import openb_pod_path
from agmarl_testing.scripts import script_module

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "regime_scenario.py"


@pytest.fixture(scope="module")
def rs():
    with script_module(_PATH, "regime_scenario_bench") as module:
        yield module


T4 = Node(name="t4", cpu_milli=32000, memory_mib=131072, gpu_count=4, gpu_model="T4")
CPU = Node(name="cpu", cpu_milli=64000, memory_mib=262144)


def _pod(name: str, cpu: int, mem: int, num_gpu: int = 0, milli: int = 0, spec: tuple = ()) -> Pod:
    return Pod(name=name, cpu_milli=cpu, memory_mib=mem, num_gpu=num_gpu, gpu_milli=milli, gpu_spec=spec)


@pytest.mark.parametrize("pod, scale, expected", [
    (_pod("cpu-only", 4000, 8192), 1.0, []),  # no GPU: not a GPU batch task
    (_pod("share", 8000, 16384, 1, 500), 0.5, [(4000, 8192, 1, 500)]),  # scaled
    (_pod("spec", 8000, 16384, 1, 1000, ("G2",)), 1.0, [(8000, 16384, 1, 1000)]),  # gpu_spec dropped
    (_pod("eight", 8000, 16384, 8, 1000), 1.0, []),  # no node with 8 GPUs
    (_pod("fat", 48000, 16384, 1, 1000), 1.0, []),  # only the cpu node has 48 cores
    (_pod("fat-scaled", 48000, 16384, 1, 1000), 0.5, [(24000, 8192, 1, 1000)]),  # fits once scaled
])
def test_gpu_batch_shapes(rs, pod, scale, expected):
    assert rs.gpu_batch_shapes([pod], [T4, CPU], cpu_scale=scale, mem_scale=scale) == expected


def test_per_gpu_and_rate(rs):
    v100 = Node(name="v", cpu_milli=64000, memory_mib=393216, gpu_count=8, gpu_model="V100")
    assert rs.per_gpu([T4, CPU, v100]) == (96000 / 12, (131072 + 393216) / 12)
    with pytest.raises(ValueError):
        rs.per_gpu([CPU])
    # 12 GPUs, tasks of 1.5 GPU on average for 300 s: 12000 / (1500 * 300) tasks/s keep them all busy
    shapes = [(1000, 1024, 1, 1000), (1000, 1024, 2, 1000)]
    assert rs.gpu_batch_rate([T4, v100], shapes, 300.0, 1.0) == pytest.approx(12000 / (1500 * 300))


def test_gpu_batch_phase_requests_about_the_gpu_capacity(rs):
    nodes = synthetic.synthetic_cluster(40, seed=4, gpu_fraction=rs.GPU_FRACTION["gpu"])
    shapes = [(4000, 16384, 1, 1000), (2000, 8192, 1, 500), (16000, 65536, 4, 1000)]
    pods = rs.gpu_batch(nodes, 900.0, 6, shapes)
    assert pods and all((p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli) in shapes for p in pods)
    assert all(p.gpu_spec == () and p.qos == "BE" and 0 <= p.creation_time < 900.0 for p in pods)
    demand = sum(p.num_gpu * p.gpu_milli * p.duration for p in pods) / 900.0
    capacity = sum(n.gpu_count for n in nodes) * 1000
    assert 0.8 < demand / capacity < 1.2
    half = rs.gpu_batch(nodes, 900.0, 6, shapes, target=0.5)  # the rate follows the target
    assert 0.35 < len(half) / len(pods) < 0.65


def test_scenario_gpu_batch_keeps_the_other_phases_and_fits_the_cluster(rs):
    nodes = synthetic.synthetic_cluster(40, seed=1, gpu_fraction=rs.GPU_FRACTION["gpu"])
    shapes = rs.openb_gpu_shapes(nodes)
    assert len(shapes) > 7000  # the openb default trace has 7064 GPU pods; nearly all fit once scaled
    gpu = rs.scenario_workload(nodes, 300.0, 1, shapes)
    cpu = rs.scenario_workload(nodes, 300.0, 1)
    phase = {k: [p for p in gpu if p.name.startswith(f"p{k}-")] for k in (1, 2, 3, 4)}
    for k in (1, 4):
        assert phase[k] == [p for p in cpu if p.name.startswith(f"p{k}-")]
    batch = phase[2] + phase[3]
    assert batch and all(p.num_gpu > 0 and not p.gpu_spec for p in batch)
    empty = ClusterState.empty(nodes)
    for p in batch:
        assert any(fits_resources(p, empty, i).ok for i in range(empty.n_nodes)), p
    assert openb_pod_path("default").exists()
