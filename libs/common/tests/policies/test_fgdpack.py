"""fgd-pack: FGD's integer scores with a tie order the model can see (used nodes first, then a name hash)."""

import zlib

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.features import NODE_FEATURES, FeatureContext, node_order_keys
from agmarl_common.core.policies.fgd import FgdPolicy
from agmarl_common.core.policies.fgdpack import FgdPackPolicy
from agmarl_common.core.policies.registry import get_policy


def node(name, gpus=2):
    return Node(name, cpu_milli=32000, memory_mib=1 << 18, gpu_count=gpus, gpu_model="T4")


def pod(name="p", cpu=1000, num=1, milli=1000):
    return Pod(name, cpu_milli=cpu, memory_mib=1024, num_gpu=num, gpu_milli=milli)


def policy(target_pods=(pod(), pod(milli=500))):
    p = FgdPackPolicy()
    p.observe_workload(list(target_pods))
    return p


def test_node_order_keys_are_a_stable_hash_of_the_name():
    keys = node_order_keys(["a", "b", "a"])
    assert keys.tolist() == [zlib.crc32(b"a") / 2**32, zlib.crc32(b"b") / 2**32, zlib.crc32(b"a") / 2**32]
    assert ((keys >= 0) & (keys < 1)).all()


def test_order_key_is_the_last_node_feature():
    nodes = (node("n-1"), node("n-2"))
    state = ClusterState.empty(nodes)
    ctx = FeatureContext.from_workload([pod()])
    x = ctx.node_x(state)
    assert NODE_FEATURES[-1] == "order_key"
    assert np.allclose(x[:, -1], node_order_keys(["n-1", "n-2"]), atol=1e-7)


def test_ties_go_to_a_used_node_then_to_the_lowest_name_key():
    # four identical idle nodes: FGD ties them all; fgd-pack orders them by name key
    names = [f"node-{k}" for k in range(4)]
    state = ClusterState.empty(tuple(node(n) for n in names))
    cand = np.arange(4)
    base = FgdPolicy()
    base.observe_workload([pod(), pod(milli=500)])
    s_fgd = base.score(pod(), state, cand)
    assert len(set(s_fgd.tolist())) == 1
    s = policy().score(pod(), state, cand)
    assert int(np.argmax(s)) == int(np.argmin(node_order_keys(names)))
    assert np.all(np.floor(s_fgd) - s < 0.5)  # the keys stay inside one score unit
    # a small CPU pod on the highest-key node makes it "used": ties now go to it
    last = int(np.argmax(node_order_keys(names)))
    state = bind(state, Pod("cpu", cpu_milli=100, memory_mib=10), last, ())
    assert len(set(base.score(pod(), state, cand).tolist())) == 1  # still a tie for FGD
    assert int(np.argmax(policy().score(pod(), state, cand))) == last


def test_a_higher_fgd_score_still_wins():
    # a 300-milli share on node a: a 500 share scores 53 there, 43 on the empty node b
    state = bind(ClusterState.empty((node("a"), node("b"))), pod("u", milli=300), 0, (0,))
    cand = np.array([0, 1])
    base = FgdPolicy()
    base.observe_workload([pod(), pod(milli=500)])
    s_fgd, s = base.score(pod(milli=500), state, cand), policy().score(pod(milli=500), state, cand)
    assert s_fgd.tolist() == [53.0, 43.0] and int(np.argmax(s)) == 0
    # in general: fgd-pack = FGD minus less than half a unit, so an integer FGD lead is never overturned
    assert np.all((s <= s_fgd) & (s > s_fgd - 0.5))


def test_registered():
    assert isinstance(get_policy("fgd-pack"), FgdPackPolicy)


def test_fgd_pack_cpu_sends_a_cpu_pod_s_ties_to_a_node_without_gpus_and_gpu_pods_as_fgd_pack():
    # a GPU node already running a pod, an empty GPU node, an empty CPU node: FGD ties a CPU-only pod on all three
    nodes = (node("gpu-busy"), node("gpu-idle"), node("cpu", gpus=0))
    state = bind(ClusterState.empty(nodes), Pod("cpu-0", cpu_milli=100, memory_mib=10), 0, ())
    cand = np.arange(3)
    cpu_pod = Pod("c", cpu_milli=2000, memory_mib=1024)
    base = FgdPolicy()
    base.observe_workload([pod(), pod(milli=500)])
    s_fgd = base.score(cpu_pod, state, cand)
    assert len(set(s_fgd.tolist())) == 1
    assert int(np.argmax(policy().score(cpu_pod, state, cand))) == 0  # fgd-pack: the running GPU node
    aside = get_policy("fgd-pack-cpu")
    aside.observe_workload([pod(), pod(milli=500)])
    s = aside.score(cpu_pod, state, cand)
    assert int(np.argmax(s)) == 2 and np.all((s <= s_fgd) & (s > s_fgd - 0.5))  # the CPU node; within a unit
    for gpu_pod in (pod(), pod(milli=500), pod(num=2)):  # GPU pods: fgd-pack's scores exactly
        assert aside.score(gpu_pod, state, cand).tolist() == policy().score(gpu_pod, state, cand).tolist()
    assert aside.local_scores  # static keys: a batch may re-score only the nodes it changed
