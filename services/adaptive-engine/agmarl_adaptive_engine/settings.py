"""adaptive-engine settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from pydantic import Field

from agmarl_common.adaptive.gate import DEFAULT_EXPERTS
from agmarl_common.settings import CommonSettings


class AdaptiveSettings(CommonSettings):
    default_policy: str = "kube-resources"  # the rollback baseline (and the first selection without a model)
    initial_policy: str = "model:default"  # first selection when it loads: the shipped learned model
    # public keys whose model signatures are trusted: key files or directories of *.pub, ':'-separated; "" =
    # the shipped models/trusted (docs/security.md)
    trusted_model_keys: str = ""
    # directories a local model folder may be loaded from, ':'-separated; "" = models/ and .state/models
    allowed_model_dirs: str = ""
    model_regimes: list[str] = ["low_load", "batch"]  # regimes the learned model serves as the expert
    default_mode: str = "full"
    # drift detectors (docs/adaptivity.md)
    ph_delta: float = 0.005
    ph_threshold: float = 2.0
    ph_min_samples: int = 30
    adwin_delta: float = 0.002
    adwin_max_window: int = 256
    psi_enter: float = 0.25
    psi_exit: float = 0.10
    drift_dwell_seconds: float = 60.0
    retrain_cooldown_seconds: float = 300.0  # at most one drift-triggered retrain request per window
    # expert library and gate: regime -> any name policies.registry knows ("model:<version>" too)
    experts: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_EXPERTS))
    gate_enabled: bool = True
    gate_period_seconds: float = 10.0
    busy_enter: float = 0.65
    busy_exit: float = 0.55
    affinity_enter: float = 0.35
    affinity_exit: float = 0.20
    regime_dwell_seconds: float = 60.0
    hold_seconds: float = 300.0  # the gate leaves a manual selection or a rollback alone this long
    # a published model supersedes an active model selection (not a baseline, not a held one)
    auto_promote: bool = True
    # guard and rollback
    guard_window: int = 20
    guard_min_samples: int = 10
    guard_min_reward: float = 0.3
    guard_max_drop: float = 0.25
    guard_min_success: float = 0.8
    guard_min_decided: int = 20
    quarantine_seconds: float = 600.0
    # safe exploration: off unless namespaces opted in; the rate is capped at 5 %
    explore_rate: float = 0.02
    canary_namespaces: list[str] = []
    seed: int = 0
    tick_seconds: float = 0.5  # guard / KV sync / gate loop period
