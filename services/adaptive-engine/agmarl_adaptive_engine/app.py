"""adaptive-engine: the owner of the active-policy selection.

On start it makes sure the KV key ``active_policy`` holds a selection (the baseline until a model is
published); it tracks rewards and workload statistics, runs a Page-Hinkley detector on rewards, and
on drift publishes an alert and (rate-limited) a train request carrying the evidence. Every
selection change is a PolicySelection event with its reason.
"""

from __future__ import annotations

import time
import uuid

from prometheus_client import Counter, Gauge

from agmarl_common import messages as m
from agmarl_common import subjects
from agmarl_common.service import HandlerContext, ServiceRuntime
from agmarl_common.settings import load_settings
from agmarl_adaptive_engine.drift import PageHinkley, ph_update
from agmarl_adaptive_engine.settings import AdaptiveSettings

SERVICE = "adaptive-engine"


class AdaptiveApp:
    def __init__(self, rt: ServiceRuntime, settings: AdaptiveSettings):
        self.rt = rt
        self.settings = settings
        self.detector = PageHinkley(delta=settings.ph_delta, threshold=settings.ph_threshold,
                                    min_samples=settings.ph_min_samples)
        self.reward_ewma: float | None = None
        self.last_retrain = 0.0
        self.workload: dict[str, float] = {}
        reg = rt.registry
        self.drift_alerts = Counter("agmarl_drift_alerts_total", "Drift alarms", ["detector"], registry=reg)
        self.switches = Counter("agmarl_policy_switches_total", "Active-policy changes", ["reason"], registry=reg)
        self.train_requests = Counter("agmarl_train_requests_total", "Train requests sent", registry=reg)
        self.reward_gauge = Gauge("agmarl_reward_ewma", "Exponentially weighted mean reward", registry=reg)

    async def ensure_selection(self) -> m.PolicySelection:
        raw = await self.rt.bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
        if raw:
            return m.decode(m.PolicySelection, raw)
        sel = m.PolicySelection(policy=self.settings.default_policy, mode=self.settings.default_mode,
                                reason="initial selection: no trained model published yet, baseline scoring",
                                time=time.time())
        await self.select(sel)
        return sel

    async def select(self, sel: m.PolicySelection) -> None:
        await self.rt.bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.encode(sel))
        await self.rt.publish(subjects.policy_selection(), sel)
        self.switches.labels(reason=sel.reason.split(":")[0][:40]).inc()
        self.rt.log.info("policy selection: %s (%s)", sel.policy, sel.reason)

    async def on_reward(self, msg: m.Reward, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster:
            return
        self.reward_ewma = msg.total if self.reward_ewma is None else 0.98 * self.reward_ewma + 0.02 * msg.total
        self.reward_gauge.set(self.reward_ewma)
        self.detector, drift = ph_update(self.detector, msg.total)
        if drift:
            self.drift_alerts.labels(detector="page_hinkley").inc()
            self.rt.log.warning("reward drift detected (Page-Hinkley); ewma=%.3f", self.reward_ewma)
            await self.maybe_retrain("reward drift (Page-Hinkley)")

    async def on_snapshot(self, msg: m.ClusterSnapshot, ctx: HandlerContext) -> None:
        if msg.cluster == self.settings.cluster:
            self.workload = dict(msg.stats)

    async def maybe_retrain(self, reason: str) -> None:
        now = time.time()
        if now - self.last_retrain < self.settings.retrain_cooldown_seconds:
            return
        self.last_retrain = now
        evidence = {"detector": "page_hinkley", "reward_ewma": self.reward_ewma, "workload": self.workload}
        await self.rt.publish(subjects.train_request(), m.TrainRequest(
            request_id=uuid.uuid4().hex, reason=reason, evidence=evidence, requested_at=now))
        self.train_requests.inc()


async def main() -> int:
    settings = load_settings(AdaptiveSettings)
    rt = ServiceRuntime(SERVICE, settings)
    app = AdaptiveApp(rt, settings)
    rt.handle(subjects.reward(settings.cluster), m.Reward)(app.on_reward)
    rt.handle(subjects.snapshot(settings.cluster), m.ClusterSnapshot)(app.on_snapshot)
    await rt.start()
    await app.ensure_selection()
    return await rt.run_until_stopped()
