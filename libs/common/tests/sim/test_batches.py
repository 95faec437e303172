import numpy as np
import pytest

from agmarl_common.core.cluster.filters import violations
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, Taint, Toleration
from agmarl_common.core.policies.fgd import BestFitPolicy, FgdPolicy
from agmarl_common.core.policies.joint import (JointPlacer, ScenarioPlacer, SwitchPlacer, candidate_orders, commit,
                                              fits_whole, imagine, largest_first)
from agmarl_common.core.sim.batches import (SequentialPlacer, apply_binds, place_in_order, plan_batches, run_batches,
                                       split_groups, sub_cluster)


def pod(name, cpu=2000, num=0, milli=0, mem=1024, **kw):
    return Pod(name, cpu_milli=cpu, memory_mib=mem, num_gpu=num, gpu_milli=milli, **kw)


WORKLOAD = (pod("a", 4000, 1, 500), pod("b", 8000, 1, 1000), pod("c", 2000), pod("d", 16000, 2, 1000),
            pod("e", 1000, 1, 250), pod("f", 2000, 1, 700), pod("g", 3000, 1, 300), pod("h", 6000, 4, 1000),
            pod("t4", 2000, 1, 1000, gpu_spec=("T4",)))
NODES = tuple(
    [Node(f"t{i}", cpu_milli=32000, memory_mib=65536, gpu_count=2, gpu_model="T4") for i in range(4)]
    + [Node(f"v{i}", cpu_milli=64000, memory_mib=131072, gpu_count=4, gpu_model="V100M16") for i in range(4)]
    + [Node("tainted", cpu_milli=64000, memory_mib=131072, gpu_count=8, gpu_model="G2",
            taints=(Taint("dedicated", "x"),))]
    + [Node(f"c{i}", cpu_milli=16000, memory_mib=32768) for i in range(2)])


def test_split_groups_cuts_consecutive_groups_within_the_bounds():
    pods = [pod(f"p{i}") for i in range(500)]
    groups = split_groups(pods, np.random.default_rng(3), 16, 128)
    assert [p for g in groups for p in g] == pods
    assert all(16 <= len(g) <= 128 for g in groups[:-1]) and 1 <= len(groups[-1]) <= 128
    with pytest.raises(ValueError):
        split_groups(pods, np.random.default_rng(0), 10, 5)


def test_sub_cluster_draws_distinct_nodes_in_file_order():
    sub = sub_cluster(NODES, 5, np.random.default_rng(1))
    names = [n.name for n in sub]
    assert len(set(names)) == 5 and names == [n.name for n in NODES if n.name in names]
    with pytest.raises(ValueError):
        sub_cluster(NODES, len(NODES) + 1, np.random.default_rng(1))


def test_the_protocol_is_deterministic_for_a_seed():
    def run(seed, placer):
        plan = plan_batches(NODES, WORKLOAD, np.random.default_rng(seed), n_nodes=9, min_size=4, max_size=12)
        return plan, run_batches(plan, placer, WORKLOAD)

    for make in (lambda: SequentialPlacer(FgdPolicy(0)), lambda: JointPlacer(FgdPolicy(0), seed=7, lookahead=8),
                 lambda: ScenarioPlacer(FgdPolicy(0), seed=7, plans=2, evals=2),
                 lambda: SwitchPlacer(FgdPolicy(0), seed=7, plans=2, evals=2, lookahead=8)):
        (p1, r1), (p2, r2) = run(5, make()), run(5, make())
        assert p1.nodes == p2.nodes and p1.groups == p2.groups and (p1.rank == p2.rank).all()
        assert (r1.node_index == r2.node_index).all() and (r1.used_milli == r2.used_milli).all()
        assert (r1.frag_milli == r2.frag_milli).all() and r1.allocation == r2.allocation
    other, _ = run(6, SequentialPlacer(FgdPolicy(0)))
    assert other.groups != p1.groups


def test_run_records_per_group_arrivals_and_allocation():
    plan = plan_batches(NODES, WORKLOAD, np.random.default_rng(2), n_nodes=9, min_size=4, max_size=12)
    r = run_batches(plan, SequentialPlacer(FgdPolicy(0)), WORKLOAD)
    g = len(plan.groups)
    assert r.arrived_milli.shape == r.used_milli.shape == r.placed_pods.shape == (g + 1,)
    assert r.arrived_milli[-1] == sum(p.gpu_milli_total for p in plan.pods)
    assert (np.diff(r.used_milli) >= 0).all() and (r.used_milli <= r.arrived_milli).all()
    assert r.used_milli[-1] == int(r.state.gpu_used.sum()) and r.placed_pods[-1] == (r.node_index >= 0).sum()
    assert r.allocation == pytest.approx(100 * r.used_milli[-1] / plan.total_gpu_milli)


@pytest.mark.parametrize("seed", range(6))
def test_the_joint_placer_never_violates_the_hard_filter(seed):
    rng = np.random.default_rng(seed)
    workload = WORKLOAD + (pod("tol", 1000, 1, 400, tolerations=(Toleration("dedicated", "Equal", "x"),)),
                           pod("sel", 1000, 1, 600, node_selector={"kubernetes.io/hostname": "v1"}))
    plan = plan_batches(NODES, workload, rng, n_nodes=len(NODES), ratio=2.0, min_size=8, max_size=40)
    for placer in (JointPlacer(FgdPolicy(seed), seed=seed, lookahead=8, helpers=[BestFitPolicy(seed)]),
                   ScenarioPlacer(FgdPolicy(seed), seed=seed, plans=2, evals=2), SequentialPlacer(FgdPolicy(seed)),
                   SwitchPlacer(FgdPolicy(seed), seed=seed, plans=2, evals=2, lookahead=8),
                   SwitchPlacer(FgdPolicy(seed), seed=seed, plans=2, evals=2, lookahead=8, hold_factor=0.5)):
        r = run_batches(plan, placer, workload)  # apply_binds re-runs the hard filter before every bind
        assert violations(r.state) == []
        if isinstance(placer, SwitchPlacer):
            assert placer.held_groups > 0  # at 2 x capacity some group overflows: the choosing path ran
        for i, pods in enumerate(r.state.bound):
            for p in pods:
                assert not NODES[i].taints or p.tolerations
                assert not p.gpu_spec or NODES[i].gpu_model in p.gpu_spec
                assert not p.node_selector or NODES[i].name == "v1"


def test_apply_binds_refuses_a_bind_that_fails_the_hard_filter_or_the_devices():
    state = ClusterState.empty(NODES[:1])  # t0: 32 cores, 2 T4
    group = [pod("x", 30000, 1, 1000), pod("y", 4000, 1, 1000), pod("z", 1000, 1, 600)]
    with pytest.raises(RuntimeError, match="hard filter"):
        apply_binds(group, [(0, 0, (0,)), (1, 0, (1,))], state)  # cpu 34 > 32 cores
    with pytest.raises(RuntimeError, match="devices"):
        apply_binds(group, [(1, 0, (0,)), (2, 0, (0,))], state)  # a share on a whole-taken device
    with pytest.raises(RuntimeError, match="twice"):
        apply_binds(group, [(2, 0, (0,)), (2, 0, (1,))], state)


def test_the_joint_placer_places_at_least_what_arrival_order_places_in_a_group():
    group = [pod("s1", 1000, 1, 300), pod("s2", 1000, 1, 300), pod("w1", 1000, 1, 1000), pod("w2", 1000, 1, 1000),
             pod("s3", 1000, 1, 700), pod("s4", 1000, 1, 700)]
    nodes = (Node("n0", cpu_milli=32000, memory_mib=65536, gpu_count=2, gpu_model="T4"),
             Node("n1", cpu_milli=32000, memory_mib=65536, gpu_count=1, gpu_model="T4"))
    state = ClusterState.empty(nodes)
    rank = np.arange(2)
    fgd = FgdPolicy(0)
    fgd.observe_workload(group)
    seq, _ = place_in_order(fgd, group, range(len(group)), state, rank)
    joint = JointPlacer(FgdPolicy(0), seed=0, lookahead=0)
    joint.observe_workload(group)
    binds = joint.place_group(group, state, rank)
    apply_binds(group, binds, state)
    milli = lambda bs: sum(group[k].gpu_milli_total for k, _, _ in bs)  # noqa: E731
    assert milli(binds) >= milli(seq)
    assert milli(binds) == 3000  # 300 + 700 twice and a whole GPU (or the like): every device full


def test_candidate_orders_start_with_arrival_and_largest_first():
    group = [pod("s", 1000, 1, 300), pod("w", 1000, 2, 1000), pod("c", 8000)]
    orders = candidate_orders(group, ClusterState.empty(NODES), np.random.default_rng(0), 6)
    assert orders[0] == [0, 1, 2] and orders[1] == largest_first(group) == [1, 0, 2]
    assert len({tuple(o) for o in orders}) == len(orders) <= 6


def one_gpu_t4(name):
    return Node(name, cpu_milli=32000, memory_mib=65536, gpu_count=1, gpu_model="T4")


@pytest.mark.parametrize("seed", range(4))
def test_the_scenario_placer_beats_sequential_fgd_where_arrival_order_is_provably_bad(seed):
    from agmarl_common.core.sim.batches import BatchPlan

    two_gpus = Node("n", cpu_milli=32000, memory_mib=65536, gpu_count=2, gpu_model="T4")
    # within a group: a 500-milli share arrives before a 2-GPU pod on one 2-GPU node. In arrival order the
    # share takes a device and the 2-GPU pod no longer fits: 500 milli; the other way round: 2,000.
    # across groups: an 810-milli share, then a whole-GPU pod, on one 1-GPU node. Placing the share (what
    # every placer that places whatever fits does) strands 190 milli and the whole GPU finds no room: 810;
    # leaving it out, for pods like the workload's (mostly whole GPUs), gives 1,000.
    cases = [((two_gpus,), ((pod("s", 1000, 1, 500), pod("w", 2000, 2, 1000)),), None, 500, 2000),
             ((one_gpu_t4("a"),), ((pod("s", 1000, 1, 810),), (pod("w", 1000, 1, 1000),)),
              [pod("s", 1000, 1, 810)] + [pod(f"w{i}", 1000, 1, 1000) for i in range(3)], 810, 1000)]
    for nodes, groups, workload, seq_milli, best in cases:
        plan = BatchPlan(nodes=nodes, groups=groups, rank=np.arange(len(nodes)))
        workload = workload or [p for g in groups for p in g]
        seq = run_batches(plan, SequentialPlacer(FgdPolicy(seed)), workload)
        scen = run_batches(plan, ScenarioPlacer(FgdPolicy(seed), seed=seed), workload)
        assert seq.used_milli[-1] == seq_milli
        assert scen.used_milli[-1] == best >= seq.used_milli[-1]
        assert violations(scen.state) == []


def test_the_scenario_placer_packs_a_group_as_well_as_arrival_order_or_better():
    group = [pod("s1", 1000, 1, 300), pod("s2", 1000, 1, 300), pod("w1", 1000, 1, 1000), pod("w2", 1000, 1, 1000),
             pod("s3", 1000, 1, 700), pod("s4", 1000, 1, 700)]
    nodes = (Node("n0", cpu_milli=32000, memory_mib=65536, gpu_count=2, gpu_model="T4"), one_gpu_t4("n1"))
    state, rank = ClusterState.empty(nodes), np.arange(2)
    fgd = FgdPolicy(0)
    fgd.observe_workload(group)
    seq, _ = place_in_order(fgd, group, range(len(group)), state, rank)
    for seed in range(3):
        placer = ScenarioPlacer(FgdPolicy(0), seed=seed)
        placer.observe_workload(group)
        binds = placer.place_group(group, state, rank)
        apply_binds(group, binds, state)  # raises on a hard-filter or device violation
        milli = lambda bs: sum(group[k].gpu_milli_total for k, _, _ in bs)  # noqa: E731
        assert milli(binds) >= milli(seq) and milli(binds) == 3000  # every device full


def test_an_unbriefed_scenario_placer_places_what_fits():
    group = [pod("s", 1000, 1, 810), pod("w", 1000, 1, 1000)]
    placer = ScenarioPlacer(BestFitPolicy(0), seed=0)  # no workload: no imagined futures, nothing held back
    binds = placer.place_group(group, ClusterState.empty((one_gpu_t4("a"), one_gpu_t4("b"))), np.arange(2))
    assert sorted(k for k, _, _ in binds) == [0, 1]


def test_commit_leaves_out_binds_that_no_longer_hold():
    state = ClusterState.empty((one_gpu_t4("a"),))
    group = [pod("x", 30000, 1, 300), pod("y", 4000, 1, 300), pod("z", 1000, 1, 600)]
    kept, end = commit(group, [(0, 0, (0,)), (1, 0, (0,)), (2, 0, (0,))], state)  # y: 34 > 32 cores
    assert kept == [(0, 0, (0,)), (2, 0, (0,))] and int(end.gpu_used[0, 0]) == 900


def test_imagine_draws_until_the_requested_gpu_milli():
    pool = [pod("s", 1000, 1, 300), pod("w", 1000, 1, 1000), pod("c", 1000)]
    drawn = imagine(pool, 5000, np.random.default_rng(0))
    total = sum(p.gpu_milli_total for p in drawn)
    assert 5000 <= total < 6000 and all(p in pool for p in drawn)
    assert imagine([pod("c", 1000)], 5000, np.random.default_rng(0)) == []
    assert imagine(pool, 0, np.random.default_rng(0)) == []


def test_the_switch_keeps_every_pod_while_everything_pending_fits():
    from agmarl_common.core.sim.batches import BatchPlan

    # an 810-milli share, then a whole-GPU pod, on two 1-GPU nodes, for a workload of mostly whole GPUs: the
    # scenario placer holds the share back for the whole GPUs it imagines (one pod dropped); each group fits
    # whole, so the switch places both
    plan = BatchPlan(nodes=(one_gpu_t4("a"), one_gpu_t4("b")),
                     groups=((pod("s", 1000, 1, 810),), (pod("w", 1000, 1, 1000),)), rank=np.arange(2))
    workload = [pod("s", 1000, 1, 810)] + [pod(f"w{i}", 1000, 1, 1000) for i in range(3)]
    for seed in range(3):
        scen = run_batches(plan, ScenarioPlacer(FgdPolicy(seed), seed=seed), workload)
        switch = SwitchPlacer(FgdPolicy(seed), seed=seed)
        r = run_batches(plan, switch, workload)
        assert scen.placed_pods[-1] == 1  # the behaviour the switch exists to stop
        assert r.placed_pods[-1] == 2 and r.used_milli[-1] == 1810 and switch.held_groups == 0


@pytest.mark.parametrize("seed", range(3))
def test_the_switch_beats_sequential_fgd_where_a_group_overflows_in_a_bad_order(seed):
    from agmarl_common.core.sim.batches import BatchPlan

    two_gpus = Node("n", cpu_milli=32000, memory_mib=65536, gpu_count=2, gpu_model="T4")
    # a 500-milli share before a 2-GPU pod on one 2-GPU node: in arrival order 500 milli, the other way 2,000;
    # an 810-milli share before a whole GPU on one 1-GPU node: 810 in arrival order, 1,000 the other way
    cases = [(two_gpus, (pod("s", 1000, 1, 500), pod("w", 2000, 2, 1000)), 500, 2000),
             (one_gpu_t4("a"), (pod("s", 1000, 1, 810), pod("w", 1000, 1, 1000)), 810, 1000)]
    for node, group, seq_milli, best in cases:
        plan = BatchPlan(nodes=(node,), groups=(group,), rank=np.arange(1))
        seq = run_batches(plan, SequentialPlacer(FgdPolicy(seed)), list(group))
        switch = SwitchPlacer(FgdPolicy(seed), seed=seed)
        r = run_batches(plan, switch, list(group))
        assert seq.used_milli[-1] == seq_milli and r.used_milli[-1] == best and switch.held_groups == 1
        assert violations(r.state) == []


def test_fits_whole_tells_whether_the_sequential_placement_places_every_pod():
    state, rank = ClusterState.empty((one_gpu_t4("a"),)), np.arange(1)
    fgd = FgdPolicy(0)
    fgd.observe_workload([pod("s", 1000, 1, 300), pod("w", 1000, 1, 1000)])
    assert fits_whole(fgd, [pod("s", 1000, 1, 300), pod("t", 1000, 1, 700)], state, rank)
    assert not fits_whole(fgd, [pod("s", 1000, 1, 300), pod("w", 1000, 1, 1000)], state, rank)
