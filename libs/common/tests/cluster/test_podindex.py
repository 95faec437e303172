"""The pod index behind the hard filter (``PodIndex``: label groups, anti-affinity terms, zero-request
and LS counts per node) kept by bind / unbind / unbind_at equals a rebuild, a stale index is never
used, and ``violations`` finds exactly the anti-affinity violations a scan of every pod pair finds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agmarl_common.core.cluster.filters import feasible_mask, filter_node, violations
from agmarl_common.core.cluster.model import (
    HOSTNAME_LABEL,
    ZONE_LABEL,
    ClusterState,
    PodIndex,
    bind,
    pod_index,
    state_from_dict,
    state_to_dict,
    unbind,
    unbind_at,
)
from agmarl_common.core.cluster.selectors import label_value, term_matches_pod
from agmarl_testing.states import WEB, node, pod, random_big_state, rich_pod, term, zoned


def _index_view(s: ClusterState) -> tuple:
    idx = pod_index(s)
    return ({k: v[-1].tolist() for k, v in idx.groups.items()}, dict(idx.group_pairs),
            {k: v[-1].tolist() for k, v in idx.anti.items()}, dict(idx.anti_pairs),
            idx.zero_cpu.tolist(), idx.zero_mem.tolist(), idx.ls.tolist())


@pytest.mark.parametrize("seed", range(5))
def test_pod_index_kept_by_bind_unbind_equals_a_rebuild(seed):
    rng = np.random.default_rng(seed)
    s = random_big_state(rng, 12, 60)
    kept = s.pods_by_label
    assert kept is not None and kept.bound is s.bound  # maintained incrementally, not rebuilt
    fresh = PodIndex.build(s.nodes, s.bound)
    assert _index_view(s) == _index_view(replace(s, pods_by_label=fresh))
    for p in s.all_pods():  # drain: every count and bucket goes away
        s = unbind_at(s, s.index[p.node_name], p.key)
    assert _index_view(s) == ({}, {}, {}, {}, [0] * 12, [0] * 12, [0] * 12)


def test_unbind_at_equals_unbind_and_ignores_a_wrong_node():
    s = zoned((0, pod("a", labels=WEB)), (0, pod("b", pod_anti_affinity=(term(app="web"),))), (2, pod("c", cpu=0)))
    for key, i in (("default/a", 0), ("default/b", 0), ("default/c", 2)):
        ours, ref = unbind_at(s, i, key), unbind(s, key)
        assert state_to_dict(ours) == state_to_dict(ref)
        for f in ("cpu_used", "mem_used", "pods_used", "eph_used", "gpu_used", "affinity_pods"):
            assert np.array_equal(getattr(ours, f), getattr(ref, f))
        assert _index_view(ours) == _index_view(ref)
    assert unbind_at(s, 1, "default/a") is s
    assert unbind_at(s, 0, "default/zzz") is s


def test_stale_index_is_rebuilt_when_bound_is_replaced():
    s = zoned((0, pod("guard", pod_anti_affinity=(term(HOSTNAME_LABEL, app="web"),))))
    web = pod("w", labels=WEB)
    assert feasible_mask(web, s).tolist() == [False, True, True, True]
    emptied = replace(s, bound=((),) * 4)  # carries s's index, which no longer describes it
    assert feasible_mask(web, emptied).tolist() == [True] * 4
    moved = replace(s, bound=((), (), s.bound[0], ()))
    assert feasible_mask(web, moved).tolist() == [True, True, False, True]
    # the topology-domain cache belongs to a nodes tuple: new node labels, new domains
    w = zoned((0, pod("w0", labels=WEB)))
    far = pod("f", pod_anti_affinity=(term(app="web"),))
    assert feasible_mask(far, w).tolist() == [False, False, True, True]
    relabelled = replace(w, nodes=(node("n0", labels={ZONE_LABEL: "b"}),) + w.nodes[1:])
    assert feasible_mask(far, relabelled).tolist() == [False, True, False, True]
    assert [filter_node(far, relabelled, i).ok for i in range(4)] == [False, True, False, True]


def test_violations_lists_every_anti_affinity_violator_in_node_order():
    anti = (term(app="web"),)
    s = zoned((2, pod("w0", labels=WEB)), (0, pod("g", labels=WEB, pod_anti_affinity=anti)),
               (1, pod("w1", labels=WEB)), (0, pod("w2", labels=WEB)), (2, pod("h", labels=WEB, pod_anti_affinity=anti)))
    found = [v for v in violations(s) if "anti-affinity" in v]
    assert found == ["default/g on n0: anti-affinity (topology.kubernetes.io/zone=a) violated by default/w2 on n0",
                     "default/g on n0: anti-affinity (topology.kubernetes.io/zone=a) violated by default/w1 on n1",
                     "default/h on n2: anti-affinity (topology.kubernetes.io/zone=b) violated by default/w0 on n2"]
    # a pod matching its own anti-affinity term alone in its domain is legal
    assert violations(zoned((2, pod("solo", labels=WEB, pod_anti_affinity=anti)))) == []


def _anti_messages_by_scan(state: ClusterState) -> list[str]:
    """Required anti-affinity violations by definition: every bound pod against every other."""
    out = []
    for i, pods in enumerate(state.bound):
        for p in pods:
            for t in p.pod_anti_affinity:
                mine = label_value(state.nodes[i], t.topology_key)
                for j, other in enumerate(state.nodes):
                    if mine is not None and label_value(other, t.topology_key) == mine:
                        out += [f"{p.key} on {state.nodes[i].name}: anti-affinity ({t.topology_key}={mine}) "
                                f"violated by {q.key} on {other.name}"
                                for q in state.bound[j] if q.key != p.key and term_matches_pod(t, p.namespace, q)]
    return out


@pytest.mark.parametrize("seed", range(8))
def test_violations_finds_every_anti_affinity_violation_of_forced_binds(seed):
    rng = np.random.default_rng(2000 + seed)
    state = random_big_state(rng, 12, 30)
    for k in range(40):  # bound anywhere, no filter: anti-affinity (and more) gets violated
        state = bind(state, rich_pod(rng, f"x{k}"), int(rng.integers(state.n_nodes)))
    expected = _anti_messages_by_scan(state)
    assert expected  # the forced binds did break some anti-affinity
    assert [v for v in violations(state) if ": anti-affinity (" in v] == expected
    assert violations(state_from_dict(state_to_dict(state))) == violations(state)
