"""Batch placement for the second scheduler, the pure core: joint decisions and the ledger.

``decide_batch(pods, state, policy)`` places a whole batch of pending pods jointly:
1. every pod (agent) proposes: its candidate nodes after the hard filter (and the policy's own
   admission, ``policies.base.admitted``) against the batch's starting state, ranked by the policy's
   scores (ties -> lower node index); a policy with ``score_batch`` scores the whole batch in one pass;
2. the arbiter walks the batch in a fixed order (``batch_order``) -- higher priority first, then the largest
   request (GPU milli, cpu, memory), then age and name; for a policy with local scores (below) kube-scheduler's
   queue order, priority then arrival -- and gives each pod its best proposal that still
   passes ``filters.filter_node`` (and the policy's admission) against the state updated by the
   earlier picks (and has GPU devices), binding it into that state. The batch is therefore
   conflict-free: no node is ever over-committed and no pod goes to a node that fails the hard filter.
   A policy whose score of a node depends only on the pod and that node (``local_scores``: FGD,
   fgd-pack, kube-resources, most-allocated) has each pod's proposals brought up to the updated state
   first: the nodes earlier picks took are scored again (the others' scores have not changed), so its
   batch places every pod exactly as deciding them one at a time in queue order would. Other
   policies' proposals keep the starting state's scores (a node taken earlier is re-checked, not
   re-scored).

``Ledger`` keeps every pod the binder was given in exactly one status -- queued, binding, bound,
unschedulable or gone -- with attempts and the last reason, so nothing is lost between a decision,
a failed binding and the next batch. No I/O, no clocks: times come in as arguments.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agmarl_common.core.cluster.filters import feasible_mask, feasible_nodes, filter_node
from agmarl_common.core.cluster.model import ClusterState, Pod, bind
from agmarl_common.core.policies.base import Policy, admission_reason, admitted, normalise_scores

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


def queue_key(pod: Pod) -> tuple:
    """kube-scheduler's queue order (PrioritySort): priority, then the time the pod entered the queue, which is
    the order the pods are given in (the ledger: the oldest announcement first), kept by the stable sort."""
    return (-pod.priority,)


def _local(policy: Policy | None) -> bool:
    """``policy`` declares local node scores (``PolicyBase.local_scores``; a policy not built on it: no)."""
    return bool(getattr(policy, "local_scores", False))


def batch_order(pods: Iterable[Pod], policy: Policy | None = None) -> list[Pod]:
    """The arbiter's order. For a policy with ``local_scores`` kube-scheduler's queue order (``queue_key``):
    its batch then places every pod as scheduling them one at a time would. Otherwise ``batch_key``: the
    largest request first, which leaves the pods that are hardest to fit the most room while the proposals'
    scores are those of the batch's starting state."""
    return sorted(pods, key=queue_key if _local(policy) else batch_key)


HEAD = 8  # proposals each pod sorts up front; the rest only when the arbiter gets that far


class Ranking(Sequence):
    """One pod's proposals, best first: ``(node index, score 0..100)`` items, score descending, ties ->
    lower node index. Sorted lazily: the first ``HEAD`` up front (a partial sort), the rest when asked."""

    __slots__ = ("idx", "raw", "scores", "_head", "_order")

    def __init__(self, idx: np.ndarray, raw: np.ndarray):
        self.idx = np.asarray(idx, dtype=np.int64)
        self.raw = np.asarray(raw, dtype=float)
        self.scores = normalise_scores(self.raw)
        self._order: np.ndarray | None = None
        self._head = self._best(HEAD)

    def _sort(self, pos: np.ndarray) -> np.ndarray:
        return pos[np.lexsort((self.idx[pos], -self.scores[pos]))]

    def _best(self, k: int) -> np.ndarray:
        """Positions of the first ``k`` proposals in order: every entry at least as good as the k-th best
        (ties included) sorted, then cut: the same prefix as a full sort."""
        n = self.idx.size
        if n <= k or np.isnan(self.scores).any():
            return self.order()[:k]
        neg = -self.scores
        kth = np.partition(neg, k - 1)[k - 1]
        return self._sort(np.flatnonzero(neg <= kth))[:k]

    def order(self) -> np.ndarray:
        """Positions (into ``idx`` / ``scores``) of every proposal, best first."""
        if self._order is None:
            self._order = self._sort(np.arange(self.idx.size))
        return self._order

    def __len__(self) -> int:
        return int(self.idx.size)

    def __getitem__(self, r):
        if isinstance(r, slice):
            start, stop, step = r.indices(len(self))
            if step == 1 and stop <= self._head.size:
                pos = self._head[start:stop]
            else:
                pos = self.order()[r]
            return list(zip(self.idx[pos].tolist(), self.scores[pos].tolist()))
        if r < 0:
            r += len(self)
        if not 0 <= r < len(self):
            raise IndexError(r)
        o = int(self._head[r]) if r < self._head.size else int(self.order()[r])
        return int(self.idx[o]), float(self.scores[o])

    def next_passing(self, mask: np.ndarray, start: int) -> int:
        """The first rank >= ``start`` whose node passes ``mask`` ((n_nodes,) bool); len(self) if none."""
        if start >= len(self):
            return len(self)
        hits = np.flatnonzero(mask[self.idx[self.order()[start:]]])
        return start + int(hits[0]) if hits.size else len(self)


def propose_all(pods: list[Pod], state: ClusterState, policy: Policy) -> dict[str, Ranking]:
    """Each pod's proposals against the same ``state``: (node index, score 0..100) for every node passing
    the hard filter, best first. A policy with ``score_batch`` (the learned one, the weighted kube
    plugins) scores them all in one pass (one graph, one encoder and one actor run; resource plugins
    as one (pods, nodes) array)."""
    cands = [admitted(policy, p, state, feasible_nodes(p, state)) for p in pods]
    live = [k for k, c in enumerate(cands) if c.size]
    batch = getattr(policy, "score_batch", None)
    if callable(batch) and len(live) > 1:
        raw = batch([pods[k] for k in live], state, [cands[k] for k in live])
    else:
        raw = [policy.score(pods[k], state, cands[k]) for k in live]
    empty = Ranking(np.zeros(0, np.int64), np.zeros(0))
    out: dict[str, Ranking] = {p.key: empty for p in pods}
    same: dict[tuple[bytes, bytes], Ranking] = {}  # pods with equal candidates and scores share one ranking
    for k, r in zip(live, raw):
        r = np.asarray(r, dtype=float)
        key = (cands[k].tobytes(), r.tobytes())
        if key not in same:
            same[key] = Ranking(cands[k], r)
        out[pods[k].key] = same[key]
    return out


def why_not(pod: Pod, state: ClusterState) -> str:
    """kube-scheduler style: '0/3 nodes are available: 2 Insufficient cpu, 1 node(s) had untolerated taint'."""
    reasons = Counter(filter_node(pod, state, i).reason for i in range(state.n_nodes))
    reasons.pop("", None)
    detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"0/{state.n_nodes} nodes are available" + (f": {detail}" if detail else "")


def _pod_terms(pod: Pod) -> bool:
    """The pod's hard filter depends on pods on other nodes (its spread constraints or pod (anti-)affinity)."""
    return bool(pod.topology_spread or pod.pod_affinity or pod.pod_anti_affinity)


def current_ranking(pod: Pod, ranked: Ranking, state: ClusterState, policy: Policy, taken: np.ndarray) -> Ranking:
    """``ranked`` (scored against the batch's starting state) brought up to ``state`` for a policy with
    ``local_scores``: the pod's candidates as the hard filter and the policy's admission give them now, the
    nodes ``taken`` since (and any new candidate) scored again, the others keeping their scores. Equal to
    scoring every candidate against ``state``."""
    cand = admitted(policy, pod, state, feasible_nodes(pod, state))
    known = np.full(state.n_nodes, np.nan)
    known[ranked.idx] = ranked.raw
    raw = known[cand]
    stale = taken[cand] | np.isnan(raw)
    if stale.any():
        raw[stale] = np.asarray(policy.score(pod, state, cand[stale]), dtype=float)
    return Ranking(cand, raw)


def arbitrate(order: list[Pod], proposals: Mapping[str, Sequence[tuple[int, float]]], state: ClusterState,
              policy: Policy, top: int = 5) -> tuple[list[Placement], ClusterState]:
    """Grant each pod (in ``order``) its best proposal that still passes the hard filter in the
    state updated by the earlier grants; returns the placements and that final state.

    Proposals passed the hard filter against the starting state (``propose_all``), so a proposal is
    re-checked only where an earlier grant could have changed the answer: on a node an earlier pod took
    (its resources), and everywhere for a pod whose filter looks at other nodes' pods (spread, pod
    (anti-)affinity) or once an earlier grant carries pod (anti-)affinity terms. Proposals that are not
    ``Ranking``s are checked in full (``filter_node`` on each), as are all of them after a refusal
    (``feasible_mask``, equal to ``filter_node(...).ok`` on every node)."""
    out: list[Placement] = []
    admit = getattr(policy, "admit", None)
    admit = admit if callable(admit) else None
    names = [nd.name for nd in state.nodes]
    taken = np.zeros(state.n_nodes, dtype=bool)  # nodes an earlier grant of this batch went to
    terms_granted = False  # an earlier grant has pod (anti-)affinity terms: other pods' filters may change
    local = _local(policy)
    for position, pod in enumerate(order):
        ranked = proposals.get(pod.key, ())
        trusted = isinstance(ranked, Ranking) and not terms_granted and not _pod_terms(pod)
        if local and isinstance(ranked, Ranking) and len(ranked) and (not trusted or taken[ranked.idx].any()):
            ranked = current_ranking(pod, ranked, state, policy, taken)  # as if decided alone, now
            trusted = True  # its candidates pass the hard filter in this state
        shown = {names[i]: round(s, 3) for i, s in ranked[:top]}
        refused = 0
        placed = None
        ok = None  # after a refusal: the hard filter of every node at once (feasible_mask == filter_node(...).ok)
        rank, n = 0, len(ranked)
        while rank < n:
            i, score = ranked[rank]
            if ok is None:
                fits = (trusted and not taken[i]) or filter_node(pod, state, i).ok
            else:
                fits = bool(ok[i])
            if not fits:
                if ok is None:
                    ok = feasible_mask(pod, state)
                nxt = ranked.next_passing(ok, rank + 1) if isinstance(ranked, Ranking) else rank + 1
                refused += nxt - rank
                rank = nxt
                continue
            if admit is not None and not bool(admit(pod, state, np.array([i]))[0]):
                refused += 1  # earlier grants took this node over the policy's admission limit
                rank += 1
                continue
            gpus = policy.choose_gpus(pod, state, i)
            if gpus is None:
                refused += 1
                rank += 1
                continue
            placed = Placement(pod, names[i], i, tuple(gpus), score, rank, position,
                               f"{refused} better proposal(s) taken by earlier pods in the batch" if refused else "",
                               shown)
            state = bind(state, pod, i, tuple(gpus))
            taken[i] = True
            terms_granted = terms_granted or pod.has_pod_affinity
            break
        if placed is None:
            reason = why_not(pod, state)
            if n:
                reason += f" (after earlier pods in the batch took its {n} candidate(s))"
            elif admit is not None and (fits := int(feasible_mask(pod, state).sum())):
                reason = (f"{fits}/{state.n_nodes} nodes pass the hard filter, "
                          f"none admits the pod: {admission_reason(policy, pod)}")
            placed = Placement(pod, "", order=position, reason=reason, scores=shown)
        out.append(placed)
    return out, state


def decide_batch(pods: Iterable[Pod], state: ClusterState, policy: Policy) -> tuple[list[Placement], ClusterState]:
    """Joint placement of ``pods`` (see the module docstring); placements in the arbiter's order."""
    order = batch_order(pods, policy)
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
    """Every pod given to the binder, in exactly one status (``STATUSES``). The pods waiting for a batch
    (queued or unschedulable) and the count per status are kept as the statuses move, so the binder's
    per-message and per-batch questions (``due``, ``n_due``, ``counts``) never walk the bound pods."""

    WAITING = ("queued", "unschedulable")

    def __init__(self, history: int = 20):
        self.entries: dict[str, Entry] = {}
        self._history = history
        self._waiting: dict[str, Entry] = {}  # queued or unschedulable
        self._counts = dict.fromkeys(STATUSES, 0)

    def _move(self, e: Entry, status: str, reason: str = "") -> None:
        self._counts[e.status] -= 1
        self._counts[status] += 1
        if status in self.WAITING:
            self._waiting[e.pod.key] = e
        else:
            self._waiting.pop(e.pod.key, None)
        e.status, e.reason = status, reason
        e.history.append(status if not reason else f"{status}: {reason}")
        del e.history[: -self._history]

    def offer(self, pod: Pod, seen_at: float) -> bool:
        """A pending pod announced (again). New -> queued. A pod we think is bound or gone but is
        announced pending again (binding lost, pod recreated) is queued again; binding ones keep going."""
        e = self.entries.get(pod.key)
        if e is None:
            self.entries[pod.key] = self._waiting[pod.key] = e = Entry(pod, seen_at=seen_at)
            self._counts["queued"] += 1
            e.history.append("queued")
            return True
        if e.status in ("bound", "gone") and seen_at > e.seen_at:
            e.pod, e.seen_at, e.attempts, e.node = pod, seen_at, 0, ""
            self._move(e, "queued", "announced pending again")
            return True
        if e.status in self.WAITING:
            e.pod = pod
        return False

    def due(self, now: float, limit: int) -> list[Pod]:
        """Queued or unschedulable pods whose wait is over, oldest first, at most ``limit``."""
        ready = [e for e in self._waiting.values() if e.not_before <= now]
        return [e.pod for e in heapq.nsmallest(limit, ready, key=lambda e: (e.seen_at, e.pod.key))]

    def n_due(self, now: float) -> int:
        """How many pods ``due(now, ...)`` could give."""
        return sum(1 for e in self._waiting.values() if e.not_before <= now)

    def next_due(self) -> float | None:
        """The earliest time a waiting pod is due (None: none waits)."""
        return min((e.not_before for e in self._waiting.values()), default=None)

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
        return dict(self._counts)

    def with_status(self, status: str) -> list[str]:
        return sorted(k for k, e in self.entries.items() if e.status == status)
