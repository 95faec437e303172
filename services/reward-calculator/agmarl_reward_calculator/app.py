"""reward-calculator: each decision is rewarded from the first snapshot taken after it.

Components come from ``agmarl_common.reward`` (the one definition the trainer uses too). Each
reward is published, and an experience transition (stats before, action, reward, stats after) goes
to the EXPERIENCE JetStream stream, deduplicated by the decision id.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from prometheus_client import Counter, Gauge

from agmarl_common import messages as m
from agmarl_common import subjects
from agmarl_common.cluster.model import state_from_dict
from agmarl_common.reward import Outcomes, reward_components, total_reward
from agmarl_common.service import HandlerContext, ServiceRuntime
from agmarl_common.settings import load_settings
from agmarl_reward_calculator.settings import RewardSettings

SERVICE = "reward-calculator"


class RewardApp:
    def __init__(self, rt: ServiceRuntime, settings: RewardSettings):
        self.rt = rt
        self.settings = settings
        self.waiting: OrderedDict[str, tuple[m.Decision, dict]] = OrderedDict()
        self.last_stats: dict[str, float] = {}
        self.last_seq = -1
        reg = rt.registry
        self.component = Gauge("agmarl_reward_component", "Latest reward component value", ["component"], registry=reg)
        self.total = Gauge("agmarl_reward_total", "Latest total reward", registry=reg)
        self.rewards = Counter("agmarl_rewards_published_total", "Rewards published", registry=reg)

    async def on_decision(self, msg: m.Decision, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster:
            return
        if len(self.waiting) >= self.settings.max_waiting:
            old_id, _ = self.waiting.popitem(last=False)
            self.rt.log.warning("too many decisions waiting for a snapshot; dropped reward for %s", old_id)
        self.waiting[msg.decision_id] = (msg, dict(self.last_stats))

    async def on_snapshot(self, msg: m.ClusterSnapshot, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster or msg.seq <= self.last_seq:
            return
        self.last_seq = msg.seq
        ready = [(d, before) for d, before in self.waiting.values() if d.decided_at <= time.time()]
        if ready:
            state = state_from_dict(msg.state)
            stats = msg.stats
            outcomes = Outcomes(pending=int(stats.get("pending", 0)), scheduled=int(stats.get("bound", 0)),
                                failed=int(stats.get("failed", 0) + stats.get("unschedulable", 0)),
                                violations=int(stats.get("violations", 0)))
            components = reward_components(state, outcomes)
            total = total_reward(components)
            for name, value in components.items():
                self.component.labels(component=name).set(value)
            self.total.set(total)
            for decision, before in ready:
                self.waiting.pop(decision.decision_id, None)
                await self._publish(decision, before, stats, components, total, msg.time)
        self.last_stats = dict(msg.stats)

    async def _publish(self, d: m.Decision, before: dict, after: dict, components: dict[str, float],
                       total: float, sim_time: float) -> None:
        cluster = self.settings.cluster
        await self.rt.publish(subjects.reward(cluster), m.Reward(
            decision_id=d.decision_id, cluster=cluster, components=components, total=total,
            scheme=self.settings.scheme, time=sim_time))
        await self.rt.publish(subjects.experience(cluster), m.Experience(
            id=d.decision_id, cluster=cluster, state=before,
            action={"pod_key": d.pod_key, "node": d.node, "policy": d.policy, "score": d.score},
            reward=total, next_state=dict(after), time=sim_time), js=True, msg_id=d.decision_id)
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
