"""Page-Hinkley drift detection on a stream of rewards (pure, incremental).

Page & Hinkley: with running mean x̄_t, the cumulative deviation m_t = Σ (x_i - x̄_i + δ) and its
minimum M_t; a downward shift is flagged when m_t - M_t > λ ... here we watch for a DROP in reward,
so we feed the negated reward. ``delta`` tolerates small changes, ``threshold`` (λ) sets sensitivity,
``min_samples`` avoids alarms on a cold start. After an alarm the detector resets (hysteresis comes
from needing a fresh ``min_samples`` and a full threshold crossing again).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class PageHinkley:
    delta: float = 0.005
    threshold: float = 2.0
    min_samples: int = 30
    n: int = 0
    mean: float = 0.0
    cum: float = 0.0
    cum_min: float = 0.0


def ph_update(ph: PageHinkley, reward: float) -> tuple[PageHinkley, bool]:
    """Feed one reward; returns the new detector and whether a drop in reward was detected."""
    x = -reward
    n = ph.n + 1
    mean = ph.mean + (x - ph.mean) / n
    cum = ph.cum + x - mean - ph.delta
    cum_min = min(ph.cum_min, cum)
    if n >= ph.min_samples and cum - cum_min > ph.threshold:
        return replace(ph, n=0, mean=0.0, cum=0.0, cum_min=0.0), True
    return replace(ph, n=n, mean=mean, cum=cum, cum_min=cum_min), False
