"""reward-calculator settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.settings import CommonSettings


class RewardSettings(CommonSettings):
    max_waiting: int = 10_000  # decisions kept while waiting for a later snapshot
    scheme: str = "fixed"  # reward weighting scheme
