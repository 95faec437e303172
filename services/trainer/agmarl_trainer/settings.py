"""trainer settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from typing import Literal

from agmarl_common.settings import CommonSettings


class TrainerSettings(CommonSettings):
    experience_buffer: int = 20_000  # recent transitions kept for fine-tuning (at most this many)
    experience_max_bytes: int = 64 * 1024 * 1024  # ... and at most this much JSON (a transition is ~40-110 KB)
    # what the deployment's models optimise, as the inference service reads them (AGMARL_OBJECTIVE,
    # AGMARL_SCHEME): the recorded decisions become training graphs with these inputs
    objective: Literal["composite", "allocation"] = "composite"
    scheme: Literal["fixed", "load_conditional", "lexicographic"] = "fixed"
    state_dir: str = ""  # AGMARL_STATE_DIR, as `agmarl up`: work files in <state_dir>/trainer; "" = <repo>/.state
