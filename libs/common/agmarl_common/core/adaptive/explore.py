"""Safe exploration: try another expert, only in canary scope and rarely.

Exploration is off unless some namespaces opted in (``canary_namespaces``). At each gate period
it starts with probability ``min(rate, MAX_EXPLORE_RATE)`` (at most 5 % of the periods): a
uniformly chosen other expert is published with mode ``canary`` for one period, then the gate's
choice comes back. Never while the guard is unhappy or a rollback quarantine is running.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

MAX_EXPLORE_RATE = 0.05


@dataclass(frozen=True)
class ExploreConfig:
    rate: float = 0.02
    canary_namespaces: tuple[str, ...] = ()

    @property
    def effective_rate(self) -> float:
        return min(max(self.rate, 0.0), MAX_EXPLORE_RATE) if self.canary_namespaces else 0.0


def in_canary_scope(namespace: str, cfg: ExploreConfig) -> bool:
    return namespace in cfg.canary_namespaces


def explore_choice(cfg: ExploreConfig, current: str, experts: Sequence[str], u: float, pick: float,
                   blocked: Sequence[str] = ()) -> str | None:
    """The expert to explore, or None. ``u`` and ``pick`` are uniform draws in [0, 1)."""
    if u >= cfg.effective_rate:
        return None
    candidates = sorted(set(experts) - {current} - set(blocked))
    if not candidates:
        return None
    return candidates[min(int(pick * len(candidates)), len(candidates) - 1)]
