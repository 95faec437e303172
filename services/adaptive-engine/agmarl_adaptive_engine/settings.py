"""adaptive-engine settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from pydantic import Field

from agmarl_common.core.adaptive.gate import DEFAULT_EXPERTS
from agmarl_common.runtime.settings import CommonSettings, RolloutMode


class AdaptiveSettings(CommonSettings):
    default_policy: str = "kube-resources"  # the rollback baseline (and the first selection without a model)
    # the first selection (adaptive-engine), and what inference serves until a selection arrives: models/default,
    # inside this name's wrappers when it wraps a model (cpu-first:model:default: docs/model.md "Placement rules")
    initial_policy: str = "cpu-first:model:default"
    # public keys whose model signatures are trusted: key files or directories of *.pub, ':'-separated; "" =
    # the shipped models/trusted (docs/security.md)
    trusted_model_keys: str = ""
    # directories a local model folder may be loaded from, ':'-separated; "" = models/ and .state/models
    allowed_model_dirs: str = ""
    model_regimes: list[str] = ["low_load", "batch"]  # regimes the learned model serves as the expert
    default_mode: RolloutMode = "full"  # rollout mode written with the engine's own selections
    # drift detectors (docs/adaptivity.md)
    ph_delta: float = 0.005  # Page-Hinkley: tolerated drift of the reward mean
    ph_threshold: float = 2.0  # Page-Hinkley: alarm when the cumulative deviation exceeds this
    ph_min_samples: int = 30  # Page-Hinkley: rewards seen before it may alarm
    adwin_delta: float = 0.002  # ADWIN: confidence of a cut between the window's two halves
    adwin_max_window: int = 256  # ADWIN: most recent rewards kept
    psi_enter: float = 0.25  # workload-feature PSI at or above this: drift
    psi_exit: float = 0.10  # ... and below this: drift over
    drift_dwell_seconds: float = 60.0  # a drift state holds at least this long
    retrain_cooldown_seconds: float = 300.0  # at most one drift-triggered retrain request per window
    # expert library and gate: regime -> any name policies.registry knows ("model:<version>" too)
    experts: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_EXPERTS))  # regime -> policy name (JSON)
    gate_enabled: bool = True  # the regime gate switches experts; false = the selection stays put
    gate_period_seconds: float = 10.0  # the gate classifies the regime this often
    busy_enter: float = 0.65  # load at or above this: the busy regime (hysteresis with busy_exit)
    busy_exit: float = 0.55  # ... and below this: busy no longer
    affinity_enter: float = 0.35  # share of pods with affinity rules at or above this: the affinity regime
    affinity_exit: float = 0.20  # ... and below this: affinity no longer
    regime_dwell_seconds: float = 60.0  # a regime holds at least this long before the gate switches again
    hold_seconds: float = 300.0  # the gate leaves a manual selection or a rollback alone this long
    # a published model supersedes an active model selection (not a baseline, not a held one)
    auto_promote: bool = True  # a newly published model replaces an active model selection
    # guard and rollback
    guard_window: int = 20  # recent rewards the guard compares
    guard_min_samples: int = 10  # rewards needed before the guard judges
    guard_min_reward: float = 0.3  # mean reward below this: roll back to default_policy
    guard_max_drop: float = 0.25  # ... or a mean more than this fraction below the previous selection's mean
    guard_min_success: float = 0.8  # ... or a share of successful placements below this
    guard_min_decided: int = 20  # decisions needed before the success share counts
    quarantine_seconds: float = 600.0  # a rolled-back policy is not selected again for this long
    # safe exploration: off unless namespaces opted in; the rate is capped at 5 %
    explore_rate: float = 0.02  # chance per gate period of trying another expert for one period (capped at 0.05)
    explore_namespaces: list[str] = []  # opted in to exploration, [] = off (explored in inference's canary scope)
    seed: int = 0  # exploration's random seed
    engine_tick_seconds: float = 0.5  # guard / KV sync / gate loop period
