"""adaptive-engine settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.settings import CommonSettings


class AdaptiveSettings(CommonSettings):
    default_policy: str = "kube-resources"  # selected when no policy was chosen yet
    default_mode: str = "full"
    ph_delta: float = 0.005
    ph_threshold: float = 2.0
    ph_min_samples: int = 30
    retrain_cooldown_seconds: float = 300.0  # at most one drift-triggered retrain request per window
