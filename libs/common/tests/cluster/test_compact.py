"""The compact state form: what the hard filter and the graph features read survives the round trip,
identity does not; a pod can be left out; malformed input is rejected with an error."""

from __future__ import annotations

import base64
import zlib
from dataclasses import replace

import msgpack
import numpy as np
import pytest

from agmarl_common.core.cluster.compact import FORMAT, MAX_INFLATED_BYTES, compact_dict, compact_state, \
    deflate_shared, deflated, drop_pending, inflated, is_compact, is_deflated, pod_key_of, state_from_compact, \
    state_from_dict
from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import HOSTNAME_LABEL, ZONE_LABEL, ClusterState, LabelSelector, Node, Pod, \
    PodAffinityTerm, Taint, Toleration, TopologySpreadConstraint, bind, state_to_dict, to_dict
from agmarl_common.core.features import FeatureContext, build_graph

WEB = {"app": "web"}
NODES = (
    Node("a", 4000, 8192, labels={ZONE_LABEL: "z1", HOSTNAME_LABEL: "a"}),
    Node("b", 4000, 8192, labels={ZONE_LABEL: "z1", HOSTNAME_LABEL: "b"}),
    Node("c", 8000, 16384, gpu_count=2, gpu_model="V100", labels={ZONE_LABEL: "z2", HOSTNAME_LABEL: "c"}),
    Node("d", 8000, 16384, gpu_count=4, gpu_model="T4", taints=(Taint("gpu", "yes"),)),
    Node("e", 2000, 2048, unschedulable=True),
)
ANTI_WEB = PodAffinityTerm(LabelSelector(WEB), HOSTNAME_LABEL)


def cluster() -> ClusterState:
    s = ClusterState.empty(NODES)
    for p, i, gpus in [
        (Pod("web-1", 500, 512, labels=WEB), 0, ()),
        (Pod("web-2", 500, 512, labels=WEB, pod_anti_affinity=(ANTI_WEB,)), 1, ()),  # blocks web on b
        (Pod("share", 1000, 1024, num_gpu=1, gpu_milli=300, creation_time=5.0), 2, (1,)),
        (Pod("share-2", 1000, 1024, num_gpu=1, gpu_milli=300, creation_time=9.0), 2, (1,)),  # same spec
        (Pod("whole", 2000, 2048, num_gpu=2, gpu_milli=1000, tolerations=(Toleration("gpu", "Equal", "yes"),)),
         3, (0, 2)),
        (Pod("batch", 0, 0, namespace="jobs", ephemeral_mib=100), 4, ()),
    ]:
        s = bind(s, p, i, gpus)
    return s


PENDING = (Pod("queued", 300, 300, labels=WEB), Pod("gpu-queued", 500, 500, num_gpu=1, gpu_milli=500))

USAGE = ("cpu_used", "mem_used", "pods_used", "eph_used", "gpu_used", "affinity_pods")


def strip(p: Pod) -> Pod:
    return replace(p, name="", uid="", creation_time=0.0, duration=0.0)


def test_round_trip_keeps_nodes_usage_and_pod_specs():
    s = cluster()
    data = compact_state(s, PENDING)
    assert is_compact(data) and data["format"] == FORMAT
    back, pending = state_from_compact(msgpack.unpackb(msgpack.packb(data)))  # through the wire
    assert back.nodes == s.nodes
    for k in USAGE:
        assert np.array_equal(getattr(back, k), getattr(s, k)), k
    assert [[strip(p) for p in pods] for pods in back.bound] == [[strip(p) for p in pods] for pods in s.bound]
    assert [p.name for p in back.bound[2]] == ["c#0", "c#1"]  # identity is not kept, names stay unique
    assert [strip(p) for p in pending] == [strip(p) for p in PENDING]
    assert len(data["templates"]) == 7  # the two equal GPU-share pods share one spec


def test_all_default_node_columns_are_left_out():
    cols = compact_state(ClusterState.empty((Node("x", 1000, 1000), Node("y", 2000, 1000, labels={"k": "v"}))))
    assert set(cols["nodes"]) == {"n", "name", "cpu_milli", "memory_mib", "labels"}
    assert cols["nodes"]["labels"] == {"k": [None, "v"]}


@pytest.mark.parametrize("p", [
    Pod("web", 500, 512, labels=WEB),  # existing anti-affinity of web-2 keeps it off b
    Pod("anti", 500, 512, pod_anti_affinity=(ANTI_WEB,)),  # must avoid nodes holding web pods
    Pod("near", 500, 512, pod_affinity=(PodAffinityTerm(LabelSelector(WEB), ZONE_LABEL),)),
    Pod("spread", 500, 512, labels=WEB, topology_spread=(TopologySpreadConstraint(
        1, ZONE_LABEL, label_selector=LabelSelector(WEB)),)),
    Pod("share", 500, 512, num_gpu=1, gpu_milli=800),  # device 1 of c is 600 used: device 0 fits
    Pod("two", 500, 512, num_gpu=2, gpu_milli=1000, tolerations=(Toleration("gpu", "Equal", "yes"),)),
    Pod("big", 7000, 1024),
    Pod("job", 100, 100, namespace="jobs", pod_anti_affinity=(PodAffinityTerm(LabelSelector(), HOSTNAME_LABEL),)),
])
def test_the_hard_filter_sees_the_same_cluster(p):
    s = cluster()
    back, _ = state_from_compact(compact_state(s))
    assert feasible_nodes(p, back).tolist() == feasible_nodes(p, s).tolist()


def test_the_graph_is_the_same():
    s, p = cluster(), Pod("share", 500, 512, num_gpu=1, gpu_milli=400)
    back, pending = state_from_compact(compact_state(s, PENDING))
    graphs = []
    for state, waiting in ((s, PENDING), (back, pending)):
        ctx = FeatureContext.from_workload(state.all_pods() + list(waiting) + [p])
        graphs.append(build_graph([p], state, [feasible_nodes(p, state)], ctx))
    a, b = graphs
    for k in ("node_x", "pod_x", "nn_edge_index", "cand_node", "cand_attr", "cand_device"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k


@pytest.mark.parametrize("without,pods,pending", [
    ("default/share", 5, 2),  # a bound pod: its usage goes too
    ("default/queued", 6, 1),
    ("default/nobody", 6, 2),
])
def test_a_pod_can_be_left_out(without, pods, pending):
    s = cluster()
    back, waiting = state_from_compact(compact_state(s, PENDING, without=without))
    assert int(back.pods_used.sum()) == pods and len(waiting) == pending
    if without == "default/share":
        assert back.gpu_used[2].tolist()[:2] == [0, 300] and back.cpu_used[2] == 1000


def test_drop_pending_and_keys():
    data = compact_state(cluster(), PENDING)
    _, waiting = state_from_compact(drop_pending(data, 0))
    assert [p.num_gpu for p in waiting] == [1]
    assert pod_key_of(to_dict(Pod("x", 1, 1))) == "default/x" and pod_key_of({"name": "y", "namespace": "n"}) == "n/y"


def _broken(change) -> dict:
    data = compact_state(cluster(), PENDING)
    change(data)
    return data


@pytest.mark.parametrize("data", [
    {"nodes": []},  # not the compact format
    _broken(lambda d: d["nodes"]["cpu_milli"].pop()),  # a short column
    _broken(lambda d: d["nodes"].__setitem__("n", -1)),
    _broken(lambda d: d["bound"].pop()),
    _broken(lambda d: d["bound"][0].append(99 << 8)),  # no such template
    _broken(lambda d: d["pending"].append(99)),
    _broken(lambda d: d["templates"][0].__setitem__("oops", 1)),  # unknown pod field
    _broken(lambda d: d.pop("templates")),
])
def test_malformed_compact_states_are_rejected(data):
    with pytest.raises((ValueError, TypeError, KeyError)):
        state_from_compact(data)


def test_bad_input_to_compact_is_rejected():
    with pytest.raises(ValueError):
        compact_dict({"nodes": [to_dict(NODES[0])], "bound": [[], []]})
    with pytest.raises(ValueError):
        compact_dict({"nodes": [to_dict(NODES[0])], "bound": [[{"name": "p", "cpu_milli": 1, "memory_mib": 1,
                                                                 "gpu_devices": [9]}]]})
    assert state_to_dict(state_from_compact(compact_dict(state_to_dict(cluster())))[0])["nodes"] == \
        [to_dict(n) for n in NODES]


# ---------------------------------------------------------------------------------------------
# The deflated form experiences carry


def test_a_deflated_state_inflates_to_the_same_compact_state_from_bytes_or_base64_text():
    data = compact_state(cluster(), PENDING)
    shared = deflate_shared(data)
    small = deflated(data, shared)
    assert is_deflated(small) and small["shared"] is shared and small["pending"] == data["pending"]
    assert len(msgpack.packb(small)) < len(msgpack.packb(data))
    assert inflated(msgpack.unpackb(msgpack.packb(small))) == data  # through the wire: bytes
    as_text = {**small, "shared": base64.urlsafe_b64encode(shared).decode()}  # a JSON file: base64 text
    assert inflated(as_text) == data
    assert deflated(data) == small  # the shared part made on the spot: the same bytes
    back, pending = state_from_compact(inflated(small))
    assert back.nodes == cluster().nodes and [p.cpu_milli for p in pending] == [300, 500]
    assert state_from_dict(small).pods_used.tolist() == cluster().pods_used.tolist()  # dispatch on the format
    trimmed = deflated(drop_pending(data, 0), shared)  # another transition on the same snapshot
    assert inflated(trimmed)["pending"] == data["pending"][1:] and trimmed["shared"] is shared


@pytest.mark.parametrize("mangle, why", [
    (lambda d: {**d, "format": FORMAT}, "not a deflated"),
    (lambda d: {**d, "shared": b"not zlib"}, "deflated compact state"),
    (lambda d: {**d, "shared": "%%% not base64"}, "not base64"),
    (lambda d: {**d, "shared": 7}, "must be bytes"),
    (lambda d: {**d, "shared": zlib.compress(b"\xc1")}, "not msgpack"),
    (lambda d: {**d, "shared": zlib.compress(msgpack.packb({"nodes": {}}))}, "exactly"),
    (lambda d: {**d, "shared": zlib.compress(b"\0" * (MAX_INFLATED_BYTES + 1))}, "no whole state"),  # a bomb
    (lambda d: {**d, "shared": d["shared"][:-4]}, "no whole state"),  # truncated
    (lambda d: {**d, "pending": "0,1"}, "pending must be a list"),
])
def test_a_malformed_deflated_state_is_refused_with_a_reason(mangle, why):
    bad = mangle(deflated(compact_state(cluster(), PENDING)))
    with pytest.raises(ValueError, match=why):
        inflated(bad)
