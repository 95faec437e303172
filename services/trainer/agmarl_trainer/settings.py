"""trainer settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common import settings as common  # the module: its classes are not this service's settings classes


class TrainerSettings(common.ModelInputSettings):
    experience_buffer: int = 20_000  # recent transitions kept for fine-tuning (at most this many)
    experience_max_bytes: int = 64 * 1024 * 1024  # ... and at most this much JSON (a transition is ~40-110 KB)
    state_dir: str = ""  # AGMARL_STATE_DIR, as `agmarl up`: work files in <state_dir>/trainer; "" = <repo>/.state
