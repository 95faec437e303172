"""reward-calculator: each decision is rewarded from the first snapshot taken after it.

Components come from ``agmarl_common.reward`` (the one definition the trainer uses too), the total
from the weighting scheme named in the settings (fixed | load_conditional | lexicographic). The
window a reward covers runs from the previous snapshot to this one (counter deltas; the pending
time is the mean age of the pods still waiting). Each reward is published with every component,
and an experience transition (the compact cluster state the decision was made on, the pod and the
node it chose, the reward, a reference to the snapshot after; see ``transition``) goes to the
EXPERIENCE JetStream stream with the decision id as message id, so a redelivered decision is stored
once.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from prometheus_client import Counter, Gauge

from agmarl_common import messages as m
from agmarl_common import subjects
from agmarl_common.cluster.model import state_from_dict
from agmarl_common.reward import RewardScheme, outcomes_from_stats, scheme_reward
from agmarl_common.service import HandlerContext, ServiceRuntime
from agmarl_common.settings import load_settings
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
        # decision id -> (decision, the last snapshot before it: the cluster it was made on)
        self.waiting: OrderedDict[str, tuple[m.Decision, SnapshotView | None]] = OrderedDict()
        self.last_view: SnapshotView | None = None
        self.last_stats: dict[str, float] = {}
        self.last_seq = -1
        reg = rt.registry
        self.component = Gauge("agmarl_reward_component", "Latest reward component value", ["component"], registry=reg)
        self.total = Gauge("agmarl_reward_total", "Latest total reward", ["scheme"], registry=reg)
        self.rewards = Counter("agmarl_rewards_published_total", "Rewards published", registry=reg)
        self.experiences = Counter("agmarl_experience_published_total",
                                   "Experience transitions published, by what they lack (complete = nothing)",
                                   ["missing"], registry=reg)

    async def on_decision(self, msg: m.Decision, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster:
            return
        if len(self.waiting) >= self.settings.max_waiting:
            old_id, _ = self.waiting.popitem(last=False)
            self.rt.log.warning("too many decisions waiting for a snapshot; dropped reward for %s", old_id)
        self.waiting[msg.decision_id] = (msg, self.last_view)

    async def on_snapshot(self, msg: m.ClusterSnapshot, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster or msg.seq <= self.last_seq:
            return
        self.last_seq = msg.seq
        view, before_stats = SnapshotView(msg), self.last_stats
        self.last_stats, self.last_view = dict(msg.stats), view  # decisions from now on were made on this one
        now = time.time()
        ready = [(d, before) for d, before in self.waiting.values() if d.decided_at <= now]
        if not ready:
            return
        for d, _ in ready:
            self.waiting.pop(d.decision_id, None)
        # parsing and compacting a large cluster takes a while (~0.3 s for 1,523 nodes): off the event loop
        components, total = await asyncio.to_thread(self.reward_of, msg, before_stats)
        for name, value in components.items():
            self.component.labels(component=name).set(value)
        self.total.labels(scheme=self.scheme.name).set(total)
        transitions = await asyncio.to_thread(
            lambda: [experience(d, before, view, total, self.settings.experience_max_bytes) for d, before in ready])
        for (decision, _), (exp, missing) in zip(ready, transitions):
            await self._publish(decision, exp, missing, components, total, msg.time)

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
    rt.handle(subjects.decision_wildcard(settings.cluster), m.Decision)(app.on_decision)
    rt.handle(subjects.snapshot(settings.cluster), m.ClusterSnapshot)(app.on_snapshot)
    await rt.start()
    await rt.bus.ensure_streams()
    return await rt.run_until_stopped()
