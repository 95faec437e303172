"""Which held decisions are rewarded (pure): bound as decided, or named by pod_bound and gone since; the rest
waits while pending, or is dropped with the reason."""

from __future__ import annotations

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.core.cluster.compact import compact_snapshot
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, state_to_dict, to_dict
from agmarl_reward_calculator.ledger import REWARD, WAIT, Held, snapshot_before, verdict
from agmarl_reward_calculator.transition import SnapshotView

NODES = (Node("a", 2000, 2048), Node("b", 2000, 2048))
P = Pod("p", 500, 512)


def view(bound_on: int | None = None, pending: bool = False, epoch: str = "e1", compact: bool = False,
         seq: int = 1) -> SnapshotView:
    s = ClusterState.empty(NODES)
    if bound_on is not None:
        s = bind(s, P, bound_on)
    state = compact_snapshot(s) if compact else state_to_dict(s)
    return SnapshotView(m.ClusterSnapshot(cluster="t", seq=seq, time=1.0, state=state,
                                          pending=[to_dict(P)] if pending else [], epoch=epoch))


def held(node: str = "a", bound: bool = False, since: float = 0.0, epoch: str = "e1",
         bound_epoch: str | None = None, bound_seq: int = 0) -> Held:
    d = m.Decision(decision_id="d1", cluster="t", namespace="default", pod_key=P.key, node=node, policy="fgd",
                   mode="full", seen_at=0.0, decided_at=0.0)
    return Held(d, None, epoch, since, bound=bound, bound_epoch=(epoch if bound_epoch is None else bound_epoch)
                if bound else "", bound_seq=bound_seq)


@pytest.mark.parametrize("h,after,bound_by,want", [
    (held(), view(0), None, REWARD),  # bound where it was decided
    (held(), view(0, compact=True), None, REWARD),  # the same in a compact snapshot
    (held(), view(0), "d1", REWARD),  # ... and the event named it
    (held(), view(0), "d0", "duplicate"),  # another decision of the same pod bound it
    (held(), view(1), None, "bound_elsewhere"),
    (held(), view(pending=True), None, WAIT),  # not applied yet
    (held(since=-61.0), view(pending=True), None, "unsettled"),  # pending for longer than settle_seconds
    (held(), view(), None, "not_bound"),  # neither pending nor bound: never bound by this decision
    (held(bound=True), view(), "d1", REWARD),  # bound (the event says) and departed before the snapshot
    (held(), view(0, epoch="e2"), None, "cluster_restarted"),  # the cluster it was made for is gone
    (held(bound=True), view(0, epoch="e2"), None, REWARD),  # ... after binding it: bound is bound
    # redelivered to a restarted process, its snapshots of the new cluster: the pod_bound event read back decides
    (held(epoch="e2", bound=True, bound_epoch="e1"), view(epoch="e2"), None, REWARD),
    (held(epoch="e2", bound=True, bound_epoch="e1"), view(0, epoch="e2"), "d7", REWARD),  # a namesake in e2
    (held(bound=True), view(1), "d1", "bound_elsewhere"),
    # the pod_bound event's sequence number: a snapshot after it settles, wherever the pod is by then
    (held(bound=True, bound_seq=5), view(pending=True, seq=6), "d1", REWARD),  # evicted, pending again
    (held(bound=True, bound_seq=5, since=-61.0), view(pending=True, seq=4), "d1", WAIT),  # taken before the bind
    (held(bound=True, bound_seq=5), view(1, seq=6), "d9", REWARD),  # bound again, elsewhere, by another decision
    (held(bound=True, bound_seq=5), view(seq=6), "d1", REWARD),  # finished and gone
    (held(epoch=""), view(0, epoch="e2"), None, REWARD),  # arrived before any snapshot: no epoch to compare
    (held(node=""), view(pending=True), None, REWARD),  # unschedulable: nothing to bind, rewarded at once
])
def test_verdict(h, after, bound_by, want):
    assert verdict(h, after, now=0.0, settle_seconds=60.0, bound_by=bound_by) == want


def test_the_snapshot_a_decision_was_made_on():
    a, b, c = view(epoch="a"), view(epoch="b"), view(epoch="c")
    history = [(10.0, a), (11.0, b), (12.0, c)]
    assert snapshot_before(history, 11.5, now=20.0, late_seconds=5.0) == (b, False)  # the newest before it
    assert snapshot_before(history, 12.0, now=20.0, late_seconds=5.0) == (c, False)
    assert snapshot_before(history, 99.0, now=99.0, late_seconds=5.0) == (c, False)
    assert snapshot_before(history, 6.0, now=20.0, late_seconds=5.0) == (a, False)  # a snapshot racing it
    assert snapshot_before(history, 4.0, now=20.0, late_seconds=5.0) == (None, True)  # older than all kept
    assert snapshot_before([], 18.0, now=20.0, late_seconds=5.0) == (None, False)  # none yet: no_snapshot
    assert snapshot_before([], 10.0, now=20.0, late_seconds=5.0) == (None, True)
