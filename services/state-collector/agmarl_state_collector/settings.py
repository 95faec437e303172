"""state-collector settings (defaults < YAML < AGMARL_* environment)."""

from __future__ import annotations

from agmarl_common.settings import CommonSettings


class CollectorSettings(CommonSettings):
    source: str = "simulator"  # simulator | kubernetes
    sim_nodes: int = 50
    sim_zones: int = 2
    sim_workload: str = "batch_online_mix"
    sim_rate: float | None = None  # mean pod arrivals per simulated second; None = sized to ~50 % load
    sim_seed: int = 42
    sim_time_scale: float = 10.0  # simulated seconds per wall second (the live cluster fills in about a minute)
    tick_seconds: float = 0.25  # wall seconds between simulator steps / snapshots
    chunk_seconds: float = 600.0  # simulated seconds of workload generated at a time
    retry_seconds: float = 2.0  # re-announce a pod left pending (no decision or unschedulable) after this
