"""reward-aware-gpupack: GPU pods follow FGD (guard tie-break), every other pod follows reward-aware-guard."""

import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.policies.fgd import FgdPolicy
from agmarl_common.core.policies.gpupack import NOLS_NAME, VARIANTS, GpuPackPolicy, is_gpu_pod
from agmarl_common.core.policies.headroom import guard_policy
from agmarl_common.core.policies.registry import get_policy


def node(name, gpus=2, cpu=32000):
    return Node(name, cpu_milli=cpu, memory_mib=1 << 18, gpu_count=gpus, gpu_model="T4")


def gpod(name="g", milli=500, num=1, qos="BE"):
    return Pod(name, cpu_milli=1000, memory_mib=1024, num_gpu=num, gpu_milli=milli, qos=qos)


def cpod(name="c", cpu=4000, qos="BE"):
    return Pod(name, cpu_milli=cpu, memory_mib=1024, qos=qos)


TARGET = [gpod(milli=1000), gpod(milli=500)]


def hybrid(pack_ls=True, guard_tie=True):
    p = GpuPackPolicy(pack_ls=pack_ls, guard_tie=guard_tie)
    p.observe_workload(TARGET)
    return p


def fgd():
    p = FgdPolicy()
    p.observe_workload(TARGET)
    return p


def shared_state():
    """Node a holds a 300-milli share on device 0 and a 6-core cpu pod; node b is empty."""
    state = bind(ClusterState.empty((node("a"), node("b"))), gpod("u", milli=300), 0, (0,))
    return bind(state, cpod("busy", cpu=6000), 0, ())


@pytest.mark.parametrize("pod, gpu", [(gpod(), True), (gpod(num=2, milli=1000), True), (cpod(), False),
                                      (Pod("zero", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=0), False)])
def test_is_gpu_pod(pod, gpu):
    assert is_gpu_pod(pod) is gpu


def test_a_gpu_pod_follows_fgd_where_the_guard_prefers_the_other_node():
    state, cand = shared_state(), np.array([0, 1])
    pod = gpod(milli=500)
    s_fgd = fgd().score(pod, state, cand)
    s_guard = guard_policy().score(pod, state, cand)
    assert int(np.argmax(s_fgd)) == 0 and int(np.argmax(s_guard)) == 1  # they disagree
    s = hybrid().score(pod, state, cand)
    assert int(np.argmax(s)) == 0
    assert np.all((s >= s_fgd - 0.1) & (s < s_fgd + 1))  # the tie-breaks stay inside one FGD unit


def test_a_gpu_pod_on_fgd_ties_follows_the_guard():
    # two identical nodes, one with a cpu pod: FGD ties them, the guard (balance) prefers the empty one
    state = bind(ClusterState.empty((node("a"), node("b"))), cpod("busy", cpu=16000), 0, ())
    cand, pod = np.array([0, 1]), gpod(milli=1000)
    assert len(set(fgd().score(pod, state, cand).tolist())) == 1
    guard_pick = int(np.argmax(guard_policy().score(pod, state, cand)))
    assert guard_pick == 1
    assert int(np.argmax(hybrid().score(pod, state, cand))) == guard_pick
    # without the guard tie-break it is fgd-pack: the used node first
    assert int(np.argmax(hybrid(guard_tie=False).score(pod, state, cand))) == 0


def test_a_cpu_pod_follows_the_guard_exactly():
    state, cand = shared_state(), np.array([0, 1])
    for pod in (cpod(), cpod("ls", qos="LS")):
        assert np.array_equal(hybrid().score(pod, state, cand), guard_policy().score(pod, state, cand))


def test_ls_gpu_pods_are_packed_unless_pack_ls_is_off():
    state, cand = shared_state(), np.array([0, 1])
    pod = gpod("ls-g", milli=500, qos="LS")
    assert int(np.argmax(hybrid().score(pod, state, cand))) == int(np.argmax(fgd().score(pod, state, cand))) == 0
    assert np.array_equal(hybrid(pack_ls=False).score(pod, state, cand), guard_policy().score(pod, state, cand))


def test_gpu_device_choice_is_fgds():
    # a 500 share on node a: FGD picks a device by fragmentation; the hybrid picks the same one
    state = shared_state()
    pod = gpod(milli=500)
    assert hybrid().choose_gpus(pod, state, 0) == fgd().choose_gpus(pod, state, 0)
    assert hybrid().choose_gpus(cpod(), state, 0) == ()
    assert hybrid().choose_gpus(gpod(num=2, milli=1000), state, 1) == (0, 1)


def test_needs_a_target_workload():
    with pytest.raises(ValueError, match="target workload"):
        GpuPackPolicy().score(gpod(), shared_state(), np.array([0, 1]))


def test_registered():
    assert isinstance(get_policy("reward-aware-gpupack"), GpuPackPolicy)
    p = get_policy(NOLS_NAME)
    assert p.name == NOLS_NAME and not p.pack_ls and p.guard_tie
    for name, kwargs in VARIANTS.items():
        p = get_policy(name)
        assert p.name == name and all(getattr(p, k) == v for k, v in kwargs.items())
