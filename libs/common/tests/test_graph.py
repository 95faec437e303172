"""Graph features round-trip between graph-builder and inference."""

import numpy as np

from agmarl_common.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.graph import candidate_features, state_from_features


def test_candidate_features_round_trip_keeps_usage():
    nodes = [Node("a", 4000, 8000, gpu_count=2, gpu_model="T4"), Node("b", 2000, 4000), Node("c", 1000, 1000)]
    s = bind(ClusterState.empty(nodes), Pod("p", 1000, 500, num_gpu=1, gpu_milli=300), 0, (1,))
    feats = candidate_features(s, np.array([0, 2]))
    mini = state_from_features(feats)
    assert [n.name for n in mini.nodes] == ["a", "c"]
    assert mini.cpu_used.tolist() == [1000, 0]
    assert mini.gpu_used[0].tolist()[:2] == [0, 300]
    assert mini.gpu_model.tolist() == ["T4", ""]


def test_state_from_features_rejects_ragged_rows():
    feats = candidate_features(ClusterState.empty([Node("a", 1, 1)]), np.array([0]))
    feats["cpu_used"] = [1, 2]
    try:
        state_from_features(feats)
    except ValueError as exc:
        assert "cpu_used" in str(exc)
    else:
        raise AssertionError("ragged features accepted")
