import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.sim.fragmentation import (TargetWorkload, cluster_fragmentation, node_frag_amount, pod_shape,
                                             state_frag, target_workload)
from agmarl_common.core.sim.traces import (FGD_EXPECTED_DIR, GPU_NODES, load_fgd_expected, load_openb_nodes,
                                      load_openb_pods, openb_node_path, openb_pod_path)


def shapes(*rows, spec=None) -> TargetWorkload:
    """rows: (cpu, milli per GPU, gpus, probability)."""
    return TargetWorkload(cpu_milli=np.array([r[0] for r in rows]), gpu_milli=np.array([r[1] for r in rows]),
                          num_gpu=np.array([r[2] for r in rows]),
                          gpu_spec=spec or tuple(() for _ in rows), prob=np.array([r[3] for r in rows], float))


# A: a 0.5-GPU share with 4 cores (p .5); B: a 2-core CPU pod (p .25); C: two whole GPUs, 8 cores (p .25)
TARGET = shapes((4000, 500, 1, 0.5), (2000, 0, 0, 0.25), (8000, 1000, 2, 0.25))


def left(*devices):
    return np.array([list(devices) + [0] * (8 - len(devices))])


@pytest.mark.parametrize("cpu_left,gpu_left,expected", [
    # A fits on device 0 and only the 300 left on device 1 is too small for it: .5 * 300;
    # B asks no GPU, so every idle milli is fragment for it: .25 * 1300; C needs two free GPUs: .25 * 1300
    (10_000, left(1000, 300), 0.5 * 300 + 0.25 * 1300 + 0.25 * 1300),
    # too little CPU for A and C: all 1300 idle milli are fragment for every shape
    (3_000, left(1000, 300), 1300.0),
    # an idle 2-GPU node only fragments for the CPU-only shape
    (16_000, left(1000, 1000), 0.25 * 2000),
    # no GPU left, nothing to fragment
    (16_000, left(0, 0), 0.0),
    (0, left(), 0.0),
])
def test_node_frag_amount_by_hand(cpu_left, gpu_left, expected):
    access = np.ones((1, 3), dtype=bool)
    assert node_frag_amount(np.array([cpu_left]), gpu_left, access, TARGET)[0] == pytest.approx(expected)


def test_a_nodes_amount_does_not_depend_on_the_batch_computing_it():
    """Each row is summed in one fixed order: alone, in any sub-batch or in the whole batch, a node's amount is
    the same bit for bit (a BLAS matrix-vector product rounds a row by its place in the batch), which is what
    lets memoised rows, computed in whatever batches decisions asked for, equal rows computed afresh."""
    rng = np.random.default_rng(3)
    k = 35
    target = TargetWorkload(cpu_milli=rng.integers(0, 16_000, k), gpu_milli=rng.choice([0, 250, 500, 1000], k),
                            num_gpu=rng.integers(0, 3, k), gpu_spec=tuple(() for _ in range(k)),
                            prob=rng.dirichlet(np.ones(k)))
    n = 600
    cpu = rng.integers(0, 64_000, n)
    gpu = rng.integers(0, 1001, (n, 8)) * (rng.random((n, 8)) < 0.7)
    access = rng.random((n, k)) < 0.8
    whole = node_frag_amount(cpu, gpu, access, target)
    for i in range(n):
        assert node_frag_amount(cpu[i:i + 1], gpu[i:i + 1], access[i:i + 1], target)[0] == whole[i]
    for size in (2, 3, 5, 17, 64, 333):
        rows = rng.choice(n, size, replace=False)
        assert node_frag_amount(cpu[rows], gpu[rows], access[rows], target).tobytes() == whole[rows].tobytes()


def test_a_gpu_model_the_shape_cannot_use_is_all_fragment():
    target = shapes((1000, 500, 1, 1.0), spec=(("T4",),))
    access = target.accessible(np.array(["V100M16", "T4", ""], dtype=object))
    assert access[:, 0].tolist() == [False, True, False]
    frag = node_frag_amount(np.array([8000, 8000]), np.vstack([left(1000), left(1000)]), access[:2], target)
    assert frag.tolist() == [1000.0, 0.0]


def pod(name, cpu, num=0, milli=0, spec=()):
    return Pod(name=name, cpu_milli=cpu, memory_mib=1, num_gpu=num, gpu_milli=milli, gpu_spec=spec)


def test_target_workload_keeps_the_popular_shapes_and_renormalises():
    pods = ([pod(f"a{i}", 4000, 1, 500) for i in range(6)] + [pod(f"b{i}", 2000) for i in range(3)]
            + [pod("c", 8000, 2, 1000)])
    t = target_workload(pods, popularity_pct=85)  # 6 + 3 = 90 % >= 85 %: the 2-GPU shape is dropped
    assert t.size == 2
    assert t.cpu_milli.tolist() == [4000, 2000] and t.gpu_milli.tolist() == [500, 0]
    assert t.prob.tolist() == pytest.approx([6 / 9, 3 / 9])
    full = target_workload(pods, popularity_pct=100)
    assert full.size == 3 and full.prob.sum() == pytest.approx(1.0)
    assert target_workload(pods, include_cpu_pods=False, popularity_pct=100).gpu_milli.tolist() == [500, 1000]


def test_target_workload_ties_and_constraints():
    pods = [pod("x", 1000, 1, 300, ("T4",)), pod("y", 2000, 1, 300), pod("z", 0)]
    t = target_workload(pods, popularity_pct=100)
    # equal counts: larger CPU first, as the paper's reverse sort orders them; CPU 0 counts as 100m
    assert t.cpu_milli.tolist() == [2000, 1000, 100]
    assert t.gpu_spec == ((), ("T4",), ())
    assert pod_shape(pods[0]) == (1000, 300, 1, "T4")
    with pytest.raises(ValueError):
        target_workload([])


def test_cluster_fragmentation_tracks_binding():
    nodes = (Node("n0", cpu_milli=16000, memory_mib=64000, gpu_count=2, gpu_model="T4"),
             Node("cpu", cpu_milli=16000, memory_mib=64000))
    state = ClusterState.empty(nodes)
    empty = cluster_fragmentation(state, TARGET)
    assert (empty.amount_milli, empty.idle_milli, empty.ratio) == (500.0, 2000.0, 0.25)
    share = Pod("s", cpu_milli=6000, memory_mib=1, num_gpu=1, gpu_milli=700)
    state = bind(state, share, 0, (1,))  # leaves 1000 + 300, 10 cores
    after = cluster_fragmentation(state, TARGET)
    assert after.amount_milli == pytest.approx(800.0) and after.idle_milli == 1300.0
    assert state_frag(state, TARGET).tolist() == pytest.approx([800.0, 0.0])


def test_empty_paper_cluster_matches_the_published_fragmentation():
    """The paper's Fig. 7 starts from the idle cluster: our amount at 0 % must match its first bin.
    (The published bin averages the first ~0.5 % of arrivals, which move it by < 0.1 point.)"""
    nodes = load_openb_nodes(openb_node_path(GPU_NODES))
    published = load_fgd_expected(FGD_EXPECTED_DIR / "analysis_frag_discrete.csv")
    for workload in ("default", "cpu050", "gpushare100"):
        target = target_workload(load_openb_pods(openb_pod_path(workload)))
        ours = 100 * cluster_fragmentation(ClusterState.empty(nodes), target).amount_milli / 6_212_000
        paper = np.mean([c[0] for (w, _, _), c in published.items() if w == workload])
        assert ours == pytest.approx(paper, abs=0.15), workload
