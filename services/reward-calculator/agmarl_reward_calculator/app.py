"""reward-calculator: each bound decision is rewarded from the first snapshot that shows it bound.

Components come from ``agmarl_common.core.reward`` (the one definition the trainer uses too), the total
from the weighting scheme named in the settings (fixed | load_conditional | lexicographic). The
window a reward covers runs from the previous snapshot to this one (counter deltas; the pending
time is the mean age of the pods still waiting). Each reward is published with every component,
and an experience transition (the compact cluster state the decision was made on, the pod and the
node it chose, the reward, a reference to the snapshot after; see ``transition``) goes to the
EXPERIENCE JetStream stream with the decision id as message id, so a decision rewarded twice is stored
once.

Delivery: decisions come from a durable consumer on DECISIONS and are acked only once settled (experience
published, or dropped unrewarded: see ``ledger``), so a decision this process held when it was killed is
redelivered to the next one after ``decision_ack_wait``. Refused binds are learnt from ``bind_rejected``
events and never rewarded. At SIGTERM the bound decisions still held get ``flush_seconds`` for a snapshot,
then are written against the last snapshot (``state.missing = "next_snapshot"``); the others stay unacked
for the next process.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from prometheus_client import Counter, Gauge

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.cluster.model import state_from_dict
from agmarl_common.core.reward import RewardScheme, outcomes_from_stats, scheme_reward
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_common.runtime.settings import load_settings
from agmarl_reward_calculator.ledger import REWARD, WAIT, Held, verdict
from agmarl_reward_calculator.settings import RewardSettings
from agmarl_reward_calculator.transition import SnapshotView, experience

SERVICE = "reward-calculator"


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
        self.waiting: OrderedDict[str, Held] = OrderedDict()  # decision id -> decision held until settled
        self.settled: OrderedDict[str, str] = OrderedDict()  # decision id -> how (a redelivery is acked at once)
        self.outcomes: OrderedDict[str, str] = OrderedDict()  # decision id -> "bound" | "refused", from events
        self.bound_by: OrderedDict[str, str] = OrderedDict()  # pod key -> the decision a pod_bound event named
        self.last_view: SnapshotView | None = None
        self.last_stats: dict[str, float] = {}
        self.prev_stats: dict[str, float] = {}  # the stats before last_view (its window's start)
        self.last_epoch, self.last_seq = "", -1
        self.changed = asyncio.Event()  # set after every snapshot (the SIGTERM flush waits on it)
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
        self.held_gauge = Gauge("agmarl_decisions_held", "Decisions waiting for their bind outcome", registry=reg)

    def _remember(self, table: OrderedDict[str, str], key: str, value: str) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > 4 * self.settings.max_waiting:
            table.popitem(last=False)

    async def on_decision(self, msg: m.Decision, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster:
            return
        if msg.decision_id in self.settled:  # settled already: the ack was lost or came late
            self.redelivered.inc()
            return
        held = self.waiting.get(msg.decision_id)
        if held is not None:  # held past ack_wait: keep the newest delivery to ack
            self.redelivered.inc()
            held.delivery = ctx.defer_ack() if ctx.delivery is not None else None
            return
        if self.outcomes.get(msg.decision_id) == "refused":  # the bind_rejected event came first
            self._settle_unrewarded(msg.decision_id, "refused")
            return
        if len(self.waiting) >= self.settings.max_waiting:
            old_id = next(iter(self.waiting))
            self.rt.log.warning("too many decisions waiting for a snapshot; dropped reward for %s", old_id)
            await self._ack(self.waiting.pop(old_id), old_id, "overflow")
        view = self.last_view
        held = Held(msg, view, view.epoch if view is not None else "", time.monotonic(),
                    ctx.defer_ack() if ctx.delivery is not None else None,
                    bound=self.outcomes.get(msg.decision_id) == "bound")
        self.waiting[msg.decision_id] = held
        self.held_gauge.set(len(self.waiting))

    async def on_event(self, msg: m.ClusterEvent, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster or not msg.decision_id:
            return
        if msg.type == "pod_bound":
            self._remember(self.outcomes, msg.decision_id, "bound")
            self._remember(self.bound_by, msg.pod_key, msg.decision_id)
            held = self.waiting.get(msg.decision_id)
            if held is not None:
                held.bound = True
        elif msg.type == "bind_rejected":
            self._remember(self.outcomes, msg.decision_id, "refused")
            held = self.waiting.pop(msg.decision_id, None)
            if held is not None:
                await self._ack(held, msg.decision_id, "refused")

    def _settle_unrewarded(self, decision_id: str, reason: str) -> None:
        self.unrewarded.labels(reason=reason).inc()
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
        view, before_stats = SnapshotView(msg), self.last_stats
        self.prev_stats, self.last_stats, self.last_view = before_stats, dict(msg.stats), view
        try:
            await self._settle(view, before_stats)
        finally:
            self.changed.set()

    async def _settle(self, view: SnapshotView, before_stats: dict[str, float],
                      force: frozenset[str] = frozenset()) -> None:
        """Reward what ``view`` shows bound, drop what it shows was not; the rest waits. The decisions in
        ``force`` that are known bound (a ``pod_bound`` event) are rewarded on ``view`` whatever it shows."""
        held = list(self.waiting.items())
        if not held:
            return
        now, settle = time.monotonic(), self.settings.settle_seconds
        binders = [self.bound_by.get(h.decision.pod_key) for _, h in held]
        # parsing a large cluster takes a while (~0.3 s for 1,523 nodes): off the event loop
        verdicts = await asyncio.to_thread(
            lambda: [REWARD if did in force and h.bound else verdict(h, view, now, settle, b)
                     for (did, h), b in zip(held, binders)])
        for (did, h), v in zip(held, verdicts):
            if v not in (REWARD, WAIT) and self.waiting.pop(did, None) is not None:
                await self._ack(h, did, v)
        ready = [(did, h) for (did, h), v in zip(held, verdicts) if v == REWARD and did in self.waiting]
        if not ready:
            return
        components, total = await asyncio.to_thread(self.reward_of, view.msg, before_stats)
        for name, value in components.items():
            self.component.labels(component=name).set(value)
        self.total.labels(scheme=self.scheme.name).set(total)
        transitions = await asyncio.to_thread(
            lambda: [experience(h.decision, h.before, view, total, self.settings.experience_max_bytes)
                     for _, h in ready])
        for (did, h), (exp, missing) in zip(ready, transitions):
            if did in force and h.decision.node and view.placement(h.decision.pod_key) != h.decision.node:
                missing = missing or "next_snapshot"  # the last snapshot came before the bind
                exp.state["missing"] = missing
            await self._publish(h.decision, exp, missing, components, total, view.msg.time)
            if self.waiting.pop(did, None) is not None:
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
            await self._settle(self.last_view, self.prev_stats, force=left)
        if self.waiting:
            self.rt.log.info("%d decisions left unacked for the next reward-calculator", len(self.waiting))

    def reward_of(self, msg: m.ClusterSnapshot, before_stats: dict[str, float]) -> tuple[dict[str, float], float]:
        """Components and total of the window from the previous snapshot (``before_stats``) to ``msg``."""
        outcomes = outcomes_from_stats(before_stats, msg.stats, mean_pending_age(msg.pending, msg.time))
        return scheme_reward(state_from_dict(msg.state), outcomes, self.scheme)

    async def _publish(self, d: m.Decision, exp: m.Experience, missing: str, components: dict[str, float],
                       total: float, sim_time: float) -> None:
        cluster = self.settings.cluster
        await self.rt.publish(subjects.reward(cluster), m.Reward(
            decision_id=d.decision_id, cluster=cluster, components=components, total=total,
            scheme=self.scheme.name, time=sim_time))
        if missing:
            self.rt.log.warning("experience %s lacks %s", d.decision_id, missing)
        await self.rt.publish(subjects.experience(cluster), exp, js=True, msg_id=d.decision_id)
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
    await rt.start()
    # in the background: SIGTERM is handled (flush) from the moment the service reports healthy
    rt.spawn(rt.bus.ensure_streams(), name="ensure-streams")
    return await rt.run_until_stopped()
