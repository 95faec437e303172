import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod
from agmarl_common.core.policies.fgd import BestFitPolicy, FgdPolicy, GpuPackingPolicy
from agmarl_common.core.policies.joint import JointPlacer
from agmarl_common.core.sim.batches import BatchPlan, SequentialPlacer, run_batches

pytest.importorskip("highspy")
from agmarl_common.core.sim.optimum import device_ceiling, max_gpu_packing  # noqa: E402 - needs highspy (dev)


def pod(name, cpu=1000, num=1, milli=1000, mem=1024, **kw):
    return Pod(name, cpu_milli=cpu, memory_mib=mem, num_gpu=num, gpu_milli=milli, **kw)


def t4(name, gpus=1, cpu=32000):
    return Node(name, cpu_milli=cpu, memory_mib=65536, gpu_count=gpus, gpu_model="T4")


# two one-GPU nodes; the two small shares arrive first and greedy placers pack them together, so one 700
# share finds no room: 1,300 milli. The optimum pairs 300 + 700 on each device: 2,000.
NODES = (t4("a"), t4("b"))
GROUPS = ((pod("s1", milli=300), pod("s2", milli=300)), (pod("l1", milli=700), pod("l2", milli=700)))


def test_the_optimum_is_at_least_every_heuristic_on_a_tiny_instance():
    plan = BatchPlan(nodes=NODES, groups=GROUPS, rank=np.arange(2))
    workload = [p for g in GROUPS for p in g]
    opt = max_gpu_packing(NODES, plan.pods, time_limit_s=10)
    assert opt.optimal and opt.value_milli == opt.bound_milli == 2000 and opt.pods_placed == 4
    placers = [SequentialPlacer(FgdPolicy(0)), SequentialPlacer(BestFitPolicy(0)),
               SequentialPlacer(GpuPackingPolicy(0)),
               JointPlacer(FgdPolicy(0), seed=0, lookahead=4)]
    for placer in placers:
        assert run_batches(plan, placer, workload).used_milli[-1] <= opt.value_milli


@pytest.mark.parametrize("nodes, pods, best", [
    # whole GPUs take whole devices: a 2-GPU pod and a share cannot share a 2-GPU node
    ((t4("a", 2),), [pod("w", num=2), pod("s", milli=500)], 2000),
    # cpu binds: the 2-GPU pod needs 20 cores, the node has 16; two 1-GPU pods fit
    ((t4("a", 2, cpu=16000),), [pod("w", cpu=20000, num=2), pod("x", cpu=8000), pod("y", cpu=8000)], 2000),
    # GPU model: a V100-only pod cannot use a T4
    ((t4("a", 1),), [pod("v", gpu_spec=("V100M16",)), pod("s", milli=400)], 400),
    # shares on one device sum to at most 1000
    ((t4("a", 1),), [pod("s1", milli=600), pod("s2", milli=600), pod("s3", milli=300)], 900),
    # CPU-only pods add nothing and are left out
    ((t4("a", 1),), [pod("c", num=0, milli=0), pod("s", milli=250)], 250),
])
def test_the_model_is_exact_on_literal_cases(nodes, pods, best):
    opt = max_gpu_packing(nodes, pods, time_limit_s=10)
    assert opt.optimal and opt.value_milli == best


def test_a_start_is_kept_as_the_first_incumbent():
    plan = BatchPlan(nodes=NODES, groups=GROUPS, rank=np.arange(2))
    r = run_batches(plan, SequentialPlacer(FgdPolicy(0)), [p for g in GROUPS for p in g])
    opt = max_gpu_packing(NODES, plan.pods, time_limit_s=10, start=r.state)
    assert opt.value_milli >= r.used_milli[-1] and opt.value_milli == 2000
    assert max_gpu_packing(NODES, [], time_limit_s=1).value_milli == 0
    assert ClusterState.empty(NODES).n_nodes == 2


@pytest.mark.parametrize("devices, pods, must, best", [
    # 700 + 300 twice fills both devices; a greedy pairing of the two 300s would strand a 700
    (2, [pod("s1", milli=300), pod("s2", milli=300), pod("l1", milli=700), pod("l2", milli=700)], 0, 2000),
    (1, [pod("s1", milli=300), pod("s2", milli=300), pod("l1", milli=700), pod("l2", milli=700)], 0, 1000),
    # free to drop the 810, the 600 + 400 fill the device; made to place it, nothing else fits beside it
    (1, [pod("a", milli=810), pod("b", milli=600), pod("c", milli=400)], 0, 1000),
    (1, [pod("a", milli=810), pod("b", milli=600), pod("c", milli=400)], 1, 810),
    # a 2-GPU pod takes two devices; the share beside it has none left
    (2, [pod("w", num=2), pod("s", milli=500)], 0, 2000),
    (2, [pod("s", milli=500), pod("w", num=2)], 1, 1500),  # relaxed: the whole pod takes one device of its two
    # shares of any granularity (gcd 1 milli) and CPU-only pods, which add nothing
    (1, [pod("a", milli=333), pod("b", milli=334), pod("c", milli=333), pod("z", num=0, milli=0)], 0, 1000),
])
def test_the_device_ceiling_is_exact_bin_packing_on_literal_cases(devices, pods, must, best):
    c = device_ceiling(pods, devices, must_place=must, time_limit_s=10)
    assert c.optimal and c.value_milli == c.bound_milli == best


def test_the_device_ceiling_refuses_what_cannot_all_be_placed():
    c = device_ceiling([pod("a", milli=810), pod("b", milli=810)], 1, must_place=2, time_limit_s=10)
    assert not c.optimal and c.value_milli == 0 and c.status == "Infeasible"


def test_the_device_ceiling_is_above_the_exact_optimum_and_every_placer():
    """With CPU, memory, models and nodes left out it can only be higher than max_gpu_packing's optimum,
    which is above what a placer reaches; on openb shapes and mixed nodes it must stay above both."""
    rng = np.random.default_rng(7)
    milli = [1000, 1000, 810, 650, 470, 460, 320, 230, 160]
    for trial in range(4):
        nodes = tuple(t4(f"n{i}", gpus=int(rng.choice([1, 2, 4])), cpu=int(rng.choice([8000, 32000])))
                      for i in range(5))
        pods = [pod(f"p{trial}-{k}", cpu=int(rng.choice([1000, 4000, 12000])), milli=int(m),
                    num=2 if m == 1000 and rng.random() < 0.3 else 1)
                for k, m in enumerate(rng.choice(milli, size=14))]
        devices = sum(nd.gpu_count for nd in nodes)
        opt = max_gpu_packing(nodes, pods, time_limit_s=10)
        ceiling = device_ceiling(pods, devices, time_limit_s=10)
        assert opt.optimal and ceiling.optimal
        assert ceiling.value_milli >= opt.value_milli
        plan = BatchPlan(nodes=nodes, groups=tuple((p,) for p in pods), rank=np.arange(len(nodes)))
        placed = run_batches(plan, SequentialPlacer(FgdPolicy(0)), pods).used_milli[-1]
        # FGD drops only what no node takes, so it places the first pod: the ceiling made to place it too
        assert device_ceiling(pods, devices, must_place=1, time_limit_s=10).value_milli >= placed
