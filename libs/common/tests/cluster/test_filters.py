"""Table-driven tests of the hard filter, and property tests: feasible_mask == filter_node == a
definition-by-scan oracle on random states (the pod index behind them: test_podindex.py)."""

from __future__ import annotations

import numpy as np
import pytest

from agmarl_common.core.cluster.filters import (
    feasible_mask,
    feasible_nodes,
    filter_node,
    fits_gpu,
    fits_node_selector,
    fits_node_unschedulable,
    fits_pod_affinity,
    fits_resources,
    fits_taints,
    fits_topology_spread,
    violations,
)
from agmarl_common.core.cluster.model import (
    HOSTNAME_LABEL,
    ZONE_LABEL,
    ClusterState,
    LabelRequirement,
    LabelSelector,
    Node,
    NodeSelectorTerm,
    Pod,
    Taint,
    Toleration,
    TopologySpreadConstraint,
    bind,
    choose_gpus,
    state_from_dict,
    state_to_dict,
    unbind,
)
from agmarl_common.core.cluster.selectors import (
    label_value,
    matches_label_selector,
    pod_matches_node_affinity,
    term_matches_pod,
)
from agmarl_testing.states import WEB, node, pod, random_big_state, random_node, random_pod, rich_pod, term, zoned

Req = LabelRequirement


# ------------------------------------------------------------------------------ resources

def _one(n: Node, *placed: tuple[Pod, tuple[int, ...]]) -> ClusterState:
    s = ClusterState.empty([n])
    for p, gpus in placed:
        s = bind(s, p, 0, gpus)
    return s


@pytest.mark.parametrize("n, placed, p, ok, reason", [
    (node(), [], pod(cpu=4000, mem=8192), True, ""),
    (node(), [], pod(cpu=4001), False, "Insufficient cpu"),
    (node(), [(pod("a", cpu=3500), ())], pod(cpu=600), False, "Insufficient cpu"),
    (node(), [], pod(mem=8193), False, "Insufficient memory"),
    (node(cpu=1000), [(pod("a", cpu=1000), ())], pod(cpu=0, mem=1), True, ""),  # zero request always fits
    (node(max_pods=1), [(pod("a", cpu=1), ())], pod(cpu=1), False, "Too many pods"),
    (node(ephemeral_mib=100), [], pod(ephemeral_mib=101), False, "Insufficient ephemeral-storage"),
    (node(ephemeral_mib=0), [], pod(ephemeral_mib=10**6), True, ""),  # not tracked
    (node(gpu_count=1), [], pod(num_gpu=1, gpu_milli=1000), True, ""),
    (node(), [], pod(num_gpu=1, gpu_milli=500), False, "Insufficient nvidia.com/gpu"),
])
def test_fits_resources(n, placed, p, ok, reason):
    status = fits_resources(p, _one(n, *placed), 0)
    assert status.ok is ok
    assert status.reason == reason
    assert status.plugin == ("" if ok else "NodeResourcesFit")


@pytest.mark.parametrize("n, placed, p, ok", [
    (node(gpu_count=2), [], pod(num_gpu=2, gpu_milli=1000), True),
    (node(gpu_count=2), [(pod("a", num_gpu=1, gpu_milli=100), (0,))], pod(num_gpu=2, gpu_milli=1000), False),
    (node(gpu_count=2), [(pod("a", num_gpu=1, gpu_milli=600), (0,))], pod(num_gpu=1, gpu_milli=400), True),
    # 600 + 500 on device 0, 600 on device 1: no single device has 500 free
    (node(gpu_count=2), [(pod("a", num_gpu=1, gpu_milli=600), (0,)), (pod("b", num_gpu=1, gpu_milli=600), (1,))],
     pod(num_gpu=1, gpu_milli=500), False),
    (node(gpu_count=2), [(pod("a", num_gpu=1, gpu_milli=600), (0,)), (pod("b", num_gpu=1, gpu_milli=600), (1,))],
     pod(num_gpu=1, gpu_milli=400), True),
    (node(gpu_count=1, gpu_model="T4"), [], pod(num_gpu=1, gpu_milli=1000, gpu_spec=("V100M16", "V100M32")), False),
    (node(gpu_count=1, gpu_model="V100M32"), [], pod(num_gpu=1, gpu_milli=1000, gpu_spec=("V100M16", "V100M32")), True),
    (node(gpu_count=0), [], pod(gpu_spec=("T4",)), True),  # CPU pods ignore gpu_spec
    (node(gpu_count=8), [], pod(num_gpu=9, gpu_milli=1000), False),
])
def test_fits_gpu(n, placed, p, ok):
    s = _one(n, *placed)
    assert fits_gpu(p, s, 0).ok is ok
    assert feasible_mask(p, s)[0] == ok


# ------------------------------------------------------------------------------ node-only checks

@pytest.mark.parametrize("n, tolerations, ok", [
    (node(), (), True),
    (node(unschedulable=True), (), False),
    (node(unschedulable=True), (Toleration("node.kubernetes.io/unschedulable", "Exists", effect="NoSchedule"),), True),
    (node(ready=False), (), False),
    (node(ready=False), (Toleration("node.kubernetes.io/not-ready", "Exists", effect="NoSchedule"),), False),
    (node(ready=False), (Toleration("node.kubernetes.io/not-ready", "Exists"),), True),
    (node(ready=False, unschedulable=True), (Toleration(operator="Exists"),), True),
])
def test_fits_node_unschedulable(n, tolerations, ok):
    assert fits_node_unschedulable(pod(tolerations=tolerations), n).ok is ok


@pytest.mark.parametrize("taints, tolerations, ok", [
    ((), (), True),
    ((Taint("gpu", "true", "NoSchedule"),), (), False),
    ((Taint("gpu", "true", "NoExecute"),), (), False),
    ((Taint("gpu", "true", "PreferNoSchedule"),), (), True),
    ((Taint("gpu", "true", "NoSchedule"),), (Toleration("gpu", "Equal", "true", "NoSchedule"),), True),
    ((Taint("gpu", "true", "NoSchedule"),), (Toleration("gpu", "Equal", "false"),), False),
    ((Taint("gpu", "true", "NoSchedule"),), (Toleration("gpu", "Exists"),), True),
    ((Taint("gpu", "true", "NoSchedule"),), (Toleration("gpu", "Exists", effect="NoExecute"),), False),
    ((Taint("a", "", "NoSchedule"), Taint("b", "", "NoExecute")), (Toleration("a", "Exists"),), False),
    ((Taint("a", "", "NoSchedule"), Taint("b", "", "NoExecute")), (Toleration(operator="Exists"),), True),
])
def test_fits_taints(taints, tolerations, ok):
    status = fits_taints(pod(tolerations=tolerations), node(taints=taints))
    assert status.ok is ok
    assert status.plugin == ("" if ok else "TaintToleration")


LABELS = {"disk": "ssd", "gen": "5", ZONE_LABEL: "z1"}


@pytest.mark.parametrize("selector, terms, ok", [
    ({}, (), True),
    ({"disk": "ssd"}, (), True),
    ({"disk": "hdd"}, (), False),
    ({"missing": "x"}, (), False),
    ({HOSTNAME_LABEL: "n"}, (), True),  # hostname defaults to the node name
    ({}, (NodeSelectorTerm((Req("disk", "In", ("ssd", "nvme")),)),), True),
    ({}, (NodeSelectorTerm((Req("disk", "NotIn", ("ssd",)),)),), False),
    ({}, (NodeSelectorTerm((Req("missing", "NotIn", ("ssd",)),)),), True),
    ({}, (NodeSelectorTerm((Req("disk", "Exists"),)),), True),
    ({}, (NodeSelectorTerm((Req("disk", "DoesNotExist"),)),), False),
    ({}, (NodeSelectorTerm((Req("gen", "Gt", ("4",)),)),), True),
    ({}, (NodeSelectorTerm((Req("gen", "Gt", ("5",)),)),), False),
    ({}, (NodeSelectorTerm((Req("gen", "Lt", ("6",)),)),), True),
    ({}, (NodeSelectorTerm((Req("disk", "Lt", ("6",)),)),), False),  # not an integer
    ({}, (NodeSelectorTerm(),), False),  # an empty term matches nothing
    # terms are ORed, requirements inside a term ANDed
    ({}, (NodeSelectorTerm((Req("disk", "In", ("hdd",)),)), NodeSelectorTerm((Req("gen", "In", ("5",)),))), True),
    ({}, (NodeSelectorTerm((Req("disk", "In", ("ssd",)), Req("gen", "In", ("4",)))),), False),
    ({}, (NodeSelectorTerm(match_fields=(Req("metadata.name", "In", ("n",)),)),), True),
    ({}, (NodeSelectorTerm(match_fields=(Req("metadata.name", "NotIn", ("n",)),)),), False),
    ({"disk": "ssd"}, (NodeSelectorTerm((Req("gen", "In", ("4",)),)),), False),  # selector AND affinity
])
def test_fits_node_selector(selector, terms, ok):
    status = fits_node_selector(pod(node_selector=selector, required_node_affinity=terms), node(labels=LABELS))
    assert status.ok is ok
    assert status.plugin == ("" if ok else "NodeAffinity")


# ------------------------------------------------------------------------------ pod affinity



@pytest.mark.parametrize("placed, p, expected", [
    # required affinity to app=web in the same zone
    ([(0, pod("w", labels=WEB))], pod(pod_affinity=(term(app="web"),)), [True, True, False, False]),
    ([(0, pod("w", labels=WEB))], pod(pod_affinity=(term(HOSTNAME_LABEL, app="web"),)), [True, False, False, False]),
    # nothing matches and the pod does not match itself: nowhere
    ([], pod(pod_affinity=(term(app="web"),)), [False, False, False, False]),
    # first pod of a self-affine group: anywhere with the topology key
    ([], pod(labels=WEB, pod_affinity=(term(app="web"),)), [True, True, True, False]),
    # a matching pod in another namespace does not count
    ([(0, pod("w", labels=WEB, namespace="other"))], pod(pod_affinity=(term(app="web"),)), [False] * 4),
    # required anti-affinity: not in zone a; n3 lacks the key so the term cannot be violated there
    ([(1, pod("w", labels=WEB))], pod(pod_anti_affinity=(term(app="web"),)), [False, False, True, True]),
    # existing pod's anti-affinity against the incoming pod (symmetry)
    ([(2, pod("w", pod_anti_affinity=(term(app="web"),)))], pod(labels=WEB), [True, True, False, True]),
    ([(2, pod("w", pod_anti_affinity=(term(app="web"),)))], pod(labels={"app": "db"}), [True] * 4),
])
def test_fits_pod_affinity(placed, p, expected):
    s = zoned(*placed)
    got = [fits_pod_affinity(p, s, i).ok for i in range(s.n_nodes)]
    assert got == expected
    assert feasible_mask(p, s).tolist() == expected


# ------------------------------------------------------------------------------ topology spread

def _spread(max_skew=1, key=ZONE_LABEL, min_domains=1, when="DoNotSchedule"):
    return TopologySpreadConstraint(max_skew, key, when, LabelSelector(match_labels=WEB), min_domains)


@pytest.mark.parametrize("placed, p, expected", [
    # zone a has 1 web pod, zone b 0: skew on a would be 2 - 0 > 1
    ([(0, pod("w", labels=WEB))], pod(labels=WEB, topology_spread=(_spread(),)), [False, False, True, False]),
    ([(0, pod("w", labels=WEB))], pod(labels=WEB, topology_spread=(_spread(max_skew=2),)), [True, True, True, False]),
    # the incoming pod does not match its own selector: self-match 0
    ([(0, pod("w", labels=WEB))], pod(topology_spread=(_spread(),)), [True, True, True, False]),
    # minDomains 3 with only 2 zones: global minimum treated as 0
    ([(2, pod("w", labels=WEB))], pod(labels=WEB, topology_spread=(_spread(min_domains=3),)), [True, True, False, False]),
    ([(0, pod("a", labels=WEB)), (2, pod("b", labels=WEB))],
     pod(labels=WEB, topology_spread=(_spread(min_domains=3),)), [False, False, False, False]),
    # ScheduleAnyway never filters, not even nodes without the key
    ([(0, pod("w", labels=WEB))], pod(labels=WEB, topology_spread=(_spread(when="ScheduleAnyway"),)), [True] * 4),
    # hostname domains: 4 nodes, one already has a pod
    ([(0, pod("w", labels=WEB))], pod(labels=WEB, topology_spread=(_spread(key=HOSTNAME_LABEL),)),
     [False, True, True, True]),
])
def test_fits_topology_spread(placed, p, expected):
    s = zoned(*placed)
    assert [fits_topology_spread(p, s, i).ok for i in range(s.n_nodes)] == expected
    assert feasible_mask(p, s).tolist() == expected


def test_spread_counts_only_nodes_passing_node_affinity():
    nodes = [node("n0", labels={ZONE_LABEL: "a", "pool": "x"}), node("n1", labels={ZONE_LABEL: "c", "pool": "x"}),
             node("n2", labels={ZONE_LABEL: "b", "pool": "y"})]
    s = bind(bind(ClusterState.empty(nodes), pod("w0", labels=WEB), 0), pod("w1", labels=WEB), 1)
    # every zone eligible: b has 0, so a would reach skew 1 + 1 - 0 = 2
    p = pod(labels=WEB, topology_spread=(_spread(),))
    assert [fits_topology_spread(p, s, i).ok for i in range(3)] == [False, False, True]
    # pool=x excludes zone b from the domains: minimum is 1, skew on a is 1 + 1 - 1 = 1
    p_x = pod(labels=WEB, node_selector={"pool": "x"}, topology_spread=(_spread(),))
    assert [fits_topology_spread(p_x, s, i).ok for i in range(3)] == [True, True, True]
    assert feasible_mask(p_x, s).tolist() == [True, True, False]  # b fails on NodeAffinity


# ------------------------------------------------------------------------------ whole filter

def test_filter_node_first_failure_in_kube_scheduler_order():
    n = node(unschedulable=True, taints=(Taint("x", "", "NoSchedule"),), labels={"a": "b"})
    s = ClusterState.empty([n])
    p = pod(cpu=10**6, node_selector={"a": "c"})
    assert filter_node(p, s, 0).plugin == "NodeUnschedulable"
    p = pod(cpu=10**6, node_selector={"a": "c"}, tolerations=(Toleration("node.kubernetes.io/unschedulable", "Exists"),))
    assert filter_node(p, s, 0).plugin == "TaintToleration"
    p = pod(cpu=10**6, node_selector={"a": "c"}, tolerations=(Toleration(operator="Exists"),))
    assert filter_node(p, s, 0).plugin == "NodeAffinity"
    p = pod(cpu=10**6, tolerations=(Toleration(operator="Exists"),))
    assert filter_node(p, s, 0) == fits_resources(p, s, 0)
    assert filter_node(pod(tolerations=(Toleration(operator="Exists"),)), s, 0).ok
    assert feasible_nodes(pod(), s).tolist() == []
    assert feasible_nodes(pod(tolerations=(Toleration(operator="Exists"),)), s).dtype == np.int64


# ------------------------------------------------------------------------------ violations

def test_violations_empty_for_a_legal_state():
    s = zoned((0, pod("a", labels=WEB)), (2, pod("b", labels=WEB, pod_anti_affinity=(term(app="web"),))))
    assert violations(s) == []


@pytest.mark.parametrize("build, needle", [
    (lambda: bind(ClusterState.empty([node(cpu=1000)]), pod(cpu=1500), 0), "cpu used 1500 > capacity 1000"),
    (lambda: bind(ClusterState.empty([node(max_pods=0)]), pod(), 0), "pods used 1 > capacity 0"),
    (lambda: bind(bind(ClusterState.empty([node(gpu_count=1)]), pod("a", num_gpu=1, gpu_milli=600), 0, (0,)),
                  pod("b", num_gpu=1, gpu_milli=600), 0, (0,)), "gpu device 0 used 1200 > 1000"),
    (lambda: bind(ClusterState.empty([node(gpu_count=1)]), pod(num_gpu=1, gpu_milli=1000), 0, (3,)),
     "gpu device 3 does not exist"),
    (lambda: bind(ClusterState.empty([node()]), pod(node_selector={"a": "b"}), 0), "NodeAffinity"),
    (lambda: bind(ClusterState.empty([node(taints=(Taint("k", "", "NoExecute"),))]), pod(), 0), "TaintToleration"),
    (lambda: bind(ClusterState.empty([node(gpu_count=1, gpu_model="T4")]), pod(num_gpu=1, gpu_milli=1000, gpu_spec=("A10",)),
                  0, (0,)), "not in gpu_spec"),
    (lambda: zoned((0, pod("a", labels=WEB)), (1, pod("b", pod_anti_affinity=(term(app="web"),)))),
     "anti-affinity (topology.kubernetes.io/zone=a) violated by default/a"),
])
def test_violations_found(build, needle):
    found = violations(build())
    assert any(needle in v for v in found), found


# ------------------------------------------------------------------------------ property test

@pytest.mark.parametrize("seed", range(40))
def test_feasible_mask_equals_filter_node(seed):
    rng = np.random.default_rng(seed)
    nodes = [random_node(rng, f"n{k}") for k in range(int(rng.integers(2, 9)))]
    state = ClusterState.empty(nodes)
    for k in range(int(rng.integers(0, 14))):
        p = random_pod(rng, f"b{k}")
        idx = feasible_nodes(p, state)
        if idx.size:
            i = int(rng.choice(idx))
            state = bind(state, p, i, choose_gpus(p, state.gpu_free()[i]))
    assert violations(state) == []  # everything was bound through the filter
    for k in range(12):
        p = random_pod(rng, f"q{k}")
        expected = [filter_node(p, state, i).ok for i in range(state.n_nodes)]
        assert feasible_mask(p, state).tolist() == expected


def test_existing_anti_affinity_index_follows_bind_unbind_and_wire_roundtrip():
    guard = pod("guard", pod_anti_affinity=(term(HOSTNAME_LABEL, app="web"),))
    s = zoned((0, guard))
    assert s.affinity_pods.tolist() == [1, 0, 0, 0]
    web = pod("w", labels=WEB)
    assert feasible_mask(web, s).tolist() == [False, True, True, True]
    again = state_from_dict(state_to_dict(s))
    assert again.affinity_pods.tolist() == [1, 0, 0, 0]
    assert feasible_mask(web, again).tolist() == [False, True, True, True]
    freed = unbind(s, guard.key)
    assert freed.affinity_pods.tolist() == [0, 0, 0, 0]
    assert feasible_mask(web, freed).tolist() == [True] * 4


def test_tainted_index_is_built_from_nodes():
    s = ClusterState.empty([node("a"), node("b", taints=(Taint("k", "", "PreferNoSchedule"),))])
    assert s.tainted.tolist() == [False, True]
    assert feasible_mask(pod(), s).tolist() == [True, True]  # PreferNoSchedule does not filter


# ------------------------------------------------------------------------------ larger random states, many affinity pods

def _pod_terms_ok(p: Pod, state: ClusterState, i: int) -> bool:
    """PodTopologySpread and InterPodAffinity by their definition: a scan of every bound pod (slow, obvious)."""
    node, nodes, placed = state.nodes[i], state.nodes, [(j, q) for j, qs in enumerate(state.bound) for q in qs]
    hard = [c for c in p.topology_spread if c.when_unsatisfiable == "DoNotSchedule"]
    for c in hard:
        v = label_value(node, c.topology_key)
        if v is None:
            return False
        counts: dict[str, int] = {}
        for j, other in enumerate(nodes):
            if any(label_value(other, cc.topology_key) is None for cc in hard) or not pod_matches_node_affinity(p, other):
                continue
            w = label_value(other, c.topology_key)
            counts[w] = counts.get(w, 0) + sum(q.namespace == p.namespace and matches_label_selector(c.label_selector, q.labels)
                                               for q in state.bound[j])
        low = 0 if len(counts) < c.min_domains else min(counts.values(), default=2**31 - 1)
        if counts.get(v, 0) + matches_label_selector(c.label_selector, p.labels) - low > c.max_skew:
            return False
    if p.pod_affinity:
        values = [label_value(node, t.topology_key) for t in p.pod_affinity]
        if None in values:
            return False
        hits = [j for j, q in placed if all(term_matches_pod(t, p.namespace, q) for t in p.pod_affinity)]
        anywhere = any(label_value(nodes[j], t.topology_key) is not None for j in hits for t in p.pod_affinity)
        exist = all(any(label_value(nodes[j], t.topology_key) == v for j in hits) for t, v in zip(p.pod_affinity, values))
        if not exist and (anywhere or not all(term_matches_pod(t, p.namespace, p) for t in p.pod_affinity)):
            return False
    for t in p.pod_anti_affinity:
        v = label_value(node, t.topology_key)
        if v is not None and any(label_value(nodes[j], t.topology_key) == v and term_matches_pod(t, p.namespace, q)
                                 for j, q in placed):
            return False
    return not any(label_value(nodes[j], t.topology_key) is not None
                   and label_value(nodes[j], t.topology_key) == label_value(node, t.topology_key)
                   and term_matches_pod(t, q.namespace, p) for j, q in placed for t in q.pod_anti_affinity)


def _node_checks_ok(p: Pod, state: ClusterState, i: int) -> bool:
    n = state.nodes[i]
    return all(s.ok for s in (fits_node_unschedulable(p, n), fits_taints(p, n), fits_node_selector(p, n),
                              fits_resources(p, state, i)))


@pytest.mark.parametrize("seed", range(12))
def test_feasible_mask_on_larger_states_with_many_affinity_pods(seed):
    rng = np.random.default_rng(1000 + seed)
    state = random_big_state(rng, int(rng.integers(15, 40)), int(rng.integers(40, 120)))
    assert sum(p.has_pod_affinity for p in state.all_pods()) >= 5
    assert violations(state) == []
    rebuilt = state_from_dict(state_to_dict(state))  # no index yet: built on first use
    for k in range(10):
        p = rich_pod(rng, f"q{k}")
        expected = [_node_checks_ok(p, state, i) and _pod_terms_ok(p, state, i) for i in range(state.n_nodes)]
        assert [filter_node(p, state, i).ok for i in range(state.n_nodes)] == expected
        assert feasible_mask(p, state).tolist() == expected
        assert feasible_mask(p, rebuilt).tolist() == expected
