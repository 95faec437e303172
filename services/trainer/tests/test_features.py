"""agmarl_common.core.features: the graph both training and serving feed the model (tiny literal clusters)."""

import numpy as np
import pytest

from agmarl_common.core.cluster.model import RACK_LABEL, ZONE_LABEL, ClusterState, Node, Pod, bind
from agmarl_common.core.features import (F_EDGE, F_NODE, F_POD, FeatureContext, build_graph, device_for, node_edges,
                                    node_feature_rows, pod_edges)
from agmarl_common.core.sim.fragmentation import node_frag_amount

NODES = (
    Node("a", 32000, 65536, gpu_count=2, gpu_model="T4", labels={ZONE_LABEL: "z1", RACK_LABEL: "r1"}),
    Node("b", 32000, 65536, gpu_count=4, gpu_model="T4", labels={ZONE_LABEL: "z1", RACK_LABEL: "r1"}),
    Node("c", 64000, 131072, labels={ZONE_LABEL: "z1", RACK_LABEL: "r2"}),
    Node("d", 16000, 32768, gpu_count=1, gpu_model="V100", labels={ZONE_LABEL: "z2", RACK_LABEL: "r3"}),
)
SHARE = Pod("share", 2000, 4096, num_gpu=1, gpu_milli=300)
WHOLE = Pod("whole", 4000, 8192, num_gpu=1, gpu_milli=1000)
CPU = Pod("cpu", 8000, 16384)
WORKLOAD = [SHARE, SHARE, WHOLE, CPU, Pod("half", 1000, 1024, num_gpu=1, gpu_milli=500)]


def loaded_state():
    s = ClusterState.empty(NODES)
    s = bind(s, Pod("p1", 1000, 1024, num_gpu=1, gpu_milli=500), 1, (2,))
    s = bind(s, Pod("p2", 4000, 1024, num_gpu=1, gpu_milli=800), 0, (0,))
    return bind(s, Pod("p3", 30000, 1024), 2, ())


def test_shapes_dtypes_and_pod_major_candidates():
    ctx = FeatureContext.from_workload(WORKLOAD)
    g = build_graph([SHARE, CPU], loaded_state(), [np.array([0, 1, 3]), np.array([0, 2])], ctx)
    assert g.node_x.shape == (4, F_NODE) and g.node_x.dtype == np.float32
    assert g.pod_x.shape == (2, F_POD) and g.pod_x.dtype == np.float32
    assert g.cand_attr.shape == (5, F_EDGE) and g.cand_attr.dtype == np.float32
    assert g.cand_pod.tolist() == [0, 0, 0, 1, 1] and g.cand_node.tolist() == [0, 1, 3, 0, 2]
    assert g.cand_pod.dtype == g.cand_node.dtype == g.nn_edge_index.dtype == np.int64
    assert np.isfinite(g.cand_attr).all() and np.isfinite(g.node_x).all()


def test_node_rows_depend_on_their_node_only():
    state = loaded_state()
    ctx = FeatureContext.from_workload(WORKLOAD)
    full = ctx.node_x(state)
    acc = ctx.access(state)
    for i in range(len(NODES)):
        row, _ = node_feature_rows(state, np.array([i]), acc[[i]], ctx.target)
        assert np.array_equal(row[0], full[i])


def test_cached_rows_follow_binds():
    ctx = FeatureContext.from_workload(WORKLOAD)
    state = loaded_state()
    before = ctx.node_x(state)
    state2 = bind(state, SHARE, 3, (0,))
    after = ctx.node_x(state2)
    fresh = FeatureContext.from_workload(WORKLOAD).node_x(state2)
    assert np.array_equal(after, fresh)
    assert np.array_equal(after[:3], before[:3]) and not np.array_equal(after[3], before[3])


@pytest.mark.parametrize("pod", [SHARE, WHOLE, CPU])
def test_frag_delta_is_the_fragmentation_change_of_the_bind(pod):
    ctx = FeatureContext.from_workload(WORKLOAD)
    state = loaded_state()
    cand = np.array([0, 1, 3]) if pod.num_gpu else np.array([0, 1, 2, 3])
    g = build_graph([pod], state, [cand], ctx)
    col = 4  # frag_delta, in GPUs
    for k, i in enumerate(cand):
        gpus = device_for(pod, state, int(i), ctx)
        new = bind(state, pod, int(i), gpus)
        acc = ctx.target.accessible(new.gpu_model)
        f = lambda s: node_frag_amount(s.cpu_cap - s.cpu_used, s.gpu_free(), acc, ctx.target)[i]  # noqa: E731
        assert g.cand_attr[k, col] == pytest.approx((f(new) - f(state)) / 1000, abs=1e-5)


def test_share_device_is_the_least_fragmenting():
    ctx = FeatureContext.from_workload(WORKLOAD)
    state = loaded_state()
    acc = ctx.target.accessible(state.gpu_model)
    best = device_for(SHARE, state, 1, ctx)
    frags = {}
    for j in range(4):
        if state.gpu_free()[1, j] >= SHARE.gpu_milli:
            s = bind(state, SHARE, 1, (j,))
            frags[j] = node_frag_amount(s.cpu_cap - s.cpu_used, s.gpu_free(), acc, ctx.target)[1]
    assert frags[best[0]] == min(frags.values())
    g = build_graph([SHARE], state, [np.array([1])], ctx)
    assert g.cand_device.tolist() == [best[0]]


def test_node_edges_bounded_symmetric_with_self_loops_within_zones():
    nodes = tuple(Node(f"n{i}", 1000, 1000, labels={ZONE_LABEL: f"z{i % 2}", RACK_LABEL: f"r{i % 6}"})
                  for i in range(60))
    e = node_edges(ClusterState.empty(nodes))
    pairs = set(map(tuple, e.T.tolist()))
    assert all((i, i) in pairs for i in range(60))
    assert all((d, s) in pairs for s, d in pairs)
    assert np.bincount(e[1]).max() <= 7
    assert all(nodes[s].zone == nodes[d].zone for s, d in pairs)


def test_unlabelled_nodes_are_pooled_by_gpu_model():
    nodes = tuple(Node(f"n{i}", 1000, 1000, gpu_count=1, gpu_model="A" if i < 5 else "B") for i in range(10))
    e = node_edges(ClusterState.empty(nodes))
    cross = [(s, d) for s, d in e.T.tolist() if (s < 5) != (d < 5)]
    assert len(cross) == 4  # the zone ring joins the two pools at their ends only: 0-9 and 4-5
    assert {frozenset(c) for c in cross} == {frozenset((0, 9)), frozenset((4, 5))}


def test_pod_edges_link_one_service_only():
    pods = [Pod("a", 1, 1, service="web"), Pod("b", 1, 1, service="web"), Pod("c", 1, 1), Pod("d", 1, 1, service="db")]
    pairs = set(map(tuple, pod_edges(pods).T.tolist()))
    assert pairs == {(0, 0), (1, 1), (2, 2), (3, 3), (0, 1), (1, 0)}


def test_mismatched_candidates_are_an_error():
    with pytest.raises(ValueError):
        build_graph([SHARE], loaded_state(), [], FeatureContext.from_workload(WORKLOAD))
    with pytest.raises(ValueError):
        build_graph([SHARE], loaded_state(), [np.array([7])], FeatureContext.from_workload(WORKLOAD))
