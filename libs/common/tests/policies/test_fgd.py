import math

import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.policies.base import Policy
from agmarl_common.core.policies.fgd import (FGD_PAPER_POLICIES, BestFitPolicy, DotProdPolicy, FgdPolicy,
                                        GpuClusteringPolicy, GpuPackingPolicy, RandomPolicy, gpu_tag,
                                        normalise_like_simulator)
from agmarl_common.core.sim.fragmentation import TargetWorkload, pod_shape


def node(name, cpu, gpus=0, model="G2"):
    return Node(name, cpu_milli=cpu, memory_mib=1 << 20, gpu_count=gpus, gpu_model=model if gpus else "")


def pod(name="p", cpu=4000, num=0, milli=0):
    return Pod(name, cpu_milli=cpu, memory_mib=1024, num_gpu=num, gpu_milli=milli)


SMALL, BIG = node("small", 32000, 2, "T4"), node("big", 96000, 8)
ALL = np.array([0, 1])


def test_registry_names_and_factories():
    assert list(FGD_PAPER_POLICIES) == ["random", "dotprod", "gpu-clustering", "gpu-packing", "bestfit", "fgd"]
    for name, factory in FGD_PAPER_POLICIES.items():
        policy = factory(7)
        assert isinstance(policy, Policy) and policy.name == name


def test_bestfit_by_hand():
    # small: 1 - (.5*28000/128000 + .5*1000/8000) = .828 -> 82; big: 1 - (.5*92000/128000 + .5*7000/8000) -> 20
    # then the simulator's min-max normalisation: 82 -> 100, 20 -> 0
    state = ClusterState.empty((SMALL, BIG))
    assert BestFitPolicy().score(pod(num=1, milli=1000), state, ALL).tolist() == [100.0, 0.0]
    assert normalise_like_simulator(np.array([5, 5])).tolist() == [0, 0]
    assert normalise_like_simulator(np.array([20, 50, 82])).tolist() == [0, 48, 100]


def test_dotprod_by_hand():
    # small: 1 - (.25*4000/128000 + .25*1000/8000)/2 = .98046875 -> 98; big: 1 - (.75*.03125 + 1*.125)/2 -> 92
    state = ClusterState.empty((SMALL, BIG))
    assert DotProdPolicy().score(pod(num=1, milli=1000), state, ALL).tolist() == [98.0, 92.0]
    # a node without the CPU scores the minimum
    assert DotProdPolicy().score(pod(cpu=40000), state, ALL)[0] == 0.0


@pytest.mark.parametrize("used,new_pod,expected", [
    ((), pod(num=1, milli=460), [31, 25]),  # idle nodes: max(33 - free GPUs, free GPUs)
    ((("s", 1, 460, 0, (0,)),), pod(num=1, milli=460), [95, 25]),  # 540 left on a shared GPU: 100 - 54 // 10
    ((("w", 1, 1000, 0, (0,)),), pod(num=1, milli=460), [49, 25]),  # must open a free GPU on a used node
    ((("w", 1, 1000, 1, (0,)),), pod(num=2, milli=1000), [31, 48]),  # 50 - 2 free GPUs used
    ((), pod(), [0, 0]),  # CPU pods are not scored
])
def test_gpu_packing_bands(used, new_pod, expected):
    state = ClusterState.empty((SMALL, BIG))
    for name, num, milli, at, devs in used:
        state = bind(state, pod(name, 1000, num, milli), at, devs)
    assert GpuPackingPolicy().score(new_pod, state, ALL).tolist() == expected


def test_gpu_clustering_bands():
    nodes = tuple(node(f"n{i}", 96000, 8) for i in range(4))
    state = ClusterState.empty(nodes)
    share, whole = pod("s", num=1, milli=500), pod("w", num=1, milli=1000)
    state = bind(state, share, 0, (0,))
    state = bind(state, whole, 1, (0,))
    state = bind(state, pod("s2", num=1, milli=500), 3, (0,))
    state = bind(state, pod("w2", num=1, milli=1000), 3, (1,))
    policy = GpuClusteringPolicy()
    # n0 share only: 75 + 25*500//8000 = 76; n1 other tag: 0 + 25*1000//8000 = 3; n2 idle: 25; n3 mixed: 50 + 4
    assert policy.score(pod("new", num=1, milli=300), state, np.arange(4)).tolist() == [76, 3, 25, 54]
    assert policy.score(pod("cpu"), state, np.arange(4)).tolist() == [0, 0, 0, 0]
    state = bind(state, pod("w3", num=1, milli=1000), 0, (1,))  # the tag cache follows the new state
    assert policy.score(pod("new", num=1, milli=300), state, np.arange(4))[0] == 50 + 25 * 1500 // 8000
    assert [gpu_tag(p) for p in (share, whole, pod(num=4, milli=1000), pod())] == ["share-gpu", "1-gpu", "4-gpu", "no-gpu"]


def test_random_is_seeded_and_picks_a_fitting_device():
    state = ClusterState.empty(tuple(node(f"n{i}", 96000, 8) for i in range(20)))
    state = bind(state, pod("x", num=1, milli=800), 3, (2,))
    picks = [int(np.argmax(RandomPolicy(s).score(pod(), state, np.arange(20)))) for s in range(10)]
    assert picks == [int(np.argmax(RandomPolicy(s).score(pod(), state, np.arange(20)))) for s in range(10)]
    assert len(set(picks)) > 1
    devices = {RandomPolicy(s).choose_gpus(pod(num=1, milli=500), state, 3) for s in range(30)}
    assert (2,) not in devices and len(devices) > 1
    assert RandomPolicy(0).choose_gpus(pod(num=2, milli=1000), state, 3) == (0, 1)


ONE_SHARE = TargetWorkload(cpu_milli=np.array([1000]), gpu_milli=np.array([500]), num_gpu=np.array([1]),
                           gpu_spec=((),), prob=np.array([1.0]))


def test_fgd_by_hand():
    # target: only 0.5-GPU pods. Node a has GPUs with 1000 and 600 left, node b one GPU with 400 left
    # (useless to the target: all 400 is fragment). A 0.4-GPU pod on a's GPU 0 leaves 600+600 (frag 0,
    # score trunc(100 sigmoid(0)) = 50), on GPU 1 leaves 200 (frag 200: 100 sigmoid(-0.2) = 45.02);
    # on b it removes 400 of fragment: trunc(100 sigmoid(0.4)) = 59.
    state = ClusterState.empty((node("a", 32000, 2), node("b", 32000, 1)))
    state = bind(state, pod("x", 1000, 1, 400), 0, (1,))
    state = bind(state, pod("y", 1000, 1, 600), 1, (0,))
    policy = FgdPolicy(target=ONE_SHARE)
    new = pod("new", 1000, 1, 400)
    assert policy.score(new, state, ALL).tolist() == [50.0, math.trunc(100 / (1 + math.exp(-0.4)))]
    assert policy.choose_gpus(new, state, 0) == (0,)
    assert policy.choose_gpus(pod("w", 1000, 1, 1000), state, 0) == (0,)


def test_fgd_needs_a_workload():
    with pytest.raises(ValueError, match="observe_workload"):
        FgdPolicy().score(pod(num=1, milli=500), ClusterState.empty((SMALL,)), np.array([0]))
    policy = FgdPolicy()
    policy.observe_workload([pod(f"p{i}", 2000, 1, 500) for i in range(3)] + [pod("c", 1000)])
    assert policy.target.size == 2


def reference_fgd(cpu_left, left, shape, target):
    """The paper's FGD node score written out plainly, one node at a time."""
    def frag(cpu, devs):
        out = 0.0
        for k in range(target.size):
            milli, num = int(target.gpu_milli[k]), int(target.num_gpu[k])
            fits = sum(1 for d in devs if d >= milli) >= num
            if milli > 0 and fits and cpu >= target.cpu_milli[k]:
                out += target.prob[k] * sum(d for d in devs if d < milli)
            else:
                out += target.prob[k] * sum(devs)
        return out

    def score(before, after):
        return math.trunc(100 / (1 + math.exp(-(before - after) / 1000)))

    cpu, milli, num, _ = shape
    f0 = frag(cpu_left, left)
    if num == 1 and milli < 1000:
        options = [(score(f0, frag(cpu_left - cpu, [d - milli if j == i else d for j, d in enumerate(left)])), i)
                   for i, d in enumerate(left) if d >= milli]
        best = max(s for s, _ in options)
        return best, next(i for s, i in options if s == best)
    after, need = list(left), num
    for j in sorted(range(len(after)), key=lambda j: after[j]):
        if need and after[j] >= milli:
            after[j] -= milli
            need -= 1
    return score(f0, frag(cpu_left - cpu, after)), None


def test_fgd_matches_a_plain_reference_on_random_states():
    rng = np.random.default_rng(3)
    target = TargetWorkload(cpu_milli=np.array([4000, 8000, 2000, 12000]), gpu_milli=np.array([460, 1000, 0, 250]),
                            num_gpu=np.array([1, 2, 0, 1]), gpu_spec=((),) * 4, prob=np.array([0.4, 0.2, 0.3, 0.1]))
    nodes = tuple(node(f"n{i}", int(rng.choice([16000, 64000, 96000])), int(rng.choice([1, 2, 4, 8])))
                  for i in range(30))
    state = ClusterState.empty(nodes)
    for k in range(60):  # random partial usage
        i = int(rng.integers(30))
        free = state.gpu_free()[i]
        j = int(rng.integers(nodes[i].gpu_count))
        milli = int(rng.choice([100, 250, 460, 700]))
        if free[j] >= milli and state.cpu_cap[i] - state.cpu_used[i] >= 2000:
            state = bind(state, pod(f"u{k}", 2000, 1, milli), i, (j,))
    policy = FgdPolicy(target=target)
    for new in (pod("s", 3000, 1, 460), pod("t", 1000, 1, 250), pod("w", 6000, 1, 1000), pod("c", 5000)):
        idx = np.array([i for i in range(30) if state.cpu_cap[i] - state.cpu_used[i] >= new.cpu_milli
                        and (new.num_gpu == 0 or (state.gpu_free()[i] >= new.gpu_milli).any())])
        ours = policy.score(new, state, idx)
        for i, s in zip(idx, ours):
            left = [int(x) for x in state.gpu_free()[i][:nodes[i].gpu_count]]
            ref, dev = reference_fgd(int(state.cpu_cap[i] - state.cpu_used[i]), left, pod_shape(new), target)
            assert s == ref, (new.name, i, left)
            if dev is not None:
                assert policy.choose_gpus(new, state, int(i)) == (dev,)


def test_fgd_cache_follows_state_changes():
    target = TargetWorkload(cpu_milli=np.array([1000, 1000]), gpu_milli=np.array([500, 1000]), num_gpu=np.array([1, 1]),
                            gpu_spec=((), ()), prob=np.array([0.5, 0.5]))
    state = ClusterState.empty(tuple(node(f"n{i}", 32000, 2) for i in range(3)))
    warm = FgdPolicy(target=target)
    new = pod("s", 1000, 1, 300)
    warm.score(new, state, np.arange(3))
    state = bind(state, pod("x", 1000, 1, 600), 1, (0,))
    state = bind(state, pod("y", 1000, 1, 1000), 2, (1,))
    assert warm.score(new, state, np.arange(3)).tolist() == FgdPolicy(target=target).score(new, state, np.arange(3)).tolist()
    other = ClusterState.empty(tuple(node(f"m{i}", 8000, 1) for i in range(2)))  # another cluster resets it
    assert warm.score(new, other, np.arange(2)).tolist() == FgdPolicy(target=target).score(new, other, np.arange(2)).tolist()
