"""The decisions a reward-calculator holds until it knows whether they were bound. Pure (no I/O, no clock).

A decision is rewarded once a snapshot shows its pod bound on the node it chose, or once a ``pod_bound`` event
named it and a snapshot taken after that event (a larger sequence number in the same epoch, wherever the pod is
by then) or one of a later epoch came: the event is the durable record, read back from the EVENTS stream by a
restarted reward-calculator. It is dropped unrewarded when the bind was refused (``bind_rejected``), another
decision bound the pod (a duplicate), the snapshot shows the pod elsewhere or not at all and no event said it
was bound, the cluster restarted (a new snapshot epoch) before it was bound, or it stayed pending for
``settle_seconds``. An unschedulable decision (no node) binds nothing and is rewarded on the first snapshot
after it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agmarl_common.runtime import messages as m
from agmarl_reward_calculator.transition import SnapshotView

REWARD, WAIT = "reward", "wait"


@dataclass
class Held:
    """One decision waiting for its outcome."""

    decision: m.Decision
    before: SnapshotView | None  # the last snapshot before it was decided: the cluster it was made on
    epoch: str  # that snapshot's epoch ("" when none): a later snapshot of another epoch is another cluster
    since: float  # when it arrived (monotonic seconds)
    delivery: Any = None  # the JetStream delivery, acked once the decision is settled
    bound: bool = False  # a pod_bound event named this decision
    bound_epoch: str = ""  # the epoch of that event (the cluster the pod was bound in)
    bound_seq: int = 0  # that event's sequence number (a snapshot with a larger one was taken after the bind)
    late: bool = False  # no snapshot from before it is left (a late redelivery): its experience has no cluster
    stream_seq: int = 0  # its sequence number in DECISIONS (0: unknown)


def verdict(held: Held, after: SnapshotView, now: float, settle_seconds: float, bound_by: str | None = None) -> str:
    """REWARD, WAIT, or why the decision is dropped unrewarded. ``bound_by``: the decision a ``pod_bound``
    event said bound this pod in ``after``'s epoch (None when no event was seen)."""
    d = held.decision
    if not d.node:
        return REWARD
    if held.bound and held.bound_epoch and after.epoch != held.bound_epoch:
        return REWARD  # bound (the event says) in a cluster that has restarted since: nothing left to look at
    if held.bound and held.bound_seq and after.epoch == held.bound_epoch:
        # events and snapshots share one sequence: a later snapshot includes the bind, wherever the pod is now
        # (finished and gone, evicted and pending again, bound again by another decision)
        return REWARD if after.seq > held.bound_seq else WAIT
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


def snapshot_before(history: Sequence[tuple[float, SnapshotView]], decided_at: float, now: float,
                    late_seconds: float) -> tuple[SnapshotView | None, bool]:
    """(the snapshot a decision made at ``decided_at`` was made on, late) from ``history`` ((wall time received,
    view), oldest first): the newest received at or before ``decided_at``; else the oldest when it came at most
    ``late_seconds`` after (a snapshot racing the decision); else (None, True): the decision is older than every
    snapshot kept (a redelivery to a restarted process), the cluster it was made on is not known. With no
    snapshot yet, (None, late) where late means ``decided_at`` is more than ``late_seconds`` before ``now``."""
    prior = [view for received, view in history if received <= decided_at]
    if prior:
        return prior[-1], False
    if history:
        received, oldest = history[0]
        return (oldest, False) if received - decided_at <= late_seconds else (None, True)
    return None, now - decided_at > late_seconds
