"""The guard: when a selection must be rolled back, and where to.

A selection is judged on what happened since it became active (never on its predecessor's data):
- reward: over the last ``window`` rewards, once at least ``min_samples`` arrived, the mean must
  stay >= ``min_reward`` and, when the previous selection's mean is known (``reference``), above
  ``reference * (1 - max_drop)``;
- scheduling success rate = bound / decided, decided = bound + refused binds + pending timeouts +
  failed starts, summed over the snapshots since the switch (``window_success``); once
  ``min_decided`` pods were decided it must stay >= ``min_success``.
Any breach gives a ``GuardVerdict`` with ok False, the reason and the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class GuardConfig:
    window: int = 20
    min_samples: int = 10
    min_reward: float = 0.3
    max_drop: float = 0.25
    min_success: float = 0.8
    min_decided: int = 20


@dataclass(frozen=True)
class GuardVerdict:
    ok: bool
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


def decided_delta(before: Mapping[str, float], after: Mapping[str, float]) -> tuple[int, int]:
    """(bound, decided) between two cumulative counter snapshots (simulator ``snapshot_stats`` names)."""
    def d(key: str) -> int:
        return max(0, int(after.get(key, 0)) - int(before.get(key, 0)))

    bound = d("bound")
    return bound, bound + d("bind_rejected") + d("unschedulable") + d("failed")


def guard_check(rewards: Sequence[float], reference: float | None, bound: int, decided: int,
                cfg: GuardConfig = GuardConfig()) -> GuardVerdict:
    """Judge the active selection from its own rewards and success counts."""
    recent = list(rewards)[-cfg.window:]
    if len(recent) >= cfg.min_samples:
        mean = sum(recent) / len(recent)
        ev = {"reward_mean": round(mean, 4), "window": len(recent), "reference": reference,
              "min_reward": cfg.min_reward, "max_drop": cfg.max_drop}
        if mean < cfg.min_reward:
            return GuardVerdict(False, f"reward mean {mean:.3f} over {len(recent)} rewards < floor "
                                       f"{cfg.min_reward:.3f}", ev)
        if reference is not None and reference > 0 and mean < reference * (1.0 - cfg.max_drop):
            return GuardVerdict(False, f"reward mean {mean:.3f} over {len(recent)} rewards dropped more than "
                                       f"{cfg.max_drop:.0%} below {reference:.3f}", ev)
    if decided >= cfg.min_decided:
        rate = bound / decided
        if rate < cfg.min_success:
            return GuardVerdict(False, f"scheduling success {rate:.2f} ({bound}/{decided}) < {cfg.min_success:.2f}",
                                {"success_rate": round(rate, 4), "bound": bound, "decided": decided,
                                 "min_success": cfg.min_success})
    return GuardVerdict(True)
