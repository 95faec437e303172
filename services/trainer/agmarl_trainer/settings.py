"""trainer settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.settings import CommonSettings


class TrainerSettings(CommonSettings):
    pass
