"""Which held decisions are rewarded (pure): bound as decided, or named by pod_bound and gone since; the rest
waits while pending, or is dropped with the reason."""

from __future__ import annotations

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.core.cluster.compact import compact_snapshot
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, state_to_dict, to_dict
from agmarl_reward_calculator.ledger import REWARD, WAIT, Held, verdict
from agmarl_reward_calculator.transition import SnapshotView

NODES = (Node("a", 2000, 2048), Node("b", 2000, 2048))
P = Pod("p", 500, 512)


def view(bound_on: int | None = None, pending: bool = False, epoch: str = "e1", compact: bool = False) -> SnapshotView:
    s = ClusterState.empty(NODES)
    if bound_on is not None:
        s = bind(s, P, bound_on)
    state = compact_snapshot(s) if compact else state_to_dict(s)
    return SnapshotView(m.ClusterSnapshot(cluster="t", seq=1, time=1.0, state=state,
                                          pending=[to_dict(P)] if pending else [], epoch=epoch))


def held(node: str = "a", bound: bool = False, since: float = 0.0, epoch: str = "e1") -> Held:
    d = m.Decision(decision_id="d1", cluster="t", namespace="default", pod_key=P.key, node=node, policy="fgd",
                   mode="full", seen_at=0.0, decided_at=0.0)
    return Held(d, None, epoch, since, bound=bound)


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
    (held(epoch=""), view(0, epoch="e2"), None, REWARD),  # arrived before any snapshot: no epoch to compare
    (held(node=""), view(pending=True), None, REWARD),  # unschedulable: nothing to bind, rewarded at once
])
def test_verdict(h, after, bound_by, want):
    assert verdict(h, after, now=0.0, settle_seconds=60.0, bound_by=bound_by) == want
