"""adaptive-engine: the owner of the active-policy selection.

On start it makes sure the KV key ``active_policy`` holds a selection (the baseline until something
else is chosen) and that ``policy_history`` records it. It feeds rewards, snapshot counters and
workload features (arrival mix, load, load spread, arrival rate) to the ``AdaptiveController``
(``agmarl_common.core.adaptive``): drift detectors with hysteresis, the gate over the expert library,
the guard with automatic rollback, and canary-only exploration. A loop every ``engine_tick_seconds``
picks up selections made elsewhere (``agmarl policy set``) from KV and applies the controller's
switches: each one is written to KV (active + history) and published as a PolicySelection event
with its reason. Drift alarms become (rate-limited) train requests carrying the evidence.

A ``model_published`` event (the trainer's promotion gate passed) is verified against the Object
Store (``modelstore.fetch_version``: the manifest's signature by a trusted key, settings
``trusted_model_keys``, and every digest; docs/security.md) and handed to the controller, which makes it the
active selection at its next tick when the promotion rule allows (``adaptive.controller``: the
active selection is a model, not held, ``auto_promote`` on): reason ``promoted: model <version>
published by the trainer (<the gate's reason>)``. The inference service only caches published
versions; it serves what the selection names. Model names (``model:<version>``) count as known when
they are on disk (signed by a trusted key, in an allowed directory: ``allowed_model_dirs``) or in the
Object Store bucket ``agmarl_models``.

When inference cannot load the model the active selection names (not found, a digest mismatch, ONNX
Runtime refuses it), its ``selection_refused`` event rolls the selection back at once, as the guard does:
reason ``rollback: inference refused <policy>: <why>``, the refused policy quarantined. Switches are
computed and applied under one lock, so KV and the PolicySelection events keep the controller's order.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import OrderedDict

from prometheus_client import Counter, Gauge

from agmarl_common.runtime import messages as m
from agmarl_common.serving import modelstore
from agmarl_common.runtime import subjects
from agmarl_common.core.adaptive import history as hist
from agmarl_common.core.adaptive.controller import AdaptiveController, ControllerConfig, DriftAlarm, Switch
from agmarl_common.core.adaptive.drift import Adwin, PageHinkley
from agmarl_common.core.adaptive.explore import ExploreConfig
from agmarl_common.core.adaptive.features import mix_counts, regime_features_from_stats
from agmarl_common.core.adaptive.gate import ExpertLibrary, GateConfig
from agmarl_common.core.adaptive.guard import GuardConfig
from agmarl_common.core.cluster.model import pod_from_dict
from agmarl_common.serving.onnx_model import OnnxModelPolicy
from agmarl_common.core.policies.registry import get_policy, is_model, model_ref, unwrap, wrap
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_common.runtime.settings import load_settings
from agmarl_adaptive_engine.settings import AdaptiveSettings

SERVICE = "adaptive-engine"
SEEN_LIMIT = 50_000


def expert_map(s: AdaptiveSettings, known=None) -> dict[str, str]:
    """The configured experts, with the shipped learned model (``initial_policy``) standing in for the
    regimes in ``model_regimes`` when it can be loaded."""
    known = known or policy_known
    experts = dict(s.experts)
    if s.initial_policy and known(s.initial_policy):
        for regime in s.model_regimes:
            experts[regime] = s.initial_policy
    return experts


def controller_config(s: AdaptiveSettings, known=None) -> ControllerConfig:
    return ControllerConfig(
        library=ExpertLibrary(experts=expert_map(s, known), baseline=s.default_policy),
        gate=GateConfig(s.busy_enter, s.busy_exit, s.affinity_enter, s.affinity_exit, s.regime_dwell_seconds),
        guard=GuardConfig(s.guard_window, s.guard_min_samples, s.guard_min_reward, s.guard_max_drop,
                          s.guard_min_success, s.guard_min_decided),
        explore=ExploreConfig(s.explore_rate, tuple(s.explore_namespaces)),
        gate_enabled=s.gate_enabled, gate_period_s=s.gate_period_seconds, hold_s=s.hold_seconds,
        quarantine_s=s.quarantine_seconds, default_mode=s.default_mode,
        ph=PageHinkley(delta=s.ph_delta, threshold=s.ph_threshold, min_samples=s.ph_min_samples),
        adwin=Adwin(delta=s.adwin_delta, max_window=s.adwin_max_window),
        psi_enter=s.psi_enter, psi_exit=s.psi_exit, drift_dwell_s=s.drift_dwell_seconds, auto_promote=s.auto_promote)


def policy_known(name: str, trust: modelstore.ModelTrust | None = None) -> bool:
    """A name the registry resolves here; with ``trust``, a ``model:<ref>`` (wrapped or not) must be a local
    model that verifies against it (signature, digests, allowed directory) and loads."""
    try:
        if trust is not None and is_model(name):
            wrap(unwrap(name)[0], OnnxModelPolicy(modelstore.load_local(model_ref(name), trust=trust)))
        else:
            get_policy(name)
    except (KeyError, ValueError):
        return False
    return True


def selection_fields(sel: m.PolicySelection) -> dict:
    return sel.model_dump(exclude={"v"})


def gate_note(manifest: dict) -> str:
    """The trainer's promotion-gate reason from a published manifest (``evaluation.verdict``), or ""."""
    verdict = manifest.get("evaluation", {}).get("verdict", {}) if isinstance(manifest, dict) else {}
    reason = str(verdict.get("reason", "")) if isinstance(verdict, dict) else ""
    if isinstance(verdict, dict) and verdict.get("forced"):
        return f"published without the gate's approval (evidence force): {reason}"
    return reason


class AdaptiveApp:
    def __init__(self, rt: ServiceRuntime, settings: AdaptiveSettings):
        self.rt = rt
        self.settings = settings
        self.controller: AdaptiveController | None = None
        self.active_raw: bytes | None = None
        self.rng = random.Random(settings.seed)
        self.last_retrain = 0.0
        self.seen: OrderedDict[str, None] = OrderedDict()
        self.last_snapshot: tuple[float, dict] | None = None
        self.stored: set[str] = set()  # model versions found in the Object Store (verified when published)
        self.trust = modelstore.ModelTrust.load(settings.trusted_model_keys, settings.allowed_model_dirs)
        self.ticks = 0  # ticks run (health: "ticks")
        self.lock = asyncio.Lock()  # one writer of the selection at a time: the tick loop or an event handler
        reg = rt.registry
        self.drift_alerts = Counter("agmarl_drift_alerts_total", "Drift alarms", ["detector"], registry=reg)
        self.switches = Counter("agmarl_policy_switches_total", "Active-policy changes", ["kind"], registry=reg)
        self.train_requests = Counter("agmarl_train_requests_total", "Train requests sent", registry=reg)
        self.reward_gauge = Gauge("agmarl_reward_last", "Latest total reward", registry=reg)
        self.feature_gauge = Gauge("agmarl_regime_feature", "Latest regime features", ["feature"], registry=reg)
        rt.health_details = self.details

    def details(self) -> dict:
        c = self.controller
        if c is None:
            return {}
        return {"policy": c.active.get("policy", ""), "mode": c.active.get("mode", ""), "regime": c.gate.regime,
                "rewards_in_window": len(c.rewards), "history": len(c.history), "published": c.last_published,
                "experts": dict(c.library.experts), "ticks": self.ticks}

    def known(self, name: str) -> bool:
        """A name the registry resolves here, or ``model:<version>`` stored in the Object Store."""
        if is_model(name) and model_ref(name) in self.stored:
            return True
        return policy_known(name, self.trust)

    async def discover(self, names) -> None:
        """Look up in the Object Store the model names that are not on disk (e.g. experts ``model:<version>``)."""
        for name in sorted(set(names)):
            if not is_model(name) or policy_known(name, self.trust):
                continue
            version = model_ref(name)
            try:
                if await modelstore.in_object_store(self.rt.bus, version):
                    self.stored.add(version)
            except Exception as exc:  # noqa: BLE001 - NATS errors: the name stays unknown (the baseline stands in)
                self.rt.log.warning("object store lookup of %s failed: %s", name, exc)

    # --- KV -----------------------------------------------------------------------------------------

    async def read_kv(self) -> tuple[bytes | None, list[dict]]:
        raw = await self.rt.bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
        history = hist.decode_history(await self.rt.bus.kv_get(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY))
        return raw, history

    async def start(self) -> None:
        raw, history = await self.read_kv()
        now = time.time()
        await self.discover([*self.settings.experts.values(), self.settings.initial_policy])
        cfg = controller_config(self.settings, self.known)
        if raw:
            active = selection_fields(m.decode(m.PolicySelection, raw))
            self.controller = AdaptiveController(cfg, active, history, now, self.known)
            self.active_raw = raw
            if not history:
                await self.rt.bus.kv_put(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY,
                                         hist.encode_history(self.controller.history))
            return
        initial = self.settings.initial_policy
        if initial and self.known(initial):
            sel = m.PolicySelection(policy=initial, mode=self.settings.default_mode,
                                    reason=f"initial selection: the shipped learned model ({initial})", time=now)
        else:
            sel = m.PolicySelection(policy=self.settings.default_policy, mode=self.settings.default_mode,
                                    reason="initial selection: no trained model available, baseline scoring",
                                    time=now)
        self.controller = AdaptiveController(cfg, selection_fields(sel), history, now, self.known)
        await self.apply(Switch("initial", selection_fields(sel)))

    async def apply(self, sw: Switch) -> None:
        sel = m.PolicySelection(**sw.selection)
        raw = m.encode(sel)
        self.active_raw = raw
        await self.rt.bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, raw)
        await self.rt.bus.kv_put(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY,
                                 hist.encode_history(self.controller.history))
        await self.rt.publish(subjects.policy_selection(), sel)
        self.switches.labels(kind=sw.kind).inc()
        self.rt.log.info("policy selection (%s): %s mode=%s (%s) evidence=%s", sw.kind, sel.policy, sel.mode,
                         sel.reason, sw.evidence)

    async def sync(self, now: float) -> None:
        """Adopt a selection another writer (the CLI) put in KV."""
        raw, history = await self.read_kv()
        if not raw or raw == self.active_raw:
            return
        sel = m.decode(m.PolicySelection, raw)
        self.active_raw = raw
        self.controller.adopt(selection_fields(sel), history, now)
        self.rt.log.info("adopted external selection %s (%s)", sel.policy, sel.reason)

    # --- handlers -----------------------------------------------------------------------------------

    async def on_reward(self, msg: m.Reward, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster or self.controller is None:
            return
        self.reward_gauge.set(msg.total)
        await self.on_alarms(self.controller.on_reward(msg.total, time.time()))

    async def on_snapshot(self, msg: m.ClusterSnapshot, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster or self.controller is None:
            return
        self.controller.on_stats(msg.stats)
        new = []
        for d in msg.pending:
            key = f"{d.get('namespace', 'default')}/{d.get('name', '')}"
            if key not in self.seen:
                self.seen[key] = None
                new.append(pod_from_dict(d))
        while len(self.seen) > SEEN_LIMIT:
            self.seen.popitem(last=False)
        dt = msg.time - self.last_snapshot[0] if self.last_snapshot else 0.0
        self.last_snapshot = (msg.time, dict(msg.stats))
        f = regime_features_from_stats(msg.stats, mix_counts(new), len(new) / dt if dt > 0 else 0.0)
        for name in ("load", "load_std", "arrival_rate", "gpu_share", "ls_share", "affinity_share"):
            self.feature_gauge.labels(feature=name).set(getattr(f, name))
        await self.on_alarms(self.controller.on_features(f, time.time()))

    async def on_published(self, msg: m.ModelPublished, ctx: HandlerContext) -> None:
        """A model the trainer published: verified here (every digest), then offered to the controller."""
        try:
            await modelstore.fetch_version(self.rt.bus, msg.version, expected_actor_sha256=msg.sha256,
                                           expected_files=msg.manifest.get("files"), trust=self.trust)
        except Exception as err:  # noqa: BLE001 - missing, unsigned, untrusted, a digest mismatch, NATS errors
            self.rt.log.warning("published model %s not verified, not promoted: %s: %s", msg.version,
                                type(err).__name__, err)
            return
        self.stored.add(msg.version)
        if self.controller is None:
            return
        blocker = self.controller.on_published(msg.version, gate_note(msg.manifest), time.time())
        self.rt.log.info("model %s published: %s", msg.version, f"left alone: {blocker}" if blocker
                         else "promoted at the next tick")

    async def on_refused(self, msg: m.SelectionRefused, ctx: HandlerContext) -> None:
        """Inference could not load the model a selection names: roll back when it is the active one."""
        if self.controller is None:
            return
        why = f"{msg.reason}: {msg.detail}" if msg.detail else msg.reason
        async with self.lock:
            now = time.time()
            await self.sync(now)  # a CLI selection the loop has not adopted yet may be the refused one
            sw = self.controller.on_refused(msg.policy, why, now)
            if sw is None:
                self.rt.log.info("inference refused %s (%s): not the active selection, ignored", msg.policy, why)
                return
            await self.apply(sw)

    async def on_alarms(self, alarms: list[DriftAlarm]) -> None:
        for a in alarms:
            self.drift_alerts.labels(detector=a.detector).inc()
            self.rt.log.warning("drift detected (%s): statistic %.4f vs threshold %.4f", a.detector, a.statistic,
                                a.threshold)
            await self.maybe_retrain(a)

    async def maybe_retrain(self, alarm: DriftAlarm) -> None:
        now = time.time()
        if now - self.last_retrain < self.settings.retrain_cooldown_seconds:
            return
        self.last_retrain = now
        c = self.controller
        evidence = {"detector": alarm.detector, "statistic": round(alarm.statistic, 6),
                    "threshold": alarm.threshold, "window": alarm.window, "details": alarm.details,
                    "features": c.features.as_dict() if c.features else {}, "regime": c.gate.regime,
                    "active_policy": c.active.get("policy", "")}
        await self.rt.publish(subjects.train_request(), m.TrainRequest(
            request_id=uuid.uuid4().hex, reason=f"drift detected by {alarm.detector}", evidence=evidence,
            requested_at=now))
        self.train_requests.inc()

    async def loop(self) -> None:
        """Every ``engine_tick_seconds``: adopt external selections, then apply the controller's switches."""
        while True:
            await asyncio.sleep(self.settings.engine_tick_seconds)
            now = time.time()
            try:
                async with self.lock:
                    await self.sync(now)
                    for sw in self.controller.tick(now, self.rng.random(), self.rng.random()):
                        await self.apply(sw)
            except Exception:  # noqa: BLE001 - one failed tick (e.g. NATS reconnecting) must not stop the loop
                self.rt.log.exception("adaptive tick failed")
            self.ticks += 1


async def main() -> int:
    settings = load_settings(AdaptiveSettings)
    rt = ServiceRuntime(SERVICE, settings)
    app = AdaptiveApp(rt, settings)
    rt.handle(subjects.reward(settings.cluster), m.Reward)(app.on_reward)
    rt.handle(subjects.snapshot(settings.cluster), m.ClusterSnapshot)(app.on_snapshot)
    rt.handle(subjects.model_published(), m.ModelPublished)(app.on_published)
    rt.handle(subjects.selection_refused(), m.SelectionRefused)(app.on_refused)
    await rt.start()
    await app.start()
    rt.spawn(app.loop(), "adaptive-loop")
    return await rt.run_until_stopped()
