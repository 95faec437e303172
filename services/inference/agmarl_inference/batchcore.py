"""Batch placement for the second scheduler, the pure core: joint decisions and the ledger.

``decide_batch(pods, state, policy)`` places a whole batch of pending pods jointly:
1. every pod (agent) proposes: its candidate nodes after the hard filter (and the policy's own
   admission, ``policies.base.admitted``) against the batch's starting state, ranked by the policy's
   scores (ties -> lower node index); a policy with ``score_batch`` scores the whole batch in one pass;
2. the arbiter walks the batch in a fixed order -- higher priority first, then the largest request
   (GPU milli, cpu, memory), then age and name -- and gives each pod its best proposal that still
   passes ``filters.filter_node`` (and the policy's admission) against the state updated by the
   earlier picks (and has GPU devices), binding it into that state. The batch is therefore
   conflict-free: no node is ever over-committed and no pod goes to a node that fails the hard filter.

``Ledger`` keeps every pod the binder was given in exactly one status -- queued, binding, bound,
unschedulable or gone -- with attempts and the last reason, so nothing is lost between a decision,
a failed binding and the next batch. No I/O, no clocks: times come in as arguments.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from agmarl_common.cluster.filters import feasible_mask, feasible_nodes, filter_node
from agmarl_common.cluster.model import ClusterState, Pod, bind
from agmarl_common.policies.base import Policy, admission_reason, admitted, normalise_scores

STATUSES = ("queued", "binding", "bound", "unschedulable", "gone")


@dataclass(frozen=True)
class Placement:
    pod: Pod
    node: str  # "" = no feasible node left for it
    node_index: int = -1
    gpus: tuple[int, ...] = ()
    score: float = 0.0
    rank: int = -1  # which of the pod's own proposals it got (0 = its first choice)
    order: int = 0  # position in the arbiter's order
    reason: str = ""  # why no node (or which proposals the arbiter refused)
    scores: dict[str, float] = field(default_factory=dict)  # the pod's top proposals


def batch_key(pod: Pod) -> tuple:
    """The arbiter's order: priority, then the largest request first, then the oldest, then the name."""
    return (-pod.priority, -pod.gpu_milli_total, -pod.cpu_milli, -pod.memory_mib, pod.creation_time, pod.key)


def batch_order(pods: Iterable[Pod]) -> list[Pod]:
    return sorted(pods, key=batch_key)


def _ranked(idx: np.ndarray, raw: np.ndarray) -> list[tuple[int, float]]:
    scores = normalise_scores(np.asarray(raw, dtype=float))
    order = np.lexsort((idx, -scores))  # score descending, ties -> lower index
    return list(zip(idx[order].tolist(), scores[order].tolist()))


def propose_all(pods: list[Pod], state: ClusterState, policy: Policy) -> dict[str, list[tuple[int, float]]]:
    """Each pod's proposals against the same ``state``: (node index, score 0..100) for every node passing
    the hard filter, best first. A policy with ``score_batch`` (the learned one) scores them all in one
    pass (one graph, one encoder and one actor run)."""
    cands = [admitted(policy, p, state, feasible_nodes(p, state)) for p in pods]
    live = [k for k, c in enumerate(cands) if c.size]
    batch = getattr(policy, "score_batch", None)
    if callable(batch) and len(live) > 1:
        raw = batch([pods[k] for k in live], state, [cands[k] for k in live])
    else:
        raw = [policy.score(pods[k], state, cands[k]) for k in live]
    out: dict[str, list[tuple[int, float]]] = {p.key: [] for p in pods}
    for k, r in zip(live, raw):
        out[pods[k].key] = _ranked(cands[k], r)
    return out


def why_not(pod: Pod, state: ClusterState) -> str:
    """kube-scheduler style: '0/3 nodes are available: 2 Insufficient cpu, 1 node(s) had untolerated taint'."""
    reasons = Counter(filter_node(pod, state, i).reason for i in range(state.n_nodes))
    reasons.pop("", None)
    detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"0/{state.n_nodes} nodes are available" + (f": {detail}" if detail else "")


def arbitrate(order: list[Pod], proposals: dict[str, list[tuple[int, float]]], state: ClusterState,
              policy: Policy, top: int = 5) -> tuple[list[Placement], ClusterState]:
    """Grant each pod (in ``order``) its best proposal that still passes the hard filter in the
    state updated by the earlier grants; returns the placements and that final state."""
    out: list[Placement] = []
    admit = getattr(policy, "admit", None)
    admit = admit if callable(admit) else None
    for position, pod in enumerate(order):
        ranked = proposals.get(pod.key, [])
        shown = {state.nodes[i].name: round(s, 3) for i, s in ranked[:top]}
        refused = 0
        placed = None
        ok = None  # after a refusal: the hard filter of every node at once (feasible_mask == filter_node(...).ok)
        for rank, (i, score) in enumerate(ranked):
            fits = filter_node(pod, state, i).ok if ok is None else bool(ok[i])
            if not fits:
                refused += 1
                if ok is None:
                    ok = feasible_mask(pod, state)
                continue
            if admit is not None and not bool(admit(pod, state, np.array([i]))[0]):
                refused += 1  # earlier grants took this node over the policy's admission limit
                continue
            gpus = policy.choose_gpus(pod, state, i)
            if gpus is None:
                refused += 1
                continue
            placed = Placement(pod, state.nodes[i].name, i, tuple(gpus), score, rank, position,
                               f"{refused} better proposal(s) taken by earlier pods in the batch" if refused else "",
                               shown)
            state = bind(state, pod, i, tuple(gpus))
            break
        if placed is None:
            reason = why_not(pod, state)
            if ranked:
                reason += f" (after earlier pods in the batch took its {len(ranked)} candidate(s))"
            elif admit is not None and (fits := int(feasible_mask(pod, state).sum())):
                reason = (f"{fits}/{state.n_nodes} nodes pass the hard filter, "
                          f"none admits the pod: {admission_reason(policy, pod)}")
            placed = Placement(pod, "", order=position, reason=reason, scores=shown)
        out.append(placed)
    return out, state


def decide_batch(pods: Iterable[Pod], state: ClusterState, policy: Policy) -> tuple[list[Placement], ClusterState]:
    """Joint placement of ``pods`` (see the module docstring); placements in the arbiter's order."""
    order = batch_order(pods)
    proposals = propose_all(order, state, policy)
    return arbitrate(order, proposals, state, policy)


# ---------------------------------------------------------------------------------------------
# The ledger


@dataclass
class Entry:
    pod: Pod
    status: str = "queued"
    seen_at: float = 0.0  # first announcement (collector clock)
    not_before: float = 0.0  # queued/unschedulable: not in a batch before this time
    node: str = ""  # binding/bound: the node
    attempts: int = 0  # binding attempts for the current placement
    releases: int = 0  # placements given back to the queue after failed bindings
    reason: str = ""
    history: list[str] = field(default_factory=list)  # status transitions, newest last (bounded)


class Ledger:
    """Every pod given to the binder, in exactly one status (``STATUSES``)."""

    def __init__(self, history: int = 20):
        self.entries: dict[str, Entry] = {}
        self._history = history

    def _move(self, e: Entry, status: str, reason: str = "") -> None:
        e.status, e.reason = status, reason
        e.history.append(status if not reason else f"{status}: {reason}")
        del e.history[: -self._history]

    def offer(self, pod: Pod, seen_at: float) -> bool:
        """A pending pod announced (again). New -> queued. A pod we think is bound or gone but is
        announced pending again (binding lost, pod recreated) is queued again; binding ones keep going."""
        e = self.entries.get(pod.key)
        if e is None:
            self.entries[pod.key] = e = Entry(pod, seen_at=seen_at)
            e.history.append("queued")
            return True
        if e.status in ("bound", "gone") and seen_at > e.seen_at:
            e.pod, e.seen_at, e.attempts, e.node = pod, seen_at, 0, ""
            self._move(e, "queued", "announced pending again")
            return True
        if e.status in ("queued", "unschedulable"):
            e.pod = pod
        return False

    def due(self, now: float, limit: int) -> list[Pod]:
        """Queued or unschedulable pods whose wait is over, oldest first, at most ``limit``."""
        ready = [e for e in self.entries.values() if e.status in ("queued", "unschedulable") and e.not_before <= now]
        ready.sort(key=lambda e: (e.seen_at, e.pod.key))
        return [e.pod for e in ready[:limit]]

    def binding(self, key: str, node: str) -> None:
        e = self.entries[key]
        e.node, e.attempts = node, 0
        self._move(e, "binding", node)

    def attempt_failed(self, key: str, reason: str) -> int:
        e = self.entries[key]
        e.attempts += 1
        e.reason = reason
        e.history.append(f"attempt {e.attempts} failed: {reason}")
        del e.history[: -self._history]
        return e.attempts

    def bound(self, key: str) -> None:
        self._move(self.entries[key], "bound", self.entries[key].node)

    def release(self, key: str, reason: str, not_before: float) -> None:
        """Give a placement back: the pod is queued again (after ``not_before``) for a fresh decision."""
        e = self.entries[key]
        e.releases += 1
        e.node, e.not_before = "", not_before
        self._move(e, "queued", reason)

    def unschedulable(self, key: str, reason: str, not_before: float) -> None:
        e = self.entries[key]
        e.not_before = not_before
        self._move(e, "unschedulable", reason)

    def gone(self, key: str, reason: str) -> None:
        self._move(self.entries[key], "gone", reason)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for e in self.entries.values():
            out[e.status] += 1
        return out

    def with_status(self, status: str) -> list[str]:
        return sorted(k for k, e in self.entries.items() if e.status == status)
