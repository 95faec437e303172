"""The adaptive controller: detectors, gate, guard and exploration wired together, without I/O.

The adaptive-engine service and the regime-shift benchmark drive the same object: they feed
rewards (``on_reward``), cumulative counters (``on_stats``) and regime features (``on_features``),
and call ``tick(now, u, pick, features)``, which returns the switches to apply, each with its
reason, in order. Time and the two uniform draws come in as arguments, so a run replays exactly.

Order inside ``tick``: guard (rollback + quarantine of the failed choice), promotion of a published
model (``on_published``), end of an exploration, gate (every ``gate_period_s``, or at once after a
drift alarm; paused for ``hold_s`` after a manual selection or a rollback), then maybe an
exploration (canary scope only).

Promotion rule: a model version the trainer published supersedes the active selection, and becomes
the active selection (kind ``promote``, reason ``promoted: ...``), when ``auto_promote`` is on, the
active selection is a model (``model:<ref>``: ``default``, ``latest``, a version; wrapped or not, as in
``cpu-first:model:<ref>``, whose wrappers the promoted model keeps: ``registry.with_model``), it is not held
(a manual selection or a rollback younger than ``hold_s``) and the version is neither active nor
quarantined. A baseline selection is left alone (the model stays available to ``agmarl policy set``);
during an exploration the promotion waits for its end. The gate's experts that named the superseded
model name the new one from then on (``follow``), and a rollback of a promoted model gives them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from agmarl_common.core.adaptive import history as hist
from agmarl_common.core.adaptive.drift import (Adwin, Hysteresis, PageHinkley, adwin_update, ewma, hysteresis_update,
                                          ph_update, psi)
from agmarl_common.core.adaptive.explore import ExploreConfig, explore_choice
from agmarl_common.core.adaptive.features import RegimeFeatures, shares
from agmarl_common.core.adaptive.gate import ExpertLibrary, GateConfig, choose_expert, gate_init, gate_update, regime_weights
from agmarl_common.core.adaptive.guard import GuardConfig, decided_delta, guard_check
from agmarl_common.core.policies.registry import is_model, with_model


@dataclass(frozen=True)
class ControllerConfig:
    library: ExpertLibrary = field(default_factory=ExpertLibrary)
    gate: GateConfig = GateConfig()
    guard: GuardConfig = GuardConfig()
    explore: ExploreConfig = ExploreConfig()
    gate_enabled: bool = True
    gate_period_s: float = 10.0
    hold_s: float = 300.0  # the gate leaves a manual selection or a rollback alone this long
    quarantine_s: float = 600.0  # a rolled-back policy is not chosen again this long
    default_mode: str = "full"
    ph: PageHinkley = PageHinkley()
    adwin: Adwin = Adwin()
    reward_drift_exit: float = 0.5  # reward drift: enter at 1 (an alarm), exit at this, dwell below
    psi_enter: float = 0.25
    psi_exit: float = 0.10
    drift_dwell_s: float = 60.0
    mix_fast_alpha: float = 0.3  # EWMA of the arrival mix: recent ...
    mix_slow_alpha: float = 0.02  # ... against the reference
    auto_promote: bool = True  # a published model supersedes an active model selection (module docstring)


@dataclass(frozen=True)
class Switch:
    kind: str  # initial | gate | rollback | explore | explore_end | promote
    selection: dict[str, Any]  # PolicySelection fields
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DriftAlarm:
    detector: str  # page_hinkley | adwin | psi
    statistic: float
    threshold: float
    window: int
    time: float
    details: dict[str, Any] = field(default_factory=dict)


class AdaptiveController:
    def __init__(self, cfg: ControllerConfig, active: Mapping[str, Any], history: list[dict[str, Any]], now: float,
                 known: Callable[[str], bool] = lambda name: True):
        self.cfg, self.known = cfg, known
        self.gate = gate_init(cfg.gate)
        self.ph, self.adwin = cfg.ph, cfg.adwin
        self.reward_drift = Hysteresis(1.0, cfg.reward_drift_exit, cfg.drift_dwell_s)
        self.mix_drift = Hysteresis(cfg.psi_enter, cfg.psi_exit, cfg.drift_dwell_s)
        self.mix_fast: tuple[float, ...] | None = None
        self.mix_slow: tuple[float, ...] | None = None
        self.features: RegimeFeatures | None = None
        self.quarantine: dict[str, float] = {}
        self.next_gate = now
        self.explore_until: float | None = None
        self.rewards: list[float] = []
        self.reference: float | None = None
        self.stats_first: Mapping[str, float] | None = None
        self.stats_last: Mapping[str, float] = {}
        self.active: dict[str, Any] = dict(active)
        self.history = hist.with_active(history, active)
        self.switched_at = now
        self.library, self.superseded = cfg.library, {}
        for entry in self.history:  # a restart: the promotions still in the history
            self._follow(entry)
        self.published: tuple[str, str] | None = None  # (version, the trainer's gate note) awaiting a tick
        self.last_published: dict[str, str] = {}  # the latest publish and what became of it

    def _follow(self, entry: Mapping[str, Any]) -> None:
        experts, self.superseded = hist.follow(self.library.experts, self.superseded, entry)
        self.library = replace(self.library, experts=experts)

    # --- inputs ---------------------------------------------------------------------------------

    def adopt(self, selection: Mapping[str, Any], history: list[dict[str, Any]], now: float) -> None:
        """A selection made elsewhere (the CLI) became active: judge it from now on. ``history`` is the KV
        history as read, which may not hold the selection yet (``hist.with_active``)."""
        recent = self.rewards[-self.cfg.guard.window:]
        self._reset_windows(now)
        if len(recent) >= self.cfg.guard.min_samples:
            self.reference = sum(recent) / len(recent)
        self.active = dict(selection)
        self.history = hist.with_active(history or self.history, selection)
        self.explore_until = None
        self._follow(selection)

    def on_published(self, version: str, note: str, now: float) -> str:
        """The trainer published ``version`` (``note``: its promotion gate's reason). The next ``tick``
        promotes it when the rule allows (module docstring); returns why not as of now, or ""."""
        self.published = (version, note)
        blocker = self.promotion_blocker(self.promoted_name(version), now)
        self.last_published = {"version": version, "outcome": f"left alone: {blocker}" if blocker else "pending"}
        return blocker

    def promoted_name(self, version: str) -> str:
        """What a promotion of ``version`` would serve: the active selection's wrappers around it."""
        return with_model(str(self.active.get("policy", "")), version)

    def promotion_blocker(self, policy: str, now: float) -> str:
        """Why ``policy`` (a published model) would not become the active selection now; "" when it would."""
        active = str(self.active.get("policy", ""))
        if not self.cfg.auto_promote:
            return "auto_promote is off"
        if not is_model(active):
            return f"the active selection {active} is not a model (a baseline is left alone)"
        if self._held(now):
            return f"the active selection ({self.active.get('reason', '')}) is held for {self.cfg.hold_s:.0f} s"
        if policy == active:
            return "already the active selection"
        if self.quarantine.get(policy, -1.0) > now:
            return "quarantined after a rollback"
        if not self.known(policy):
            return "unknown model"
        return ""

    def on_refused(self, policy: str, why: str, now: float) -> Switch | None:
        """Inference could not load ``policy`` (the model a selection names; ``why``: its refusal reason).
        The active selection: rolled back like a guard verdict, the refused policy quarantined; any other
        name (a stale event, the selection has moved on): None."""
        if policy != self.active.get("policy"):
            return None
        return self._rollback(f"inference refused {policy}: {why}", {"refused": policy, "why": why}, now)

    def on_reward(self, total: float, now: float) -> list[DriftAlarm]:
        self.rewards.append(float(total))
        del self.rewards[:-self.cfg.guard.window * 4]
        self.ph, ph_alarm = ph_update(self.ph, total)
        self.adwin, change = adwin_update(self.adwin, total)
        alarms = []
        value = max(self.ph.statistic / self.ph.threshold, 1.0 if ph_alarm else 0.0,
                    1.0 if change is not None and change.drop else 0.0)
        self.reward_drift, changed = hysteresis_update(self.reward_drift, value, now)
        if changed and self.reward_drift.active:
            if change is not None and change.drop:
                alarms.append(DriftAlarm("adwin", abs(change.old_mean - change.new_mean), change.epsilon,
                                         len(self.adwin.window), now,
                                         {"old_mean": round(change.old_mean, 4), "new_mean": round(change.new_mean, 4)}))
            else:
                alarms.append(DriftAlarm("page_hinkley", max(self.ph.statistic, self.ph.threshold) if ph_alarm
                                         else self.ph.statistic, self.ph.threshold, self.ph.n, now))
            self.next_gate = now
        return alarms

    def on_stats(self, stats: Mapping[str, float]) -> None:
        if self.stats_first is None:
            self.stats_first = dict(stats)
        self.stats_last = dict(stats)

    def on_features(self, f: RegimeFeatures, now: float) -> list[DriftAlarm]:
        """Features of the latest window; the gate sees them with the arrival mix smoothed (EWMA)."""
        if sum(f.mix) > 0:
            self.mix_fast = ewma(self.mix_fast, f.mix, self.cfg.mix_fast_alpha)
            self.mix_slow = ewma(self.mix_slow, f.mix, self.cfg.mix_slow_alpha)
        if self.mix_fast is not None:
            f = replace(f, mix=self.mix_fast, **shares(self.mix_fast))
        self.features = f
        if self.mix_fast is None or sum(f.mix) <= 0:
            return []
        stat = psi(self.mix_slow, self.mix_fast)
        self.mix_drift, changed = hysteresis_update(self.mix_drift, stat, now)
        if changed and self.mix_drift.active:
            self.next_gate = now
            return [DriftAlarm("psi", stat, self.cfg.psi_enter, 0, now,
                               {"reference_mix": [round(v, 4) for v in self.mix_slow],
                                "recent_mix": [round(v, 4) for v in self.mix_fast]})]
        return []

    # --- decisions ------------------------------------------------------------------------------

    def gate_due(self, now: float) -> bool:
        return self.cfg.gate_enabled and now >= self.next_gate

    def tick(self, now: float, u: float = 1.0, pick: float = 0.0,
             features: RegimeFeatures | None = None) -> list[Switch]:
        """Every switch due at ``now`` (already applied to ``active`` and ``history``)."""
        if features is not None:
            self.features = features
        out: list[Switch] = []
        verdict = self._verdict()
        if not verdict.ok:
            sw = self._rollback(verdict.reason, verdict.evidence, now)
            if sw is not None:
                return [sw]
        if self.published is not None and self.explore_until is None:
            sw = self._promote(now)
            if sw is not None:
                return [sw]
        if self.explore_until is not None and now >= self.explore_until:
            out.append(self._apply("explore_end", self._gate_choice(now), "exploration ended: back to the gate's choice",
                                   {}, now, mode=self.cfg.default_mode))
        if self.gate_due(now) and self.features is not None and self.explore_until is None:
            self.next_gate = now + self.cfg.gate_period_s
            out += self._gate(now, u, pick, verdict.ok)
        return out

    def _verdict(self):
        bound, decided = decided_delta(self.stats_first or {}, self.stats_last) if self.stats_first else (0, 0)
        return guard_check(self.rewards, self.reference, bound, decided, self.cfg.guard)

    def _gate_choice(self, now: float) -> str:
        name = choose_expert(self.library, self.gate.regime, self.quarantine, now)
        return name if self.known(name) else self.library.baseline

    def _promote(self, now: float) -> Switch | None:
        (version, note), self.published = self.published, None
        policy = self.promoted_name(version)
        blocker = self.promotion_blocker(policy, now)
        if blocker:
            self.last_published = {"version": version, "outcome": f"left alone: {blocker}"}
            return None
        superseded = str(self.active.get("policy", ""))
        reason = f"{hist.PROMOTED} model {version} published by the trainer" + (f" ({note})" if note else "")
        sw = self._apply("promote", policy, reason, {"version": version, "superseded": superseded, "gate": note}, now,
                         mode=self.active.get("mode"))
        self._follow(sw.selection)
        self.last_published = {"version": version, "outcome": "promoted"}
        return sw

    def _held(self, now: float) -> bool:
        reason = str(self.active.get("reason", ""))
        return reason.startswith(("manual", "rollback")) and now - self.switched_at < self.cfg.hold_s

    def _gate(self, now: float, u: float, pick: float, healthy: bool) -> list[Switch]:
        f = self.features
        self.gate, _ = gate_update(self.gate, f, now)
        if self._held(now):
            return []
        choice = self._gate_choice(now)
        evidence = {"regime": self.gate.regime, "weights": {k: round(v, 3) for k, v in regime_weights(f, self.cfg.gate).items()},
                    "features": f.as_dict()}
        if choice != self.active.get("policy") or self.active.get("mode") == "canary":
            return [self._apply("gate", choice, f"gate: regime {self.gate.regime} (load {f.load:.2f}, affinity share "
                                f"{f.affinity_share:.2f}, BE share {f.be_share:.2f})", evidence, now)]
        if healthy and not self.reward_drift.active and not self.mix_drift.active:
            blocked = [p for p, until in self.quarantine.items() if until > now]
            explore = explore_choice(self.cfg.explore, choice, self.library.names(), u, pick, blocked)
            if explore is not None and self.known(explore):
                self.explore_until = now + self.cfg.gate_period_s
                ns = ",".join(self.cfg.explore.canary_namespaces)
                return [self._apply("explore", explore, f"exploration: {explore} in canary namespaces {ns} "
                                    f"(rate {self.cfg.explore.effective_rate:.3f})", evidence, now, mode="canary")]
        return []

    def _rollback(self, why: str, evidence: dict[str, Any], now: float) -> Switch | None:
        failed = dict(self.active)
        sel, new_history = hist.rollback(self.history, self.library.baseline, f"rollback: {why}", now,
                                         self.cfg.default_mode)
        if hist.same_choice(sel, failed):
            self._reset_windows(now)  # nothing to go back to: judge afresh rather than loop
            return None
        self.quarantine[failed["policy"]] = now + self.cfg.quarantine_s
        self._reset_windows(now)
        self.active, self.history, self.explore_until = sel, new_history, None
        self._follow(sel)
        return Switch("rollback", dict(sel), {**evidence, "rolled_back": failed.get("policy", "")})

    def _apply(self, kind: str, policy: str, reason: str, evidence: dict[str, Any], now: float,
               mode: str | None = None) -> Switch:
        sel = {"policy": policy, "model_version": "", "mode": mode or self.cfg.default_mode, "reason": reason,
               "time": now, "previous": self.active.get("policy", "")}
        recent = self.rewards[-self.cfg.guard.window:]
        self._reset_windows(now)
        if len(recent) >= self.cfg.guard.min_samples:
            self.reference = sum(recent) / len(recent)
        if kind != "explore":
            self.explore_until = None
        self.active, self.history = sel, hist.push(self.history, sel)
        return Switch(kind, dict(sel), evidence)

    def _reset_windows(self, now: float) -> None:
        self.rewards, self.reference = [], None
        self.stats_first = None
        self.switched_at = now
