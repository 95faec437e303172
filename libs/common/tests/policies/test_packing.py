import numpy as np
import pytest

from agmarl_common.core.cluster.filters import violations
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, PodAffinityTerm, LabelSelector, Taint
from agmarl_common.core.policies.fgd import FgdPolicy
from agmarl_common.core.policies import joint
from agmarl_common.core.policies.joint import (SwitchPlacer, WholePlanning, multi_gpu_shapes, place_whole, plan_whole,
                                              pod_room, typical)
from agmarl_common.core.policies.packing import pack_group
from agmarl_common.core.sim.batches import BatchPlan, SequentialPlacer, apply_binds, place_in_order, run_batches


def pod(name, cpu=2000, num=0, milli=0, mem=1024, **kw):
    return Pod(name, cpu_milli=cpu, memory_mib=mem, num_gpu=num, gpu_milli=milli, **kw)


NODES = tuple(
    [Node(f"t{i}", cpu_milli=32000, memory_mib=65536, gpu_count=2, gpu_model="T4") for i in range(3)]
    + [Node(f"v{i}", cpu_milli=24000, memory_mib=131072, gpu_count=4, gpu_model="V100M16") for i in range(3)]
    + [Node("tainted", cpu_milli=64000, memory_mib=131072, gpu_count=8, gpu_model="G2",
            taints=(Taint("dedicated", "x"),))]
    + [Node("cpu", cpu_milli=16000, memory_mib=32768)])
SHAPES = (pod("a", 4000, 1, 500), pod("b", 8000, 1, 1000), pod("c", 2000), pod("d", 6000, 2, 1000),
          pod("e", 1000, 1, 250), pod("f", 2000, 1, 700), pod("g", 3000, 1, 810), pod("h", 6000, 4, 1000),
          pod("t4", 2000, 1, 1000, gpu_spec=("T4",)))


def random_group(rng, n, tag):
    return [Pod(f"{tag}{k}", **{f: getattr(s, f) for f in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli",
                                                             "gpu_spec")})
            for k, s in enumerate(SHAPES[int(j)] for j in rng.integers(0, len(SHAPES), n))]


def partly_used(seed):
    """The cluster after a random group placed by FGD, and a second random group."""
    rng = np.random.default_rng(seed)
    fgd = FgdPolicy(seed)
    fgd.observe_workload(SHAPES)
    state = ClusterState.empty(NODES)
    _, state = place_in_order(fgd, (first := random_group(rng, 6, "x")), range(len(first)), state, None)
    return state, random_group(rng, 6, "y"), fgd


@pytest.mark.parametrize("seed", range(8))
def test_a_group_that_fits_is_placed_whole_and_passes_the_hard_filter(seed):
    state, group, fgd = partly_used(seed)
    seq, _ = place_in_order(fgd, group, range(len(group)), state, None)
    if len(seq) < len(group):
        return  # this draw does not fit whole (the module asserts below that most draws do)
    packed = pack_group(group, state, open_cost=1.0, cpu_per_gpu=4000.0, short_cost=1e-3)
    assert packed is not None and sorted(k for k, _, _ in packed.binds) == list(range(len(group)))
    end = apply_binds(group, packed.binds, state)  # raises on a hard-filter or device violation
    assert violations(end) == []
    assert packed.milli == sum(p.gpu_milli_total for p in group)


@pytest.mark.parametrize("seed", range(4))
def test_the_knapsack_places_at_least_what_sequential_fgd_places_and_is_deterministic(seed):
    state, group, fgd = partly_used(seed)
    group = group + random_group(np.random.default_rng(100 + seed), 30, "z")  # overflows the cluster
    seq, _ = place_in_order(fgd, group, range(len(group)), state, None)
    first = pack_group(group, state, mandatory=[False] * len(group))
    second = pack_group(group, state, mandatory=[False] * len(group))
    assert first is not None and first == second
    assert first.milli >= sum(group[k].gpu_milli_total for k, _, _ in seq)
    assert violations(apply_binds(group, first.binds, state)) == []


def test_the_knapsack_finds_the_pair_that_fills_a_device():
    node = Node("n", cpu_milli=32000, memory_mib=65536, gpu_count=1, gpu_model="T4")
    group = [pod("big", 1000, 1, 600), pod("s1", 1000, 1, 500), pod("s2", 1000, 1, 500)]
    state = ClusterState.empty((node,))
    packed = pack_group(group, state, mandatory=[False] * 3)
    assert packed is not None and packed.milli == 1000 and {k for k, _, _ in packed.binds} == {1, 2}
    # with the 600 mandatory the best is the 600 alone
    packed = pack_group(group, state, mandatory=[True, False, False])
    assert packed.milli == 600 and [k for k, _, _ in packed.binds] == [0]


def test_cpu_and_whole_devices_bound_the_knapsack():
    node = Node("n", cpu_milli=10000, memory_mib=65536, gpu_count=2, gpu_model="T4")
    # two whole-GPU pods of 6,000 CPU each: only one fits the node's CPU; then a 300 share on the other device
    group = [pod("w1", 6000, 1, 1000), pod("w2", 6000, 1, 1000), pod("s", 3000, 1, 300)]
    packed = pack_group(group, ClusterState.empty((node,)), mandatory=[False] * 3)
    assert packed.milli == 1300 and len(packed.binds) == 2
    devices = [gpus for _, _, gpus in packed.binds]
    assert len({d for g in devices for d in g}) == 2  # the whole GPU and the share on different devices


def test_mandatory_pods_that_cannot_all_be_placed_and_unmodelled_pods_give_none():
    node = Node("n", cpu_milli=32000, memory_mib=65536, gpu_count=1, gpu_model="T4")
    state = ClusterState.empty((node,))
    assert pack_group([pod("a", 1000, 1, 600), pod("b", 1000, 1, 600)], state) is None
    anti = PodAffinityTerm(label_selector=LabelSelector(match_labels={"app": "x"}), topology_key="kubernetes.io/hostname")
    assert pack_group([pod("c", 1000, 1, 300, pod_anti_affinity=(anti,))], state, mandatory=[False]) is None


def test_the_knapsack_placer_places_every_pod_of_a_group_that_fits_and_chooses_in_one_that_overflows():
    one = Node("a", cpu_milli=32000, memory_mib=65536, gpu_count=1, gpu_model="T4")
    # group 1 fits (placed whole, as sequential FGD does); group 2 overflows: 600 first in arrival order
    plan = BatchPlan(nodes=(one, Node("b", cpu_milli=32000, memory_mib=65536, gpu_count=1, gpu_model="T4")),
                     groups=((pod("w", 1000, 1, 1000),),
                             (pod("big", 1000, 1, 600), pod("s1", 1000, 1, 500), pod("s2", 1000, 1, 500))),
                     rank=np.arange(2))
    workload = list(plan.pods)
    for seed in range(3):
        seq = run_batches(plan, SequentialPlacer(FgdPolicy(seed)), workload)
        placer = SwitchPlacer(FgdPolicy(seed), seed=seed, exact=True)
        r = run_batches(plan, placer, workload)
        again = run_batches(plan, SwitchPlacer(FgdPolicy(seed), seed=seed, exact=True), workload)
        assert placer.name == "knapsack:fgd" and placer.held_groups == 1
        assert r.placed_pods[1] == 1 and seq.used_milli[-1] == 1600 and r.used_milli[-1] == 2000
        assert np.array_equal(r.node_index, again.node_index) and violations(r.state) == []


@pytest.mark.parametrize("pack_fitting", [False, True])
def test_the_knapsack_placer_never_leaves_out_a_pod_while_the_group_fits(pack_fitting):
    # two groups that each fit whole (the second only if the first is packed sensibly): every pod placed
    nodes = tuple(Node(f"n{i}", cpu_milli=32000, memory_mib=65536, gpu_count=2, gpu_model="T4") for i in range(2))
    g1 = (pod("s1", 1000, 1, 810), pod("s2", 1000, 1, 470), pod("s3", 1000, 1, 470))
    g2 = (pod("w1", 1000, 1, 1000), pod("w2", 1000, 1, 1000))
    plan = BatchPlan(nodes=nodes, groups=(g1, g2), rank=np.arange(2))
    placer = SwitchPlacer(FgdPolicy(0), seed=0, exact=True, pack_fitting=pack_fitting)
    r = run_batches(plan, placer, list(plan.pods))
    assert r.placed_pods[1] == 3 and placer.held_groups == (0 if r.placed_pods[-1] == 5 else 1)
    assert violations(r.state) == []


def test_most_draws_of_the_fitting_test_fit():
    fits = 0
    for seed in range(8):
        state, group, fgd = partly_used(seed)
        fits += len(place_in_order(fgd, group, range(len(group)), state, None)[0]) == len(group)
    assert fits >= 5


def test_a_search_stopped_at_its_first_solution_still_places_every_mandatory_pod():
    node = Node("n", cpu_milli=32000, memory_mib=65536, gpu_count=2, gpu_model="T4")
    group = [pod("s0", 1000, 1, 300), pod("s1", 1000, 1, 700), pod("w", 1000, 1, 1000), pod("x", 1000, 1, 500)]
    state = ClusterState.empty((node,))
    packed = pack_group(group, state, mandatory=[True, True, True, False], max_sols=1)
    assert packed is not None and {0, 1, 2} <= {k for k, _, _ in packed.binds}
    assert violations(apply_binds(group, packed.binds, state)) == []


# --- the planned placement of a group that fits (policies.joint.place_whole, SwitchPlacer(fit=...)) ---

TWO_GPUS = Node("n", cpu_milli=32000, memory_mib=65536, gpu_count=2, gpu_model="T4")


def random_plan(seed, n_groups=4, size=5):
    rng = np.random.default_rng(seed)
    groups = tuple(tuple(random_group(rng, size, f"g{e}p")) for e in range(n_groups))
    return BatchPlan(nodes=NODES, groups=groups, rank=rng.permutation(len(NODES)))


def planned(seed, **kw):
    return SwitchPlacer(FgdPolicy(seed), seed=seed, exact=True, fit=WholePlanning(plans=2, evals=2, **kw))


@pytest.mark.parametrize("seed", range(6))
def test_the_planned_placer_places_every_pod_while_everything_fits_and_passes_the_hard_filter(seed):
    plan = random_plan(seed, n_groups=3, size=3)  # 9 pods on a cluster that takes them all: every group fits
    seq = run_batches(plan, SequentialPlacer(FgdPolicy(seed)), SHAPES)
    r = run_batches(plan, planned(seed), SHAPES)  # the harness re-checks every bind and raises on a violation
    assert seq.placed_pods[-1] == sum(len(g) for g in plan.groups)  # the premise: sequential FGD places them all
    assert r.placed_pods[-1] == seq.placed_pods[-1] and r.used_milli[-1] == seq.used_milli[-1]
    assert violations(r.state) == []


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kw", [{}, {"keep_room": False, "judge_all": True},
                                {"keep_room": False, "judge_all": True, "plan_all": True},
                                {"keep_room": False, "judge_all": True, "pod_floor": 2}])
def test_the_planned_placer_is_deterministic(seed, kw):
    plan = random_plan(seed, n_groups=6, size=8)  # later groups overflow: the knapsack runs as well
    first, second = run_batches(plan, planned(seed, **kw), SHAPES), run_batches(plan, planned(seed, **kw), SHAPES)
    assert np.array_equal(first.node_index, second.node_index)
    assert np.array_equal(first.used_milli, second.used_milli)


def test_plan_whole_places_the_group_where_the_imagined_pods_fit_beside_it():
    # two 300-milli shares on a 2-GPU node; the future is two 700-milli shares: only one share per device
    # lets both in
    state = ClusterState.empty((TWO_GPUS,))
    group = [pod("s0", 1000, 1, 300), pod("s1", 1000, 1, 300)]
    binds = plan_whole(group, [pod("f0", 1000, 1, 700), pod("f1", 1000, 1, 700)], state)
    assert binds is not None and sorted(k for k, _, _ in binds) == [0, 1]
    assert sorted(g for _, _, (g,) in binds) == [0, 1]


def test_place_whole_keeps_the_sequential_placement_unless_a_plan_leaves_more_room():
    state, rank = ClusterState.empty((TWO_GPUS,)), np.arange(1)
    group = [pod("s0", 1000, 1, 300), pod("s1", 1000, 1, 300)]
    pool = [pod(f"w{i}", 1000, 1, 700) for i in range(4)]
    fgd = FgdPolicy(0)
    fgd.observe_workload(pool + group)
    how = WholePlanning(plans=2, evals=2)
    stacked = [(0, 0, (0,)), (1, 0, (0,))]  # both shares on device 0: one 700 fits after, not two
    out = place_whole(fgd, group, state, rank, stacked, pool, typical(pool), np.random.default_rng(0), how)
    assert sorted(g for _, _, (g,) in out) == [0, 1]
    apart = [(0, 0, (0,)), (1, 0, (1,))]  # already as good as any plan: kept as it is
    assert place_whole(fgd, group, state, rank, apart, pool, typical(pool), np.random.default_rng(0), how) == apart


def test_a_plan_never_places_fewer_pods_than_the_sequential_placement():
    # the group fits; a plan that could not place it all would be dropped: whatever wins places both pods
    state, rank = ClusterState.empty((TWO_GPUS,)), np.arange(1)
    group = [pod("w", 1000, 1, 1000), pod("s", 1000, 1, 810)]
    fgd = FgdPolicy(0)
    fgd.observe_workload(group)
    seq, _ = place_in_order(fgd, group, range(2), state, rank)
    out = place_whole(fgd, group, state, rank, seq, list(group), typical(group), np.random.default_rng(1),
                      WholePlanning(plans=3, evals=2))
    assert sorted(k for k, _, _ in out) == [0, 1]
    assert violations(apply_binds(group, out, state)) == []


def test_planning_futures_from_the_whole_workload_cover_its_multi_gpu_pods():
    placer = planned(0, keep_room=False, judge_all=True, plan_all=True)
    run_batches(random_plan(0, n_groups=2, size=3), placer, SHAPES)
    assert {p.num_gpu for p in placer.plan_pool} == {0, 1, 2, 4}  # the modelled pods of SHAPES, multi-GPU too
    assert all((p.num_gpu, p.gpu_milli) in placer.shapes for p in placer.plan_pool)
    assert planned(0).plan_pool == ()  # off by default: the planning futures ask at most one GPU


def test_a_plan_leaving_no_node_for_a_multi_gpu_pod_that_fgds_placement_leaves_one_is_refused(monkeypatch):
    # two 2-GPU nodes, both whole: FGD's placement stacks the two 300-milli shares on one device (node m stays
    # whole); the plan puts one share on each node: the judges (700-milli shares) prefer it, but no node then
    # takes the 2-GPU pod (floor 1: one node did before the group)
    state, rank = ClusterState.empty((TWO_GPUS, Node("m", cpu_milli=32000, memory_mib=65536, gpu_count=2,
                                                     gpu_model="T4"))), np.arange(2)
    group = [pod("s0", 1000, 1, 300), pod("s1", 1000, 1, 300)]
    pool, big = [pod(f"w{i}", 1000, 1, 700) for i in range(4)], (pod("big", 8000, 2, 1000),)
    fgd = FgdPolicy(0)
    fgd.observe_workload(pool + group)
    stacked, spread = [(0, 0, (0,)), (1, 0, (0,))], [(0, 0, (0,)), (1, 1, (0,))]
    monkeypatch.setattr(joint, "plan_whole", lambda *a, **k: list(spread))
    assert pod_room(apply_binds(group, stacked, state), big) == (1,)
    assert pod_room(apply_binds(group, spread, state), big) == (0,)
    for floor, want in ((0, spread), (1, stacked), (2, stacked)):
        how = WholePlanning(plans=1, evals=2, keep_room=False, pod_floor=floor)
        out = place_whole(fgd, group, state, rank, stacked, pool, typical(pool), np.random.default_rng(0), how,
                          big=big)
        assert out == want


def test_multi_gpu_shapes_keeps_one_pod_per_multi_gpu_request():
    pods = [pod("a", 4000, 2, 1000), pod("b", 4000, 2, 1000), pod("c", 8000, 2, 1000), pod("d", 1000, 1, 500),
            pod("e", 6000, 4, 1000)]
    assert [p.name for p in multi_gpu_shapes(pods)] == ["a", "c", "e"]


def test_typical_keeps_the_most_common_pod_per_gpu_request():
    pool = [pod("a", 1000, 1, 500), pod("b", 2000, 1, 500), pod("c", 2000, 1, 500), pod("d", 4000, 1, 1000)]
    shapes = typical(pool)
    assert set(shapes) == {(1, 500), (1, 1000)}
    assert shapes[1, 500].name == "b" and shapes[1, 1000].name == "d"
