"""The cluster view: ordered observed changes with an epoch, assumed pods (assume / confirm / forget /
expire), diffs between states, and the whole state equal to what the simulator holds."""

import numpy as np
import pytest

from agmarl_common.core.cluster import changes as ch
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.cluster.view import MAX_SEQ_JUMP, ClusterView


def nodes():
    return (Node("a", 4000, 8000), Node("b", 4000, 8000, gpu_count=2, gpu_model="T4"), Node("c", 2000, 4000))


def observed(*placed) -> ClusterState:
    s = ClusterState.empty(nodes())
    for pod, i in placed:
        s = bind(s, pod, i)
    return s


def usage(state: ClusterState) -> list[int]:
    return state.cpu_used.tolist()


def test_assumed_pods_take_resources_until_confirmed_or_forgotten():
    v = ClusterView()
    v.apply_snapshot("e", 1, observed())
    p = Pod("p", 1000, 100)
    assert v.assume(p, "a", (), now=0.0) and usage(v.state) == [1000, 0, 0]
    assert not v.assume(p, "b", (), now=0.0)  # already placed
    v.observe_bound(p, "a")  # confirmed: same state, no longer assumed
    assert usage(v.state) == [1000, 0, 0] and not v.is_assumed(p.key)
    q = Pod("q", 500, 100)
    v.assume(q, "c", (), now=1.0)
    assert v.forget(q.key) and usage(v.state) == [1000, 0, 0]
    assert not v.forget(p.key)  # observed pods are not forgotten


def test_a_binding_observed_elsewhere_wins_over_the_assumption():
    v = ClusterView()
    v.apply_snapshot("e", 1, observed())
    p = Pod("p", 1000, 100)
    v.assume(p, "a", (), now=0.0)
    v.observe_bound(p, "b")
    assert usage(v.state) == [0, 1000, 0] and v.node_of(p.key) == "b" and not v.is_assumed(p.key)


def test_expiry_gives_back_unconfirmed_assumptions():
    v = ClusterView(assume_ttl=5.0)
    v.apply_snapshot("e", 1, observed())
    v.assume(Pod("p", 1000, 100), "a", (), now=0.0)
    assert v.expire(now=4.0) == [] and usage(v.state)[0] == 1000
    assert v.expire(now=6.0) == ["default/p"] and usage(v.state)[0] == 0


def test_a_snapshot_keeps_assumptions_it_does_not_show_and_drops_those_it_does():
    v = ClusterView()
    v.apply_snapshot("e", 1, observed())
    p, q = Pod("p", 1000, 100), Pod("q", 500, 100)
    v.assume(p, "a", (), now=0.0)
    v.assume(q, "c", (), now=0.0)
    assert v.apply_snapshot("e", 2, observed((p, 0)))
    assert usage(v.state) == [1000, 0, 500] and not v.is_assumed(p.key) and v.is_assumed(q.key)


def test_order_epoch_and_out_of_range_sequences():
    v = ClusterView()
    assert v.position("e", 5) == "reset" and not v.accept("e", 5)  # nothing before a full state
    v.apply_snapshot("e", 5, observed())
    assert v.position("e", 5) == "stale" and v.position("e", 6) == "next" and v.position("e", 8) == "gap"
    assert v.accept("e", 6) and v.accept("e", 8) and v.gaps == 1
    assert not v.apply_snapshot("e", 7, observed())  # older than what the view holds
    # a restarted producer (new epoch) starts again at low numbers: a reset, not a freeze
    assert v.position("e2", 1) == "reset" and v.apply_snapshot("e2", 1, observed())
    # a sequence far out of range (2^62) is taken once; the producer's next real number resets it back
    assert v.apply_snapshot("e2", 2 ** 62, observed())
    assert v.position("e2", 3) == "reset" and v.apply_snapshot("e2", 3, observed()) and v.seq == 3
    assert v.position("e2", 3 + MAX_SEQ_JUMP + 1) == "reset"


def test_node_readiness_and_load():
    v = ClusterView()
    v.apply_snapshot("e", 1, observed())
    v.observe_node_ready("b", False)
    assert not v.state.schedulable[1] and not v.state.nodes[1].ready
    v.observe_node_ready("b", True)
    assert v.state.schedulable[1]
    v.observe_load(np.array([1, 2, 3]), None)
    assert v.state.cpu_load.tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        v.observe_load(np.array([1]), None)


def test_diff_turns_one_state_into_the_other():
    p, q, r = Pod("p", 1000, 100), Pod("q", 500, 100), Pod("g", 100, 100, num_gpu=1, gpu_milli=500)
    old = observed((p, 0), (q, 2))
    new = bind(observed((p, 1)), r, 1, (1,))
    v = ClusterView()
    v.apply_snapshot("e", 1, old)
    diff = ch.diff(old, new)
    ch.apply(v, ch.check(diff))
    assert usage(v.state) == usage(new) and v.state.gpu_used.tolist() == new.gpu_used.tolist()
    assert {k: v.node_of(k) for k in ("default/p", "default/q", "default/g")} == {
        "default/p": "b", "default/q": "", "default/g": "b"}
    assert ch.diff(new, new) == []
    assert ch.diff(old, ClusterState.empty(nodes()[:2])) is None  # node set changed: a full state is due


def test_events_map_to_changes():
    v = ClusterView()
    v.apply_snapshot("e", 1, observed())
    pod = {"name": "p", "namespace": "default", "cpu_milli": 1000, "memory_mib": 100}
    ch.apply(v, [ch.from_event("pod_bound", "default/p", "a", pod, [])])
    assert usage(v.state)[0] == 1000
    ch.apply(v, [ch.from_event("pod_deleted", "default/p", "a", {}, [])])
    assert usage(v.state)[0] == 0
    ch.apply(v, [ch.from_event("node_failed", "", "c", {}, [])])
    assert not v.state.schedulable[2]
    assert ch.from_event("pod_added", "default/x", "", {}, []) is None
    with pytest.raises(ValueError):
        ch.from_event("pod_bound", "default/p", "a", {}, [])
    with pytest.raises(ValueError):
        ch.check([{"op": "teleport"}])


def test_a_refused_bind_forgets_only_the_assumption_it_refused():
    v = ClusterView()
    v.apply_snapshot("e", 1, observed())
    p = Pod("p", 1000, 100)
    v.assume(p, "a", (), now=0.0)
    ch.apply(v, [ch.rejected_change(p.key, "b")])  # a stale refusal of another decision for the pod
    assert v.is_assumed(p.key) and usage(v.state)[0] == 1000
    ch.apply(v, [ch.rejected_change(p.key, "a")])
    assert not v.is_assumed(p.key) and usage(v.state)[0] == 0


def test_a_joint_decisions_final_state_is_assumed_as_one_by_one():
    """assume_decided takes the state a batch decision ended in: the same view as assuming its pods one by
    one, forgettable one by one; refused when the view moved since the decision."""
    p, q, r = Pod("p", 1000, 100), Pod("q", 500, 100, num_gpu=1, gpu_milli=500), Pod("r", 300, 100)
    placed = [(p, "a", ()), (q, "b", (1,)), (r, "a", ())]
    one, joint = ClusterView(), ClusterView()
    for v in (one, joint):
        v.apply_snapshot("e", 1, observed())
    for pod, node, gpus in placed:
        one.assume(pod, node, gpus, now=2.0)
    before = joint.state
    after = before
    for pod, node, gpus in placed:
        after = bind(after, pod, before.index[node], gpus)
    assert joint.assume_decided(before, after, placed, now=2.0)
    assert joint.state is after and joint.where == one.where and joint.assumed == one.assumed
    for a in ("cpu_used", "mem_used", "pods_used", "gpu_used"):
        assert np.array_equal(getattr(joint.state, a), getattr(one.state, a))
    assert [[x.key for x in b] for b in joint.state.bound] == [[x.key for x in b] for b in one.state.bound]
    assert joint.forget(q.key) and usage(joint.state) == [1300, 0, 0] and joint.state.gpu_used[1].sum() == 0
    assert not joint.assume_decided(before, after, placed, now=3.0)  # the view moved on: nothing changed
    assert usage(joint.state) == [1300, 0, 0] and q.key not in joint.where
