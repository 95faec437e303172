"""kube-scheduler scorers against hand-computed values on tiny clusters (Go integer semantics)."""

from __future__ import annotations

import numpy as np
import pytest

from agmarl_common.core.cluster.model import (
    HOSTNAME_LABEL,
    ZONE_LABEL,
    ClusterState,
    LabelRequirement,
    LabelSelector,
    Node,
    NodeSelectorTerm,
    Pod,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    Taint,
    Toleration,
    TopologySpreadConstraint,
    WeightedPodAffinityTerm,
    bind,
)
from agmarl_common.core.policies.base import Policy, select_node
from agmarl_common.core.policies.kube import (
    KubeDefaultPolicy,
    KubeResourcesPolicy,
    MostAllocatedPolicy,
    RequestedToCapacityRatioPolicy,
)
from agmarl_common.core.scoring.kube_affinity import (
    score_inter_pod_affinity,
    score_node_affinity,
    score_pod_topology_spread,
    score_taint_toleration,
)
from agmarl_common.core.scoring.kube_resources import (
    WITH_GPU,
    balance_score,
    broken_linear,
    default_normalize,
    score_balanced_allocation,
    score_least_allocated,
    score_most_allocated,
    score_requested_to_capacity_ratio,
)
from agmarl_common.core.policies.registry import get_policy, policy_names, register_policy


def pod(name="p", cpu=1000, mem=2000, **kw) -> Pod:
    return Pod(name=name, cpu_milli=cpu, memory_mib=mem, **kw)


def state_a() -> ClusterState:
    """n0: 4000m / 8000Mi with a 1000m/2000Mi pod bound; n1: 8000m / 4000Mi, empty."""
    s = ClusterState.empty([Node("n0", 4000, 8000), Node("n1", 8000, 4000)])
    return bind(s, pod("a"), 0)


ALL2 = np.array([0, 1])


@pytest.mark.parametrize("scorer, expected", [
    # n0: cpu (4000-2000)*100/4000 = 50, mem (8000-4000)*100/8000 = 50 -> 50
    # n1: cpu 7000*100/8000 = 87, mem 2000*100/4000 = 50 -> 137 // 2 = 68
    (score_least_allocated, [50, 68]),
    # n0: 50, 50 -> 50; n1: 1000*100/8000 = 12, 50 -> 31
    (score_most_allocated, [50, 31]),
    # packing shape: utilisation == score; n0 50/50 -> 50; n1 12/50 -> round(31.0) = 31
    (score_requested_to_capacity_ratio, [50, 31]),
    # v1.36, the change the pod makes: 50 + (50 + with - without) // 2
    # n0: without 0.25/0.25 -> 100, with 0.5/0.5 -> 100 -> 75
    # n1: without 0/0 -> 100, with 0.125/0.5 -> std 0.1875 -> 81 -> 50 + 31 // 2 = 65
    (score_balanced_allocation, [75, 65]),
])
def test_resource_scorers(scorer, expected):
    assert scorer(pod(), state_a(), ALL2).tolist() == expected


def test_candidates_subset_and_order():
    assert score_least_allocated(pod(), state_a(), np.array([1])).tolist() == [68]
    assert score_least_allocated(pod(), state_a(), np.array([1, 0])).tolist() == [68, 50]


def test_least_allocated_non_zero_defaults():
    # an existing and an incoming pod without requests count as 100m / 200Mi each
    s = bind(ClusterState.empty([Node("n", 1000, 1000)]), pod("z", cpu=0, mem=0), 0)
    # cpu (1000-200)*100/1000 = 80, mem (1000-400)*100/1000 = 60 -> 70
    assert score_least_allocated(pod(cpu=0, mem=0), s, np.array([0])).tolist() == [70]
    # most allocated: 20, 40 -> 30
    assert score_most_allocated(pod(cpu=0, mem=0), s, np.array([0])).tolist() == [30]


def test_least_allocated_over_capacity_scores_zero_most_allocated_clamps():
    s = ClusterState.empty([Node("n", 1000, 1000)])
    p = pod(cpu=1500, mem=500)
    assert score_least_allocated(p, s, np.array([0])).tolist() == [25]  # cpu 0, mem 50
    assert score_most_allocated(p, s, np.array([0])).tolist() == [75]  # cpu 100, mem 50


def test_rtcr_ignores_resources_scoring_zero():
    # cpu utilisation 100*100/200000 = 0 -> score 0 -> left out of the mean: round(50 / 1) = 50, not 25
    s = ClusterState.empty([Node("n", 200000, 4000)])
    assert score_requested_to_capacity_ratio(pod(cpu=0, mem=2000), s, np.array([0])).tolist() == [50]


@pytest.mark.parametrize("shape, utils, expected", [
    (((0, 0), (100, 100)), [0, 37, 100], [0, 37, 100]),
    (((0, 100), (100, 0)), [0, 37, 100], [100, 63, 0]),  # 100 + (-100*37)/100 truncates toward zero
    (((20, 0), (60, 90), (100, 100)), [10, 20, 40, 61, 100], [0, 0, 45, 90, 100]),  # 90 + 10*1/40 = 90
])
def test_broken_linear(shape, utils, expected):
    assert broken_linear(shape, np.array(utils)).tolist() == expected


def test_rtcr_spreading_shape():
    s = state_a()
    # shape (0,10),(100,0): n0 util 50/50 -> 50/50 -> 50; n1 util 12/50 -> 88/50 -> round(69.0) = 69
    got = score_requested_to_capacity_ratio(pod(), s, ALL2, shape=((0, 10), (100, 0)))
    assert got.tolist() == [50, 69]
    assert RequestedToCapacityRatioPolicy().score(pod(), s, ALL2).tolist() == [50, 31]


def test_balanced_allocation_three_resources_and_best_effort():
    s = ClusterState.empty([Node("g", 8000, 4000, gpu_count=2)])
    s = bind(s, pod("a", cpu=0, mem=0, num_gpu=1, gpu_milli=1000), 0, (0,))
    p = pod(cpu=1000, mem=2000, num_gpu=1, gpu_milli=1000)
    # with: fractions 0.125, 0.5, 1.0: mean 0.5417, population std 0.35843 -> 64.16 -> 64
    # without: 0, 0, 0.5: mean 1/6, std 0.2357 -> 76.4 -> 76; 50 + (50 + 64 - 76) // 2 = 69
    assert score_balanced_allocation(p, s, np.array([0]), WITH_GPU).tolist() == [69]
    # a pod without GPUs skips the GPU resource: two resources, with 81, without 100 -> 65
    assert score_balanced_allocation(pod(), s, np.array([0]), WITH_GPU).tolist() == [65]
    assert score_balanced_allocation(pod(cpu=0, mem=0), s, np.array([0])).tolist() == [0]


@pytest.mark.parametrize("fractions, present, expected", [
    ([[0.5], [0.5]], [[True], [True]], [100]),
    ([[0.125], [0.5]], [[True], [True]], [81]),  # |0.125 - 0.5| / 2 = 0.1875 -> 81.25, truncated
    ([[1.0], [0.0]], [[True], [True]], [50]),  # the worst two-resource balance
    ([[0.9], [0.0]], [[True], [False]], [100]),  # one resource present: std 0
    ([[0.125], [0.5], [1.0]], [[True], [True], [True]], [64]),  # population std 0.35843
])
def test_balance_score(fractions, present, expected):
    assert balance_score(np.array(fractions), np.array(present)).tolist() == expected


def test_balance_score_two_present_resources_equal_the_general_form():
    """Two resources present everywhere take a shorter path: the same integers as the general form (the
    spread of the present values), for one pod and many, with ties, caps at 1 and tiny differences."""
    rng = np.random.default_rng(7)
    f = np.minimum(rng.integers(0, 4000, size=(3, 2, 500)) / rng.integers(1, 4000, size=(3, 2, 500)), 1.0)
    f[0, 1, :50] = f[0, 0, :50]  # ties
    f[1, 1, :50] = np.nextafter(f[1, 0, :50], 2.0)
    every = np.ones(f.shape, bool)
    almost = every.copy()
    almost[..., 0] = False  # one node without a resource: the general form for all of them
    general = balance_score(f, almost)
    assert (balance_score(f, every)[..., 1:] == general[..., 1:]).all()
    assert (balance_score(f[0], every[0])[1:] == general[0, 1:]).all()
    spread = f.max(axis=-2) - f.min(axis=-2)
    assert (balance_score(f, every) == np.trunc((1.0 - np.abs(spread) / 2) * 100).astype(np.int64)).all()


@pytest.mark.parametrize("bound, incoming, expected", [
    # node 1000m / 1000Mi; (bound cpu, mem), (incoming cpu, mem) -> 50 + (50 + with - without) // 2
    ((0, 0), (500, 500), 75),  # balanced before and after: no change
    ((0, 1000), (1000, 0), 100),  # perfectly imbalanced (50) -> perfectly balanced (100)
    ((0, 0), (1000, 0), 50),  # perfectly balanced (100) -> perfectly imbalanced (50)
    ((0, 400), (200, 0), 80),  # without 0/0.4 -> 80, with 0.2/0.4 -> 90: 50 + 60 // 2
    ((0, 400), (0, 200), 70),  # without 80, with 0/0.6 -> 70: 50 + 40 // 2
    ((300, 0), (0, 100), 77),  # without 0.3/0 -> 85, with 0.3/0.1 -> 90: 50 + 55 // 2 (int division)
    ((2000, 0), (0, 500), 87),  # over-committed cpu caps at 1: without 1/0 -> 50, with 1/0.5 -> 75
])
def test_balanced_allocation_change_made_by_the_pod(bound, incoming, expected):
    s = bind(ClusterState.empty([Node("n", 1000, 1000)]), pod("a", cpu=bound[0], mem=bound[1]), 0)
    assert score_balanced_allocation(pod(cpu=incoming[0], mem=incoming[1]), s, np.array([0])).tolist() == [expected]


def test_least_allocated_with_gpu_resource():
    s = ClusterState.empty([Node("g", 8000, 4000, gpu_count=2)])
    p = pod(cpu=1000, mem=2000, num_gpu=1, gpu_milli=500)
    # cpu 87, mem 50, gpu (2000-500)*100/2000 = 75 -> 212 // 3 = 70
    assert score_least_allocated(p, s, np.array([0]), WITH_GPU).tolist() == [70]


@pytest.mark.parametrize("raw, reverse, expected", [
    ([0, 0], False, [0, 0]),
    ([0, 0], True, [100, 100]),
    ([2, 1, 0], False, [100, 50, 0]),
    ([2, 1, 0], True, [0, 50, 100]),
    ([3, 1], False, [100, 33]),
])
def test_default_normalize(raw, reverse, expected):
    assert default_normalize(np.array(raw), reverse).tolist() == expected


def test_taint_toleration_score():
    nodes = [Node("n0", 1, 1, taints=(Taint("a", "", "PreferNoSchedule"), Taint("b", "", "PreferNoSchedule"))),
             Node("n1", 1, 1, taints=(Taint("a", "", "PreferNoSchedule"), Taint("c", "", "NoSchedule"))),
             Node("n2", 1, 1)]
    s = ClusterState.empty(nodes)
    c = np.arange(3)
    assert score_taint_toleration(pod(), s, c).tolist() == [0, 50, 100]
    # a NoSchedule-only toleration does not count for PreferNoSchedule taints
    p = pod(tolerations=(Toleration("a", "Exists", effect="NoSchedule"),))
    assert score_taint_toleration(p, s, c).tolist() == [0, 50, 100]
    p = pod(tolerations=(Toleration("a", "Exists"),))  # counts now 1, 0, 0
    assert score_taint_toleration(p, s, c).tolist() == [0, 100, 100]


def test_node_affinity_score():
    nodes = [Node("n0", 1, 1, labels={ZONE_LABEL: "a", "disk": "ssd"}), Node("n1", 1, 1, labels={ZONE_LABEL: "a"}),
             Node("n2", 1, 1)]
    terms = (PreferredSchedulingTerm(5, NodeSelectorTerm((LabelRequirement(ZONE_LABEL, "In", ("a",)),))),
             PreferredSchedulingTerm(3, NodeSelectorTerm((LabelRequirement("disk", "Exists"),))))
    s = ClusterState.empty(nodes)
    # raw 8, 5, 0 -> 100, 500/8 = 62, 0
    assert score_node_affinity(pod(preferred_node_affinity=terms), s, np.arange(3)).tolist() == [100, 62, 0]
    assert score_node_affinity(pod(), s, np.arange(3)).tolist() == [0, 0, 0]


WEB = {"app": "web"}


def zoned(*placed) -> ClusterState:
    nodes = [Node("n0", 8000, 8000, labels={ZONE_LABEL: "a"}), Node("n1", 8000, 8000, labels={ZONE_LABEL: "a"}),
             Node("n2", 8000, 8000, labels={ZONE_LABEL: "b"}), Node("n3", 8000, 8000)]
    s = ClusterState.empty(nodes)
    for i, p in placed:
        s = bind(s, p, i)
    return s


def _soft(key, skew):
    return TopologySpreadConstraint(skew, key, "ScheduleAnyway", LabelSelector(match_labels=WEB))


def test_pod_topology_spread_score_zone():
    s = zoned((0, pod("w0", labels=WEB)), (0, pod("w1", labels=WEB)), (2, pod("w2", labels=WEB)))
    p = pod(labels=WEB, topology_spread=(_soft(ZONE_LABEL, 1),))
    # 2 zones among candidates -> weight ln 4 = 1.386; raw a: round(2 * 1.386) = 3, b: round(1.386) = 1
    # normalised 100 * (3 + 1 - raw) / 3 -> a 33, b 100; n3 lacks the key -> 0
    assert score_pod_topology_spread(p, s, np.arange(4)).tolist() == [33, 33, 100, 0]
    # DoNotSchedule constraints do not score
    hard = pod(labels=WEB, topology_spread=(TopologySpreadConstraint(1, ZONE_LABEL, label_selector=LabelSelector(WEB)),))
    assert score_pod_topology_spread(hard, s, np.arange(4)).tolist() == [0, 0, 0, 0]


def test_pod_topology_spread_score_hostname():
    s = zoned((0, pod("w0", labels=WEB)), (0, pod("w1", labels=WEB)), (2, pod("w2", labels=WEB)))
    p = pod(labels=WEB, topology_spread=(_soft(HOSTNAME_LABEL, 2),))
    # 4 nodes -> weight ln 6 = 1.792; raw: n0 round(2 * 1.792 + 1) = 5, n1 1, n2 round(2.792) = 3, n3 1
    # normalised 100 * (5 + 1 - raw) / 5
    assert score_pod_topology_spread(p, s, np.arange(4)).tolist() == [20, 100, 60, 100]


def test_inter_pod_affinity_score_incoming_terms():
    s = zoned((0, pod("w", labels=WEB)))
    p = pod(preferred_pod_affinity=(WeightedPodAffinityTerm(10, PodAffinityTerm(LabelSelector(WEB), ZONE_LABEL)),),
            preferred_pod_anti_affinity=(WeightedPodAffinityTerm(4, PodAffinityTerm(LabelSelector(WEB), HOSTNAME_LABEL)),))
    # raw: n0 10 - 4 = 6, n1 10, n2 0, n3 0 -> min-max
    assert score_inter_pod_affinity(p, s, np.arange(4)).tolist() == [60, 100, 0, 0]


def test_inter_pod_affinity_score_existing_terms():
    q1 = pod("q1", labels={"app": "db"}, pod_affinity=(PodAffinityTerm(LabelSelector(WEB), ZONE_LABEL),))
    q2 = pod("q2", preferred_pod_anti_affinity=(WeightedPodAffinityTerm(7, PodAffinityTerm(LabelSelector(WEB), HOSTNAME_LABEL)),))
    s = zoned((2, q1), (1, q2))
    # existing required affinity matching the incoming pod: zone b +1 (hard weight); q2: n1 -7
    # raw 0, -7, 1, 0 -> 100 * (raw + 7) / 8 truncated
    assert score_inter_pod_affinity(pod(labels=WEB), s, np.arange(4)).tolist() == [87, 0, 100, 87]
    assert score_inter_pod_affinity(pod(labels={"app": "x"}), s, np.arange(4)).tolist() == [0, 0, 0, 0]


def test_policies_combine_plugins_with_default_weights():
    s = state_a()
    # least [50, 68] + balanced [75, 65]
    assert KubeResourcesPolicy().score(pod(), s, ALL2).tolist() == [125, 133]
    # plus TaintToleration 3 x 100 (no taints); other plugins score 0
    assert KubeDefaultPolicy().score(pod(), s, ALL2).tolist() == [425, 433]
    assert select_node(KubeDefaultPolicy(), pod(), s, ALL2) == 1
    assert select_node(MostAllocatedPolicy(), pod(), s, ALL2) == 0
    scores = KubeDefaultPolicy().plugin_scores(pod(), s, ALL2)
    assert scores["NodeResourcesFit"].tolist() == [50, 68]


def test_kube_default_prefers_node_affinity_over_resources():
    s = ClusterState.empty([Node("n0", 4000, 4000), Node("n1", 4000, 4000, labels={"disk": "ssd"})])
    s = bind(s, pod("a", cpu=3000, mem=3000), 1)
    term = PreferredSchedulingTerm(1, NodeSelectorTerm((LabelRequirement("disk", "In", ("ssd",)),)))
    p = pod(cpu=500, mem=500, preferred_node_affinity=(term,))
    assert select_node(KubeResourcesPolicy(), p, s, ALL2) == 0
    assert select_node(KubeDefaultPolicy(), p, s, ALL2) == 1  # 2 x 100 outweighs the resource gap


def test_registry():
    names = policy_names()
    for name in ("kube-default", "kube-resources", "most-allocated", "rtcr",
                 "trimaran-tlp", "trimaran-lvrb", "koord-loadaware"):
        assert name in names
        policy = get_policy(name, seed=3)
        assert policy.name == name
        assert isinstance(policy, Policy)
    with pytest.raises(KeyError):
        get_policy("no-such-policy")
    register_policy("test-most", lambda seed: MostAllocatedPolicy(), replace=True)
    assert get_policy("test-most").name == "most-allocated"
    with pytest.raises(ValueError):
        register_policy("rtcr", lambda seed: MostAllocatedPolicy())
