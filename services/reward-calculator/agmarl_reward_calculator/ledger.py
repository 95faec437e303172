"""The decisions a reward-calculator holds until it knows whether they were bound. Pure (no I/O, no clock).

A decision is rewarded once a snapshot shows its pod bound on the node it chose (or a ``pod_bound`` event
named it and the pod is gone since); it is dropped unrewarded when the bind was refused (``bind_rejected``),
another decision bound the pod (a duplicate), the snapshot shows the pod elsewhere or not at all, the
cluster restarted (a new snapshot epoch), or it stayed pending for ``settle_seconds``. An unschedulable
decision (no node) binds nothing and is rewarded on the first snapshot after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agmarl_common.runtime import messages as m
from agmarl_reward_calculator.transition import SnapshotView

REWARD, WAIT = "reward", "wait"


@dataclass
class Held:
    """One decision waiting for its outcome."""

    decision: m.Decision
    before: SnapshotView | None  # the last snapshot before it arrived: the cluster it was made on
    epoch: str  # that snapshot's epoch ("" when none): a later snapshot of another epoch is another cluster
    since: float  # when it arrived (monotonic seconds)
    delivery: Any = None  # the JetStream delivery, acked once the decision is settled
    bound: bool = False  # a pod_bound event named this decision


def verdict(held: Held, after: SnapshotView, now: float, settle_seconds: float, bound_by: str | None = None) -> str:
    """REWARD, WAIT, or why the decision is dropped unrewarded. ``bound_by``: the decision a ``pod_bound``
    event said bound this pod (None when no event was seen)."""
    d = held.decision
    if not d.node:
        return REWARD
    if held.epoch and after.epoch != held.epoch:
        return "cluster_restarted"
    if bound_by is not None and bound_by != d.decision_id:
        return "duplicate"
    where = after.placement(d.pod_key)
    if where == d.node or (held.bound and where is None):  # bound as decided (and perhaps departed since)
        return REWARD
    if where == "":  # still pending: the bind is not applied yet
        return WAIT if now - held.since < settle_seconds else "unsettled"
    return "not_bound" if where is None else "bound_elsewhere"
