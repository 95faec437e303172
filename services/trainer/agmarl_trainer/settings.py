"""trainer settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.runtime import settings as common  # the module: its classes are not this service's settings classes


class TrainerSettings(common.ModelInputSettings):
    experience_buffer: int = 20_000  # recent transitions kept for fine-tuning (at most this many)
    train_nice: int = 10  # a fine-tune's process and its workers run this much nicer than the services (0 = as they)
    experience_buffer_bytes: int = 64 * 1024 * 1024  # ... and at most this much JSON (a transition is ~40-110 KB)
    state_dir: str = ""  # AGMARL_STATE_DIR, as `agmarl up`: work files in <state_dir>/trainer; "" = <repo>/.state
    # Ed25519 private key file the trainer signs the models it publishes with (`agmarl keys generate`; never
    # in the repo); "" = none, and no model is published (docs/security.md)
    model_signing_key: str = ""
    # public keys whose model signatures are trusted: key files or directories of *.pub, ':'-separated; "" =
    # the shipped models/trusted (docs/security.md)
    trusted_model_keys: str = ""
    # directories a local model folder may be loaded from, ':'-separated; "" = models/ and .state/models
    allowed_model_dirs: str = ""
