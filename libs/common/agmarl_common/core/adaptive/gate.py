"""The expert library and the gate that selects an expert from live features.

Regimes and their default experts (any name ``policies.registry.get_policy`` knows, baselines
today and ``model:<version>`` later):
- ``low_load`` -> ``kube-resources`` (LeastAllocated + BalancedAllocation: spread, balance);
- ``batch`` -> ``most-allocated`` (pack: high throughput, room left for big pods);
- ``affinity`` -> ``kube-default`` (the default profile with InterPodAffinity, spread and node
  affinity scoring).

Two hysteresis switches decide the regime: ``busy`` on the cluster load (enter 0.65, exit 0.55)
and ``affinity`` on the share of arriving pods with affinity terms (enter 0.35, exit 0.2); each
keeps its state at least ``min_dwell_s``. affinity wins over busy; neither means low_load.
``regime_weights`` gives soft weights over the three regimes for mixing and for the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from agmarl_common.core.adaptive.drift import Hysteresis, hysteresis_update
from agmarl_common.core.adaptive.features import RegimeFeatures

REGIMES = ("low_load", "batch", "affinity")
DEFAULT_EXPERTS: dict[str, str] = {"low_load": "kube-resources", "batch": "most-allocated",
                                   "affinity": "kube-default"}


@dataclass(frozen=True)
class GateConfig:
    busy_enter: float = 0.65
    busy_exit: float = 0.55
    affinity_enter: float = 0.35
    affinity_exit: float = 0.20
    min_dwell_s: float = 60.0


@dataclass(frozen=True)
class GateState:
    busy: Hysteresis
    affinity: Hysteresis
    regime: str = "low_load"


def gate_init(cfg: GateConfig = GateConfig()) -> GateState:
    return GateState(busy=Hysteresis(cfg.busy_enter, cfg.busy_exit, cfg.min_dwell_s),
                     affinity=Hysteresis(cfg.affinity_enter, cfg.affinity_exit, cfg.min_dwell_s))


def regime_of(busy: bool, affinity: bool) -> str:
    return "affinity" if affinity else "batch" if busy else "low_load"


def gate_update(state: GateState, f: RegimeFeatures, now: float) -> tuple[GateState, bool]:
    """Feed features at time ``now``; returns the new state and whether the regime changed."""
    busy, _ = hysteresis_update(state.busy, f.load, now)
    aff, _ = hysteresis_update(state.affinity, f.affinity_share, now)
    regime = regime_of(busy.active, aff.active)
    return replace(state, busy=busy, affinity=aff, regime=regime), regime != state.regime


def _ramp(x: float, lo: float, hi: float) -> float:
    return min(1.0, max(0.0, (x - lo) / (hi - lo))) if hi > lo else float(x >= hi)


def regime_weights(f: RegimeFeatures, cfg: GateConfig = GateConfig()) -> dict[str, float]:
    """Soft weights over ``REGIMES`` (sum 1): ramps between each switch's exit and enter thresholds."""
    a = _ramp(f.affinity_share, cfg.affinity_exit, cfg.affinity_enter)
    b = _ramp(f.load, cfg.busy_exit, cfg.busy_enter)
    return {"low_load": (1 - a) * (1 - b), "batch": (1 - a) * b, "affinity": a}


@dataclass(frozen=True)
class ExpertLibrary:
    """Regime -> policy name, and the baseline used when an expert is unavailable."""

    experts: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_EXPERTS))
    baseline: str = "kube-resources"

    def __post_init__(self) -> None:
        missing = [r for r in REGIMES if r not in self.experts]
        if missing:
            raise ValueError(f"expert library has no policy for regime(s) {missing}")

    def names(self) -> list[str]:
        return sorted(set(self.experts.values()))


def choose_expert(library: ExpertLibrary, regime: str, quarantine: Mapping[str, float], now: float) -> str:
    """The regime's expert, or the baseline while that expert is quarantined (after a rollback)."""
    name = library.experts[regime]
    return library.baseline if quarantine.get(name, -1.0) > now else name
