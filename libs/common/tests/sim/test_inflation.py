import numpy as np
import pytest

from agmarl_common.core.cluster.filters import feasible_mask
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.policies.fgd import FGD_PAPER_POLICIES, BestFitPolicy, FgdPolicy
from agmarl_common.core.sim.inflation import binned_mean, inflate_workload, pick_node, run_inflation
from agmarl_common.core.sim.traces import (GPU_NODES, load_fgd_expected, load_openb_nodes, load_openb_pods,
                                      openb_node_path, openb_pod_path)


def pod(name, cpu=2000, num=0, milli=0, mem=1024):
    return Pod(name, cpu_milli=cpu, memory_mib=mem, num_gpu=num, gpu_milli=milli)


WORKLOAD = (pod("a", 4000, 1, 500), pod("b", 8000, 1, 1000), pod("c", 2000), pod("d", 16000, 2, 1000),
            pod("e", 1000, 1, 250))
NODES = (Node("g0", cpu_milli=32000, memory_mib=65536, gpu_count=2, gpu_model="T4"),
         Node("g1", cpu_milli=64000, memory_mib=131072, gpu_count=4, gpu_model="V100M16"),
         Node("c0", cpu_milli=16000, memory_mib=32768))


def test_inflate_shuffles_the_workload_then_appends_clones_up_to_the_target():
    pods = inflate_workload(WORKLOAD, 6000, np.random.default_rng(1), ratio=1.3)
    originals = [p for p in pods if "-tuned-" not in p.name]
    assert sorted(p.name for p in originals) == sorted(p.name for p in WORKLOAD)
    assert sum(p.gpu_milli_total for p in pods) <= 1.3 * 6000 + 1000  # may overshoot by one clone's extra GPUs
    assert sum(p.gpu_milli_total for p in pods) > 1.3 * 6000 - 2000
    clone = next(p for p in pods if "-tuned-" in p.name)
    source = next(p for p in WORKLOAD if clone.name.startswith(p.name + "-tuned-"))
    assert (clone.cpu_milli, clone.num_gpu, clone.gpu_milli) == (source.cpu_milli, source.num_gpu, source.gpu_milli)
    assert pods == inflate_workload(WORKLOAD, 6000, np.random.default_rng(1), ratio=1.3)
    assert pods != inflate_workload(WORKLOAD, 6000, np.random.default_rng(2), ratio=1.3)


def test_inflate_removes_pods_when_the_workload_is_too_big():
    pods = inflate_workload(WORKLOAD, 2000, np.random.default_rng(0), ratio=1.0)
    assert sum(p.gpu_milli_total for p in pods) <= 2000
    assert all("-tuned-" not in p.name for p in pods) and len(pods) < len(WORKLOAD)
    for bad in ((), (pod("cpu-only"),)):
        with pytest.raises(ValueError, match="no GPU"):
            inflate_workload(bad, 1000, np.random.default_rng(0))


def test_binned_mean_rounds_half_to_even_and_falls_back_to_neighbours():
    # a 1-GPU cluster: arrived milli / 10 is the arrived %, here 0, .4, .5, .6, 1.5, 2.5, 3.5
    arrived = np.array([0, 4, 5, 6, 15, 25, 35])
    values = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    out = binned_mean(arrived, values, 1000, max_pct=5)
    assert out[0] == 1.0  # .4 and .5 round to 0 (half to even)
    assert out[1] == 3.0
    assert out[2] == 4.5  # 1.5 -> 2 and 2.5 -> 2
    assert out[3] == 5.0  # empty: the paper's analysis averages bins 2..4
    assert out[4] == 6.0 and out[5] == 6.0


def test_pick_node_tie_breaks():
    scores, cands = np.array([3.0, 5.0, 5.0, 1.0]), np.array([10, 11, 12, 13])
    rank = np.zeros(20, dtype=np.int64)
    rank[[11, 12]] = [7, 2]
    assert pick_node(scores, cands, rank) == 12
    assert pick_node(scores, cands) == 11
    assert {pick_node(scores, cands, rng=np.random.default_rng(s)) for s in range(20)} == {11, 12}


def check_legal(result):
    """Replay every binding: it must pass the shared hard filter at its time, and capacities hold."""
    state = ClusterState.empty(result.state.nodes)
    for p, i in zip(result.pods, result.node_index):
        mask = feasible_mask(p, state)
        if i < 0:
            assert not mask.any(), p.name
            continue
        assert mask[i], p.name
        placed = next(q for q in result.state.bound[i] if q.name == p.name)
        state = bind(state, p, int(i), placed.gpu_devices)
    assert (state.cpu_used <= state.cpu_cap).all() and (state.mem_used <= state.mem_cap).all()
    assert (state.gpu_used <= 1000).all()
    assert np.array_equal(state.gpu_used, result.state.gpu_used)


@pytest.mark.parametrize("name", list(FGD_PAPER_POLICIES))
def test_run_inflation_is_deterministic_and_legal(name):
    runs = [run_inflation(NODES, WORKLOAD, FGD_PAPER_POLICIES[name](5), np.random.default_rng(9)) for _ in range(2)]
    a, b = runs
    assert np.array_equal(a.node_index, b.node_index) and a.pods == b.pods
    assert a.total_gpu_milli == 6000
    assert a.arrived_milli[-1] == sum(p.gpu_milli_total for p in a.pods)
    assert np.all(np.diff(a.used_milli) >= 0) and a.used_milli[-1] == a.state.gpu_used.sum()
    assert a.scheduled + a.failed == len(a.pods) and a.failed > 0  # 130 % of the GPUs cannot all fit
    assert (a.node_index[[i for i, p in enumerate(a.pods) if p.num_gpu]] != 2).all()  # never on the CPU node
    check_legal(a)
    curve = a.allocation_curve()
    assert curve.shape == (131,) and curve[0] == 0.0 and np.nanmax(curve) <= 100.0
    assert np.all(a.frag_milli <= a.idle_milli + 1e-6)


def test_run_inflation_uses_the_filter_it_is_given():
    def no_g1(p, state):
        mask = feasible_mask(p, state)
        mask[1] = False
        return mask
    result = run_inflation(NODES, WORKLOAD, BestFitPolicy(), np.random.default_rng(0), filter_fn=no_g1)
    assert 1 not in result.node_index.tolist()
    with pytest.raises(ValueError, match="tie_break"):
        run_inflation(NODES, WORKLOAD, BestFitPolicy(), np.random.default_rng(0), tie_break="first")
    with pytest.raises(ValueError, match="no GPUs"):
        run_inflation(NODES[2:], WORKLOAD, BestFitPolicy(), np.random.default_rng(0))


def test_fgd_is_told_the_workload():
    policy = FgdPolicy()
    run_inflation(NODES, WORKLOAD, policy, np.random.default_rng(0))
    assert policy.target is not None and policy.target.size >= 1


# ---------------------------------------------------------------------------------------------
# Fidelity against the paper's published results (fast subset; the full table is
# benchmarks/fgd_fidelity.py -> docs/fidelity.md, which holds all cells to +-1.0 point on 10 seeds).
# Here: default trace, BestFit and FGD, seeds 42..43 only, compared with the published 10-seed mean.
# Published per-seed standard deviations at 100/130 % are ~0.1-0.15 points for these two policies,
# so a 2-seed mean of a faithful reproduction sits within ~0.3 of the 10-seed mean; 1.5 points
# leaves room for that noise while still failing on any semantic slip (uniform tie-breaking costs
# FGD ~5.6 points, the all-node cluster ~4.5).
FIDELITY_TOLERANCE = 1.5


@pytest.fixture(scope="module")
def paper_inputs():
    return load_openb_nodes(openb_node_path(GPU_NODES)), load_openb_pods(openb_pod_path("default")), load_fgd_expected()


@pytest.mark.parametrize("name", ["fgd", "bestfit"])
def test_fidelity_subset_default_trace(paper_inputs, name):
    nodes, pods, expected = paper_inputs
    curves = [run_inflation(nodes, pods, FGD_PAPER_POLICIES[name](s), np.random.default_rng(s)).allocation_curve()
              for s in (42, 43)]
    for x in (100, 130):
        ours = np.mean([c[x] for c in curves])
        paper = np.mean([expected[("default", name, s)][x] for s in range(42, 52)])
        assert ours == pytest.approx(paper, abs=FIDELITY_TOLERANCE), (name, x, ours, paper)
