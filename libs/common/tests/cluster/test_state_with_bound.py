"""model.state_with_bound: usage summed from bound pods equals binding them one by one."""
import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, pod_index, state_with_bound

NODES = (Node(name="n0", cpu_milli=8000, memory_mib=16384, gpu_count=2),
         Node(name="n1", cpu_milli=4000, memory_mib=8192))


def _pod(name, cpu=1000, mem=1024, num_gpu=0, gpu_milli=0, devices=()):
    return Pod(name=name, cpu_milli=cpu, memory_mib=mem, num_gpu=num_gpu, gpu_milli=gpu_milli, gpu_devices=devices)


@pytest.mark.parametrize("bound", [
    [(), ()],
    [(_pod("a"),), ()],
    [(_pod("a", num_gpu=1, gpu_milli=500, devices=(1,)), _pod("b", num_gpu=1, gpu_milli=1000, devices=(0,))),
     (_pod("c", cpu=3000, mem=4096),)],
    [(_pod("a", num_gpu=2, gpu_milli=1000, devices=(0, 1)),), (_pod("b"), _pod("c"))],
])
def test_state_with_bound_matches_bind(bound):
    got = state_with_bound(NODES, bound)
    want = ClusterState.empty(NODES)
    for i, pods in enumerate(bound):
        for p in pods:
            want = bind(want, p, i, p.gpu_devices)
    for name in ("cpu_used", "mem_used", "pods_used", "eph_used", "gpu_used", "affinity_pods"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert [[p.name for p in ps] for ps in got.bound] == [[p.name for p in ps] for ps in want.bound]
    assert pod_index(got).bound is got.bound
