"""trainer settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.settings import CommonSettings


class TrainerSettings(CommonSettings):
    experience_buffer: int = 100_000  # recent transitions kept in memory for fine-tuning
