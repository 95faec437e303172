"""The compact snapshot form: exact round trip (identity included) on literal, random and openb-sized
states, ``state_from_dict`` decodes it, it fits the message limit at openb scale, malformed input is rejected."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import numpy as np
import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.core.cluster.compact import SNAPSHOT_FORMAT, bound_pod_dicts, compact_dict, compact_snapshot, \
    compact_snapshot_dict, is_compact, is_snapshot, state_from_compact, state_from_snapshot
from agmarl_common.core.cluster.model import HOSTNAME_LABEL, MAX_GPUS, ZONE_LABEL, ClusterState, LabelSelector, Node, \
    Pod, PodAffinityTerm, Taint, Toleration, bind, choose_gpus, state_from_dict, state_to_dict, to_dict
from agmarl_common.core.sim.traces import load_openb_nodes, load_openb_pods

UID = "0b7c3a52-7d1e-4c3e-9f5a-2f0e8d9c1a44"
NODES = (
    Node("a", 4000, 8192, labels={ZONE_LABEL: "z1", HOSTNAME_LABEL: "a"}),
    Node("b", 8000, 16384, gpu_count=4, gpu_model="V100", taints=(Taint("gpu", "yes"),)),
    Node("c", 2000, 2048, unschedulable=True, max_pods=3),
)
GPU_OK = (Toleration("gpu", "Equal", "yes"),)
ARRAYS = ("cpu_used", "mem_used", "pods_used", "eph_used", "gpu_used", "affinity_pods", "cpu_cap", "mem_cap",
          "pods_cap", "eph_cap", "gpu_count", "gpu_model", "schedulable", "tainted")


def cluster() -> ClusterState:
    s = ClusterState.empty(NODES)
    for p, i, gpus in [
        (Pod("web-1", 500, 512, uid=UID, labels={"app": "web"}, creation_time=1.5), 0, ()),
        (Pod("web-2", 500, 512, uid="not-a-uuid", labels={"app": "web"}, creation_time=2.0, duration=30.25), 0, ()),
        (Pod("web-1", 500, 512, namespace="prod", uid=UID.upper(), labels={"app": "web"}), 0, ()),  # same name
        (Pod("share", 1000, 1024, num_gpu=1, gpu_milli=300, tolerations=GPU_OK, creation_time=1.7e9 + 0.125), 1, (2,)),
        (Pod("whole", 2000, 2048, num_gpu=2, gpu_milli=1000, tolerations=GPU_OK, duration=7.0), 1, (3, 0)),  # order
        (Pod("anti", 100, 100, pod_anti_affinity=(PodAffinityTerm(LabelSelector({"app": "web"}), HOSTNAME_LABEL),)),
         2, ()),
        (Pod("batch", 0, 0, namespace="jobs", ephemeral_mib=100, creation_time=-3.0), 2, ()),
    ]:
        s = bind(s, p, i, gpus)
    return s


def reference(s: ClusterState) -> ClusterState:
    """What consumers decoded before: the full form."""
    return state_from_dict(m.decode(m.ClusterSnapshot, m.encode(snapshot_of(state_to_dict(s)))).state)


def snapshot_of(state: dict) -> m.ClusterSnapshot:
    return m.ClusterSnapshot(cluster="c", seq=1, time=0.0, state=state)


def through_the_wire(data: dict) -> dict:
    return m.decode(m.ClusterSnapshot, m.encode(snapshot_of(data)), max_bytes=1 << 30).state


def assert_same(got: ClusterState, want: ClusterState) -> None:
    assert got.nodes == want.nodes
    assert got.index == want.index
    assert got.bound == want.bound  # every pod field: identity, spec, node, devices in their order
    for k in ARRAYS:
        assert np.array_equal(getattr(got, k), getattr(want, k)), k
    assert got.all_pods() == want.all_pods()


def test_round_trip_is_exact_through_the_wire():
    s = cluster()
    data = through_the_wire(compact_snapshot(s))
    assert is_snapshot(data) and not is_compact(data) and data["format"] == SNAPSHOT_FORMAT
    assert_same(state_from_snapshot(data), reference(s))
    assert_same(state_from_dict(data), reference(s))  # what every consumer calls
    back = state_from_dict(data)
    assert [p.key for p in back.bound[0]] == ["default/web-1", "default/web-2", "prod/web-1"]
    assert back.bound[0][0].uid == UID and back.bound[0][2].uid == UID.upper() and back.bound[0][1].uid == "not-a-uuid"
    assert back.bound[1][1].gpu_devices == (3, 0) and back.bound[1][0].creation_time == 1.7e9 + 0.125


def test_what_is_shared_and_what_is_left_out():
    data = compact_snapshot(cluster())
    pods = data["pods"]
    assert pods["count"] == [3, 2, 2]
    assert pods["template"][:3] == [0, 0, 1]  # web-1 and web-2 share a spec; prod/web-1 differs by namespace
    assert pods["uid"][0] == bytes.fromhex(UID.replace("-", "")) and pods["uid"][1] == "not-a-uuid"
    assert pods["gpu_devices"][3:5] == [0b100, [3, 0]]
    assert pods["creation_time"][1] == 2 and isinstance(pods["creation_time"][1], int)
    assert "node_name" not in pods  # every pod is on its own node
    plain = compact_snapshot(ClusterState.empty(NODES[:1]))
    assert plain["pods"] == {"count": [0], "template": [], "name": []}
    one = compact_snapshot(bind(ClusterState.empty(NODES[:1]), Pod("p", 1, 1), 0))
    assert one["pods"] == {"count": [1], "template": [0], "name": ["p"]}  # all-default columns left out


def test_a_pod_whose_node_name_differs_from_its_node_is_kept():
    full = state_to_dict(cluster())
    full["bound"][2][0]["node_name"] = "elsewhere"
    del full["bound"][0][1]["node_name"]
    data = compact_snapshot_dict(full)
    assert len(data["pods"]["node_name"]) == 7
    assert_same(state_from_dict(through_the_wire(data)), state_from_dict(full))


def random_state(rng: np.random.Generator) -> ClusterState:
    """Random nodes and bound pods: shared and unique specs, random identity, any device order."""
    nodes = tuple(Node(f"n{i}", int(rng.integers(1, 64)) * 1000, int(rng.integers(1, 256)) * 1024,
                       gpu_count=(g := int(rng.choice([0, 0, 1, 2, 4, 8]))), gpu_model="A100" if g else "",
                       labels={ZONE_LABEL: f"z{int(rng.integers(3))}",
                               **({"disk": "ssd"} if rng.random() < .3 else {})},
                       taints=(Taint("gpu", "yes"),) if g and rng.random() < .5 else (),
                       ready=bool(rng.random() < .9)) for i in range(int(rng.integers(1, 12))))
    specs = [Pod("", int(rng.integers(0, 4000)), int(rng.integers(0, 4096)),
                 namespace=str(rng.choice(["default", "ml"])),
                 labels={"app": f"a{int(rng.integers(3))}"}, tolerations=GPU_OK if rng.random() < .5 else (),
                 num_gpu=(k := int(rng.choice([0, 0, 1, 2]))), gpu_milli=int(rng.choice([250, 500, 1000])) if k == 1
                 else 1000 * (k > 0), qos=str(rng.choice(["", "LS", "BE"])), priority=int(rng.integers(0, 3)))
             for _ in range(int(rng.integers(1, 6)))]
    s = ClusterState.empty(nodes)
    for k in range(int(rng.integers(0, 60))):
        spec, i = specs[int(rng.integers(len(specs)))], int(rng.integers(len(nodes)))
        uid = str(rng.choice(["", "x-" + str(k), "%08x-0000-4000-8000-%012x" % (k, int(rng.integers(1 << 40)))]))
        pod = replace(spec, name=f"p{k}-{int(rng.integers(1000))}", uid=uid,
                      creation_time=float(rng.choice([0.0, float(k), k + float(rng.random())])),
                      duration=float(rng.choice([0.0, 60.0, float(rng.random()) * 1e4])),
                      labels={**spec.labels, **({"pod": str(k)} if rng.random() < .2 else {})})
        gpus = choose_gpus(pod, s.gpu_free()[i]) if pod.num_gpu else ()
        if gpus is None:
            continue
        s = bind(s, pod, i, tuple(rng.permutation(gpus).tolist()) if rng.random() < .3 else gpus)
    return s


@pytest.mark.parametrize("seed", range(60))
def test_round_trip_is_exact_on_random_states(seed):
    s = random_state(np.random.default_rng(seed))
    data = through_the_wire(compact_snapshot(s))
    assert_same(state_from_dict(data), reference(s))
    assert bound_pod_dicts(data) == state_to_dict(s)["bound"]


@pytest.mark.parametrize("seed", range(10))
def test_the_experience_form_of_a_snapshot_is_the_experience_form_of_the_full_state(seed):
    s = random_state(np.random.default_rng(100 + seed))
    pending = [to_dict(Pod("queued", 100, 100, labels={"app": "a1"}))]
    full, data = state_to_dict(s), through_the_wire(compact_snapshot(s))
    without = s.all_pods()[0].key if s.all_pods() else "default/queued"
    for leave_out in ("", without):
        want, _ = state_from_compact(compact_dict(full, pending, leave_out))
        got, _ = state_from_compact(compact_dict(data, pending, leave_out))
        assert got.nodes == want.nodes and got.bound == want.bound, leave_out
        # the nodes a reader parsed already (the reward-calculator's cluster_state) give the same bytes
        assert compact_dict(data, pending, leave_out, nodes=state_from_dict(data).nodes) == \
            compact_dict(data, pending, leave_out)


def test_state_from_dict_decodes_the_experience_form_and_rejects_unknown_formats():
    s = cluster()
    back = state_from_dict(compact_dict(state_to_dict(s)))
    assert back.nodes == s.nodes and np.array_equal(back.cpu_used, s.cpu_used)
    with pytest.raises(ValueError, match="unknown cluster state format"):
        state_from_dict({"format": "agmarl.snapshot/99", "nodes": []})


def _broken(change) -> dict:
    data = compact_snapshot(cluster())
    change(data)
    return data


@pytest.mark.parametrize("data", [
    {"format": "agmarl.compact/1"},  # not a snapshot
    _broken(lambda d: d["pods"]["count"].pop()),  # fewer counts than nodes
    _broken(lambda d: d["pods"]["count"].__setitem__(0, -1)),
    _broken(lambda d: d["pods"]["name"].pop()),  # a short pod column
    _broken(lambda d: d["pods"]["uid"].append("")),  # a long one
    _broken(lambda d: d["pods"]["template"].__setitem__(0, 99)),  # no such template
    _broken(lambda d: d["pods"]["gpu_devices"].__setitem__(0, 1 << MAX_GPUS)),
    _broken(lambda d: d["pods"]["uid"].__setitem__(0, 7)),
    _broken(lambda d: d["pods"].__setitem__("colour", [])),  # unknown column
    _broken(lambda d: d["templates"][0].__setitem__("oops", 1)),  # unknown pod field
    _broken(lambda d: d.pop("pods")),
])
def test_malformed_snapshots_are_rejected(data):
    with pytest.raises((ValueError, TypeError, KeyError)):
        state_from_snapshot(data)
    with pytest.raises((ValueError, TypeError, KeyError)):
        state_from_dict(data)


def test_bad_input_to_the_encoder_is_rejected():
    full = state_to_dict(cluster())
    with pytest.raises(ValueError):
        compact_snapshot_dict({"nodes": full["nodes"], "bound": full["bound"][:2]})
    full["bound"][1][0]["gpu_devices"] = [MAX_GPUS]
    with pytest.raises(ValueError):
        compact_snapshot_dict(full)


# ---------------------------------------------------------------------------------------------
# openb scale


def openb_state(n_bound: int) -> ClusterState:
    """1,523 openb nodes holding ``n_bound`` openb pods (``load_openb_pods``, repeated with new names as
    needed), spread by a seeded best-effort fit: a pod that fits nowhere any more (the nodes hold ~10,700 of
    these pods) is bound over-committed, without devices. Built as dicts, then ``state_from_dict``."""
    nodes, pods = load_openb_nodes(), load_openb_pods()
    cpu, mem = np.array([n.cpu_milli for n in nodes]), np.array([n.memory_mib for n in nodes])
    model = np.array([n.gpu_model for n in nodes])
    gfree = np.where(np.arange(MAX_GPUS)[None, :] < np.array([n.gpu_count for n in nodes])[:, None], 1000, 0)
    bound: list[list[dict]] = [[] for _ in nodes]
    for k in range(n_bound):
        p = pods[k % len(pods)]
        p = replace(p, name=f"{p.name}-{k // len(pods)}") if k >= len(pods) else p
        ok = (cpu >= p.cpu_milli) & (mem >= p.memory_mib)
        if p.num_gpu:
            ok &= (gfree >= p.gpu_milli).sum(axis=1) >= p.num_gpu
            ok &= np.isin(model, p.gpu_spec) if p.gpu_spec else True
        fit = np.flatnonzero(ok)
        i = int(fit[(k * 7919) % fit.size]) if fit.size else (k * 7919) % len(nodes)
        gpus = choose_gpus(p, gfree[i]) if p.num_gpu and fit.size else ()
        cpu[i] -= p.cpu_milli
        mem[i] -= p.memory_mib
        for j in gpus:
            gfree[i, j] -= p.gpu_milli if p.is_gpu_share else 1000
        bound[i].append(to_dict(replace(p, node_name=nodes[i].name, gpu_devices=tuple(gpus))))
    return state_from_dict({"nodes": [to_dict(n) for n in nodes], "bound": bound})


@pytest.mark.parametrize("n_bound", [6000, 12000])
def test_an_openb_snapshot_fits_the_message_limit_and_round_trips(n_bound):
    s = openb_state(n_bound)
    assert s.n_nodes == 1523 and int(s.pods_used.sum()) == n_bound
    full = len(m.encode(snapshot_of(state_to_dict(s))))
    compact = m.encode(snapshot_of(compact_snapshot(s)))
    print(f"openb snapshot, 1523 nodes, {n_bound} bound pods: full {full} bytes, compact {len(compact)} bytes "
          f"(limit {m.MAX_MESSAGE_BYTES})")
    assert full > m.MAX_MESSAGE_BYTES > len(compact)
    assert_same(state_from_dict(m.decode(m.ClusterSnapshot, compact).state), reference_large(s))


def reference_large(s: ClusterState) -> ClusterState:
    return state_from_dict(msgpack.unpackb(msgpack.packb(state_to_dict(s))))
