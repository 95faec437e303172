"""reward-calculator: each bound decision is rewarded from the first snapshot that shows it bound.

Components come from ``agmarl_common.core.reward`` (the one definition the trainer uses too), the total from the
weighting scheme named in the settings (fixed | load_conditional | lexicographic). The window a reward covers
runs from the previous snapshot settled on to this one (counter deltas; the pending time is the mean age of the
pods still waiting): snapshots are settled on one at a time, the newest first, so a reward-calculator running
behind skips the snapshots that came meanwhile (``settle_loop``). Each reward is published with every component,
and an experience transition (the compact cluster state the decision was made on, the pod and the node it chose,
the reward, a reference to the snapshot after; see ``transition``) goes to the EXPERIENCE JetStream stream with
the decision id as message id, so a decision rewarded twice is stored once.

Delivery: decisions come from a durable consumer on DECISIONS and are acked only once settled (experience
published, or dropped unrewarded: see ``ledger``), so a decision this process held when it was killed is
redelivered to the next one after ``decision_ack_wait``. Whether a decision was bound is learnt from the
state-collector's ``pod_bound`` / ``bind_rejected`` events (refused binds are never rewarded), not only from whether a
later snapshot still shows the pod: a process first reads the events of the last ``outcome_lookback_seconds``
back from the EVENTS stream, then follows it (``follow_outcomes``), so a decision the killed process had not
settled is rewarded even when its pod has finished and left the cluster before it comes again, and an outcome
published while this process was cut off from NATS is not missed. Settling waits until the lookback is read. A
snapshot newer than a decision's ``pod_bound`` event settles it, wherever the pod is since (finished, evicted
and pending again, bound again by another decision). At SIGTERM the bound decisions still held get
``flush_seconds`` for a snapshot, then are written against the last snapshot (``state.missing =
"next_snapshot"``); the others stay unacked for the next process.

The state a transition records is the newest of the last ``snapshot_history`` snapshots received before the
decision was made (``decided_at``), so a reward-calculator running behind still pairs a decision with the
cluster it was made on; a decision older than every snapshot kept by more than ``late_seconds`` (a redelivery to
a restarted process) is written without a cluster state (``state.missing = "late"``) rather than with a wrong
one.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections import OrderedDict, deque
from typing import Any

from nats.js.errors import NotFoundError

from prometheus_client import Counter, Gauge

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import KIND_HEADER
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.reward import RewardScheme, outcomes_from_stats, scheme_reward
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_common.runtime.settings import load_settings
from agmarl_reward_calculator.ledger import REWARD, WAIT, Held, snapshot_before, verdict
from agmarl_reward_calculator.settings import RewardSettings
from agmarl_reward_calculator.transition import SnapshotView, decision_credit, encoded_experience

SERVICE = "reward-calculator"
PUBLISH_CHUNK = 256  # experiences published at once (their JetStream acks awaited together)
FOLLOW_SLACK = 0.5  # seconds: how far the EVENTS follower's "caught up" time is taken back (delivery, clocks)
NEGATIVE = frozenset({"not_bound", "bound_elsewhere", "duplicate"})  # verdicts an unseen pod_bound would change
BINDER = "state-collector"  # whose decision consumer acks a decision once its outcome event is stored


def _stream_seq(delivery: Any) -> int:
    """A JetStream delivery's sequence number in its stream (0 when unknown)."""
    try:
        return int(delivery.metadata.sequence.stream)
    except Exception:  # noqa: BLE001 - not a JetStream message (tests), or no metadata
        return 0


def scheme_of(settings: RewardSettings) -> RewardScheme:
    return RewardScheme(settings.scheme, load_threshold=settings.load_threshold, stress_load=settings.stress_load,
                        stress_sla=settings.stress_sla)


def mean_pending_age(pending: list[dict], now: float) -> float:
    """Mean ``now - creation_time`` of the waiting pods (0 when none)."""
    ages = [max(0.0, now - float(p.get("creation_time", now))) for p in pending]
    return sum(ages) / len(ages) if ages else 0.0


class RewardApp:
    def __init__(self, rt: ServiceRuntime, settings: RewardSettings):
        self.rt = rt
        self.settings = settings
        self.scheme = scheme_of(settings)
        # each experience's own credit is measured against this policy's placement (None: credit off)
        self.credit_reference = get_policy(settings.credit_reference) if settings.credit_reference else None
        self.waiting: OrderedDict[str, Held] = OrderedDict()  # decision id -> decision held until settled
        self.settled: OrderedDict[str, str] = OrderedDict()  # decision id -> how (a redelivery is acked at once)
        # decision id -> ("bound" | "refused", the event's epoch, its seq), from events (live, and from EVENTS)
        self.outcomes: OrderedDict[str, Any] = OrderedDict()
        self.outcomes_seen = 0  # bind outcomes recorded since start (live and read back; health: "outcomes_seen")
        self.bound_by: OrderedDict[str, str] = OrderedDict()  # "<epoch>/<pod key>" -> the decision that bound it
        # decision id -> the pod its pod_bound event carried (for a pod that left before a snapshot showed it)
        self.bound_pods: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.history: deque[tuple[float, SnapshotView]] = deque(maxlen=max(1, settings.snapshot_history))
        self.recalled = asyncio.Event()  # set once the outcomes of the lookback are read back (settling waits)
        # how far the EVENTS follower has read: (epoch, seq) of its last event, and a wall time before which
        # every stored event has reached it; None: it is not running (judge on snapshots and live events alone)
        self.followed: tuple[str, int] | None = None
        self.caught_up_at = 0.0
        # decision id -> (why it would be dropped, the snapshot that showed it): judged before the EVENTS follower
        # had read past that snapshot, so dropped only once it has (and no pod_bound named it meanwhile)
        self.negatives: dict[str, tuple[str, SnapshotView]] = {}
        self.settling = asyncio.Lock()  # one _settle at a time (snapshots, the follower, the flush)
        # the binder's (the state-collector's decision consumer) ack floor on DECISIONS and when it was read: a
        # decision at or below it has its outcome event stored in EVENTS already; None: not read yet; "none":
        # there is no binder consumer (snapshots and events decide alone)
        self.binder: tuple[int, float] | str | None = None
        self.last_view: SnapshotView | None = None  # the newest snapshot received
        self.unsettled_view: SnapshotView | None = None  # the newest one not settled on yet (settle_loop takes it)
        self.snapshot_came = asyncio.Event()
        self.settled_stats: dict[str, float] = {}  # the stats of the last snapshot settled on (a window's start)
        self.last_epoch, self.last_seq = "", -1
        self.changed = asyncio.Event()  # set after every settling (the SIGTERM flush waits on it)
        reg = rt.registry
        self.component = Gauge("agmarl_reward_component", "Latest reward component value", ["component"], registry=reg)
        self.total = Gauge("agmarl_reward_total", "Latest total reward", ["scheme"], registry=reg)
        self.rewards = Counter("agmarl_rewards_published_total", "Rewards published", registry=reg)
        self.experiences = Counter("agmarl_experience_published_total",
                                   "Experience transitions published, by what they lack (complete = nothing)",
                                   ["missing"], registry=reg)
        self.unrewarded = Counter("agmarl_decisions_unrewarded_total",
                                  "Decisions settled without a reward, by why (refused, duplicate, not_bound, ...)",
                                  ["reason"], registry=reg)
        self.redelivered = Counter("agmarl_decisions_redelivered_total",
                                   "Decisions delivered again (held past ack_wait, or after a restart)", registry=reg)
        self.credits = Counter("agmarl_experience_credit_total",
                               "Experience credits, computed or why not (budget: over a settling's CPU budget)",
                               ["outcome"], registry=reg)
        self.held_gauge = Gauge("agmarl_decisions_held", "Decisions waiting for their bind outcome", registry=reg)
        self.recalled_total = Counter("agmarl_outcomes_recalled_total",
                                      "Bind outcomes (pod_bound, bind_rejected) read back from EVENTS at start",
                                      ["type"], registry=reg)

    def _remember(self, table: OrderedDict[str, Any], key: str, value: Any, factor: int = 4) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > factor * self.settings.max_waiting:
            table.popitem(last=False)

    async def on_decision(self, msg: m.Decision, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster:
            return
        if msg.decision_id in self.settled:  # settled already: the ack was lost or came late
            self.redelivered.inc()
            return
        if msg.source == m.UNASSISTED:  # kube-scheduler placed it alone: no decision to reward or to learn from
            self._settle_unrewarded(msg.decision_id, m.UNASSISTED)
            return
        held = self.waiting.get(msg.decision_id)
        if held is not None:  # held past ack_wait: keep the newest delivery to ack
            self.redelivered.inc()
            held.delivery = ctx.defer_ack() if ctx.delivery is not None else None
            return
        outcome, outcome_epoch, outcome_seq = self.outcomes.get(msg.decision_id, ("", "", 0))
        if outcome == "refused":  # the bind_rejected event came first
            self._settle_unrewarded(msg.decision_id, "refused")
            return
        if len(self.waiting) >= self.settings.max_waiting:
            old_id = next(iter(self.waiting))
            self.rt.log.warning("too many decisions waiting for a snapshot; dropped reward for %s", old_id)
            await self._ack(self.waiting.pop(old_id), old_id, "overflow")
        before, late = snapshot_before(self.history, msg.decided_at, time.time(), self.settings.late_seconds)
        view = before or self.last_view
        held = Held(msg, before, view.epoch if view is not None else "", time.monotonic(),
                    ctx.defer_ack() if ctx.delivery is not None else None,
                    late=late, stream_seq=_stream_seq(ctx.delivery))
        if outcome == "bound":
            held.bound, held.bound_epoch, held.bound_seq = True, outcome_epoch, outcome_seq
        self.waiting[msg.decision_id] = held
        self.held_gauge.set(len(self.waiting))

    async def on_event(self, msg: m.ClusterEvent, ctx: HandlerContext) -> None:
        await self._outcome(msg)

    async def _outcome(self, msg: m.ClusterEvent) -> bool:
        """Record a bind outcome (live, or read back from EVENTS); False when ``msg`` is none."""
        if msg.cluster != self.settings.cluster or not msg.decision_id:
            return False
        if msg.type in ("pod_bound", "bind_rejected"):
            self.outcomes_seen += 1
        if msg.type == "pod_bound":
            self._remember(self.outcomes, msg.decision_id, ("bound", msg.epoch, msg.seq))
            self._remember(self.bound_by, f"{msg.epoch}/{msg.pod_key}", msg.decision_id)
            if msg.pod:
                self._remember(self.bound_pods, msg.decision_id, msg.pod, factor=1)
            held = self.waiting.get(msg.decision_id)
            if held is not None:
                held.bound, held.bound_epoch, held.bound_seq = True, msg.epoch, msg.seq
        elif msg.type == "bind_rejected":
            self._remember(self.outcomes, msg.decision_id, ("refused", msg.epoch, msg.seq))
            held = self.waiting.pop(msg.decision_id, None)
            if held is not None:
                await self._ack(held, msg.decision_id, "refused")
        else:
            return False
        return True

    async def follow_outcomes(self) -> None:
        """Read the bind outcomes from the EVENTS stream (the durable record of what the state-collector bound or
        refused): first those of the last ``outcome_lookback_seconds`` (published while this process was down,
        or seen only by the process that was killed), then every new one, through an ordered consumer that
        resumes where it was after a NATS restart, so an outcome published while this process was cut off from
        NATS is not missed either (the live subscription does miss it). Snapshots settle decisions once the
        lookback is read (``recalled``), or ``outcome_recall_timeout`` has passed, or the stream cannot be read
        (logged: decisions are then judged on snapshots and live events alone)."""
        s = self.settings
        if s.outcome_lookback_seconds <= 0:
            await self._recalled("off")
            return
        since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=s.outcome_lookback_seconds)
        deadline = time.monotonic() + s.outcome_recall_timeout
        read = recalled = 0
        while not self.rt.stopping:  # the service stopping ends it (a retry would outlive the connection)
            sub = None
            try:
                await self.rt.bus.ensure_stream(subjects.EVENTS)
                sub = await self.rt.bus.follow_since(subjects.event(self.settings.cluster), since)
                info = await sub.consumer_info()
                if self.followed is None:
                    self.followed = ("", 0)
                if info.num_pending == 0 and info.delivered.consumer_seq == 0:
                    await self._recalled(f"no event in the last {s.outcome_lookback_seconds:.0f}s")
                while not self.rt.stopping:
                    try:
                        msg = await sub.next_msg(timeout=1.0)
                    except asyncio.TimeoutError:  # nothing stored for us for a second: caught up
                        self.caught_up_at = max(self.caught_up_at, time.time() - FOLLOW_SLACK)
                        await self.drop_negatives()
                        if not self.recalled.is_set() and time.monotonic() > deadline:
                            await self._recalled(f"timed out after {read} events; the rest is read on")
                        continue
                    read += 1
                    since = msg.metadata.timestamp or since
                    try:
                        event = m.decode(m.ClusterEvent, msg.data)
                    except m.DecodeError:
                        continue
                    if await self._outcome(event):
                        recalled += 1
                        if not self.recalled.is_set():
                            self.recalled_total.labels(type=event.type).inc()
                    if event.cluster == self.settings.cluster:
                        self.followed = (event.epoch, event.seq)
                        await self.drop_negatives()
                    if msg.metadata.num_pending == 0 and msg.metadata.timestamp is not None:
                        self.caught_up_at = max(self.caught_up_at, msg.metadata.timestamp.timestamp() - FOLLOW_SLACK)
                        if not self.recalled.is_set():
                            await self._recalled(f"{recalled} bind outcomes in {read} events")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - degrade to live events until it can be read again
                if self.rt.stopping:
                    return
                self.rt.log.warning("cannot read bind outcomes from %s (%s); retrying in 2 s", subjects.EVENTS.name,
                                    exc)
                self.followed = None  # meanwhile snapshots and live events decide alone
                if not self.recalled.is_set():
                    await self._recalled(f"failed: {exc}")
                await asyncio.sleep(2.0)
            finally:
                if sub is not None:
                    try:
                        await sub.unsubscribe()
                    except Exception:  # noqa: BLE001 - the connection may be gone
                        pass

    async def drop_negatives(self) -> None:
        """The follower has read on: drop the decisions a snapshot it has now read past showed unbound, unless a
        ``pod_bound`` event has named them since (the next snapshot rewards those)."""
        if not self.negatives:
            return
        async with self.settling:
            for did, (reason, view) in list(self.negatives.items()):
                h = self.waiting.get(did)
                if h is None or h.bound:
                    del self.negatives[did]
                elif self.covered(view) and self.binder_done(h):
                    del self.negatives[did]
                    self.waiting.pop(did, None)
                    await self._ack(h, did, reason)

    def binder_done(self, h: Held) -> bool:
        """Whether the binder has acked decision ``h`` (so its outcome event, if any, is stored in EVENTS) and the
        follower has read EVENTS since: then no ``pod_bound`` for it is still to come. True when that cannot be
        known (no binder consumer, no follower, no stream sequence)."""
        if self.followed is None or self.binder == "none" or not h.stream_seq:
            return True
        if not isinstance(self.binder, tuple):
            return False
        floor, at = self.binder
        return h.stream_seq <= floor and self.caught_up_at >= at

    async def watch_binder(self, interval: float = 1.0) -> None:
        """While decisions wait to be dropped: read the binder's ack floor once per ``interval``, then drop
        what it allows."""
        durable = subjects.durable(BINDER, self.settings.cluster)
        while not self.rt.stopping:
            await asyncio.sleep(interval)
            if not self.negatives:
                continue
            try:
                info = await self.rt.bus.js.consumer_info(subjects.DECISIONS.name, durable)
                self.binder = (int(info.ack_floor.stream_seq or 0), time.time() - FOLLOW_SLACK)
            except NotFoundError:
                self.binder = "none"
            except Exception as exc:  # noqa: BLE001 - NATS away: read again next time
                self.rt.log.debug("binder consumer %s: %s", durable, exc)
            await self.drop_negatives()

    def covered(self, view: SnapshotView) -> bool:
        """Whether every event published before ``view`` has been read (so a decision no event named bound was
        not bound): the EVENTS follower is past ``view`` in its sequence, or caught up since ``view`` came. The
        live subscription alone misses what is published while this process reconnects to NATS. True when the
        follower does not run."""
        if self.followed is None:
            return True
        epoch, seq = self.followed
        return (epoch == view.epoch and seq > view.seq) or self.caught_up_at >= view.received

    async def _recalled(self, how: str) -> None:
        """The lookback is read (or given up on): let snapshots settle decisions, starting with the last one."""
        if self.recalled.is_set():
            return
        self.recalled.set()
        self.rt.log.info("bind outcomes of the last %.0fs read back from %s: %s",
                         self.settings.outcome_lookback_seconds, subjects.EVENTS.name, how)
        if self.last_view is not None and self.waiting:
            self.unsettled_view = self.unsettled_view or self.last_view
            self.snapshot_came.set()

    def _settle_unrewarded(self, decision_id: str, reason: str) -> None:
        self.unrewarded.labels(reason=reason).inc()
        self.rt.log.debug("decision %s settled without a reward: %s", decision_id, reason)
        self._remember(self.settled, decision_id, reason)

    async def _ack(self, held: Held, decision_id: str, reason: str = "") -> None:
        """Settle ``held``: ack its delivery; ``reason`` says why it was not rewarded ("" = it was)."""
        if reason:
            self._settle_unrewarded(decision_id, reason)
        else:
            self._remember(self.settled, decision_id, REWARD)
        self.held_gauge.set(len(self.waiting))
        if held.delivery is not None:
            try:
                await held.delivery.ack()
            except Exception as exc:  # noqa: BLE001 - redelivered later and acked at once (settled)
                self.rt.log.warning("ack of decision %s failed: %s", decision_id, exc)

    async def on_snapshot(self, msg: m.ClusterSnapshot, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster or (msg.epoch == self.last_epoch and msg.seq <= self.last_seq):
            return
        self.last_epoch, self.last_seq = msg.epoch, msg.seq
        view = SnapshotView(msg)
        view.received = time.time()
        self.history.append((view.received, view))
        self.last_view = self.unsettled_view = view
        self.snapshot_came.set()

    async def settle_loop(self) -> None:
        """Settle on the newest snapshot, one at a time: while one settling runs, the snapshots that come are
        recorded and only the newest is settled on next (a reward-calculator running behind skips ahead instead
        of working through a queue of old snapshots, which could not settle the decisions bound after them).
        A reward's window runs from the last snapshot settled on to this one."""
        while True:
            await self.snapshot_came.wait()
            self.snapshot_came.clear()
            view, self.unsettled_view = self.unsettled_view, None
            if view is None:
                continue
            before_stats, self.settled_stats = self.settled_stats, dict(view.msg.stats)
            try:
                await self._settle(view, before_stats)
            except Exception:  # noqa: BLE001 - the next snapshot tries again; the log has the traceback
                self.rt.log.exception("settling on snapshot seq %d failed", view.seq)
            finally:
                self.changed.set()

    async def _settle(self, view: SnapshotView, before_stats: dict[str, float],
                      force: frozenset[str] = frozenset()) -> None:
        """Reward what ``view`` shows bound, drop what it shows was not; the rest waits. The decisions in
        ``force`` that are known bound (a ``pod_bound`` event) are rewarded on ``view`` whatever it shows."""
        async with self.settling:
            await self._settle_locked(view, before_stats, force)

    async def _settle_locked(self, view: SnapshotView, before_stats: dict[str, float], force: frozenset[str]) -> None:
        held = list(self.waiting.items())
        if not held or not self.recalled.is_set():  # before the outcomes are read back, "gone" may be "bound"
            return
        now, settle = time.monotonic(), self.settings.settle_seconds
        binders = [self.bound_by.get(f"{view.epoch}/{h.decision.pod_key}") for _, h in held]
        # parsing a large cluster takes a while (~0.3 s for 1,523 nodes): off the event loop
        verdicts = await asyncio.to_thread(
            lambda: [REWARD if did in force and h.bound else verdict(h, view, now, settle, b)
                     for (did, h), b in zip(held, binders)])
        covered = self.covered(view)
        for i, ((did, h), v) in enumerate(zip(held, verdicts)):
            # its pod_bound event may not have reached us yet: dropped once the follower has read past this
            # snapshot and the binder has acked the decision (drop_negatives)
            if v in NEGATIVE and now - h.since < settle and not (covered and self.binder_done(h)):
                self.negatives.setdefault(did, (v, view))
                verdicts[i] = WAIT
        for (did, h), v in zip(held, verdicts):
            if v not in (REWARD, WAIT) and self.waiting.pop(did, None) is not None:
                self.negatives.pop(did, None)
                await self._ack(h, did, v)
        ready = [(did, h) for (did, h), v in zip(held, verdicts) if v == REWARD and did in self.waiting]
        if not ready:
            return
        components, total = await asyncio.to_thread(self.reward_of, view, before_stats)
        for name, value in components.items():
            self.component.labels(component=name).set(value)
        self.total.labels(scheme=self.scheme.name).set(total)
        now_wall, late_after = time.time(), self.settings.late_seconds
        for _, h in ready:  # arrived before any snapshot: the first ones may have raced it (late_seconds)
            if h.before is None and not h.late:
                h.before, h.late = snapshot_before(self.history, h.decision.decided_at, now_wall, late_after)

        # the credits of one settling share a CPU budget: a reward-calculator catching up (a restart, a backlog)
        # writes the rest without credit ({"missing": "budget"}) rather than fall behind the decisions
        credit_until = time.monotonic() + self.settings.credit_budget_seconds

        def transition(did: str, h: Held):
            # the last snapshot came before the bind (a flush at shutdown): say so when nothing else is missing
            stale = did in force and h.decision.node and view.placement(h.decision.pod_key) != h.decision.node
            credit = None
            if self.credit_reference is not None:
                credit = (decision_credit(h.decision, None if h.late else h.before, self.credit_reference,
                                          self.scheme, view, self.bound_pods.get(did))
                          if time.monotonic() < credit_until else {"missing": "budget"})
                self.credits.labels(outcome=credit.get("missing", "computed")).inc()
            return encoded_experience(h.decision, h.before, view, total, self.settings.experience_max_bytes,
                                      h.late, self.bound_pods.get(did), "next_snapshot" if stale else "", credit)

        transitions = await asyncio.to_thread(lambda: [transition(did, h) for did, h in ready])
        # published concurrently (JetStream acks them together), in chunks; a failed one stays held for the
        # next snapshot
        for start in range(0, len(ready), PUBLISH_CHUNK):
            chunk = list(zip(ready, transitions))[start:start + PUBLISH_CHUNK]
            results = await asyncio.gather(
                *(self._publish(h.decision, data, missing, components, total, view.msg.time)
                  for (_, h), (_, missing, data) in chunk), return_exceptions=True)
            for ((did, h), _), result in zip(chunk, results):
                self.negatives.pop(did, None)
                if isinstance(result, BaseException):
                    self.rt.log.warning("experience of %s not published (retried on the next snapshot): %s", did,
                                        result)
                elif self.waiting.pop(did, None) is not None:
                    await self._ack(h, did)

    async def flush(self) -> None:
        """At shutdown: give the bound decisions held now ``flush_seconds`` to be settled by a snapshot, then
        write those still held against the last snapshot. Decisions not known bound, and any that arrive
        meanwhile, stay unacked (redelivered to the next process)."""
        bound = frozenset(did for did, h in self.waiting.items() if h.bound)
        deadline = time.monotonic() + self.settings.flush_seconds
        while any(did in self.waiting for did in bound) and time.monotonic() < deadline:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
        left = frozenset(did for did in bound if did in self.waiting)
        if left and self.last_view is not None:
            self.rt.log.info("flushing %d bound decisions against the last snapshot", len(left))
            await self._settle(self.last_view, self.settled_stats, force=left)
        if self.waiting:
            self.rt.log.info("%d decisions left unacked for the next reward-calculator", len(self.waiting))

    def reward_of(self, view: SnapshotView, before_stats: dict[str, float]) -> tuple[dict[str, float], float]:
        """Components and total of the window from the previous snapshot (``before_stats``) to ``view``."""
        msg = view.msg
        outcomes = outcomes_from_stats(before_stats, msg.stats, mean_pending_age(msg.pending, msg.time))
        return scheme_reward(view.cluster_state(), outcomes, self.scheme)

    async def _publish(self, d: m.Decision, experience_bytes: bytes, missing: str, components: dict[str, float],
                       total: float, sim_time: float) -> None:
        cluster = self.settings.cluster
        await self.rt.publish(subjects.reward(cluster), m.Reward(
            decision_id=d.decision_id, cluster=cluster, components=components, total=total,
            scheme=self.scheme.name, time=sim_time))
        if missing:
            self.rt.log.debug("experience %s lacks %s", d.decision_id, missing)
        await self.rt.publish(subjects.experience(cluster), experience_bytes,  # type: ignore[arg-type]
                              js=True, msg_id=d.decision_id, headers={KIND_HEADER: m.Experience.KIND})
        self.experiences.labels(missing=missing or "complete").inc()
        self.rewards.inc()


async def main() -> int:
    settings = load_settings(RewardSettings)
    rt = ServiceRuntime(SERVICE, settings)
    app = RewardApp(rt, settings)
    rt.handle(subjects.snapshot(settings.cluster), m.ClusterSnapshot)(app.on_snapshot)
    rt.handle(subjects.event(settings.cluster), m.ClusterEvent)(app.on_event)
    # acked once settled: a decision held by a process that dies is redelivered after decision_ack_wait
    rt.handle_stream(subjects.DECISIONS, subjects.decision_wildcard(settings.cluster),
                     subjects.durable(SERVICE, settings.cluster), m.Decision, ack_wait=settings.decision_ack_wait,
                     deliver_new=True, max_ack_pending=settings.max_waiting)(app.on_decision)
    rt.on_stop(app.flush)
    rt.health_details = lambda: {"snapshot_epoch": app.last_epoch, "snapshot_seq": app.last_seq,
                                 "held": len(app.waiting), "outcomes_read": app.recalled.is_set(),
                                 "outcomes_seen": app.outcomes_seen,
                                 "outcomes_followed_seq": app.followed[1] if app.followed else None}
    await rt.start()
    # in the background: SIGTERM is handled (flush) from the moment the service reports healthy
    rt.spawn(rt.bus.ensure_streams(), name="ensure-streams")
    rt.spawn(app.follow_outcomes(), name="follow-outcomes")
    rt.spawn(app.watch_binder(), name="watch-binder")
    rt.spawn(app.settle_loop(), name="settle")
    return await rt.run_until_stopped()
