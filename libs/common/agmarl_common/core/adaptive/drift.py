"""Drift detectors (pure, incremental) and a hysteresis switch.

- ``PageHinkley`` (Page 1954; Hinkley 1971) on rewards: with running mean x̄_t of the negated
  reward, m_t = Σ (x_i - x̄_i - δ) and M_t = min m_t; a drop is flagged when m_t - M_t > λ after
  ``min_samples`` observations; the detector then restarts.
- ``Adwin`` (Bifet & Gavaldà 2007, ADWIN0 with the Bernstein bound): keeps the last
  ``max_window`` values; for every split into an older part W0 and a recent part W1 (each at least
  ``min_sub`` long) it cuts W0 when |μ0 - μ1| > ε = sqrt(2 σ² ln(2/δ') / m) + 2 ln(2/δ') / (3 m),
  with m = 1 / (1/n0 + 1/n1), δ' = δ / n and σ² the window variance.
- ``psi`` (population stability index) and ``kl`` between two categorical distributions, smoothed
  by ``eps`` so empty cells stay finite. PSI < 0.1 is usually read as stable, > 0.25 as a shift.
- ``Hysteresis``: a boolean state that turns on at ``value >= enter``, off at ``value <= exit``
  (exit < enter), and never changes twice within ``min_dwell_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np


@dataclass(frozen=True, slots=True)
class PageHinkley:
    delta: float = 0.005
    threshold: float = 2.0
    min_samples: int = 30
    n: int = 0
    mean: float = 0.0
    cum: float = 0.0
    cum_min: float = 0.0

    @property
    def statistic(self) -> float:
        """m_t - M_t, compared with ``threshold``."""
        return self.cum - self.cum_min


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


@dataclass(frozen=True, slots=True)
class Adwin:
    delta: float = 0.002
    max_window: int = 256
    min_sub: int = 16
    window: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class AdwinChange:
    old_mean: float
    new_mean: float
    epsilon: float
    dropped: int  # values cut from the old end

    @property
    def drop(self) -> bool:
        return self.new_mean < self.old_mean


def adwin_cut(values: Sequence[float], delta: float, min_sub: int) -> AdwinChange | None:
    """The split of ``values`` with the largest mean difference beyond its ε, or None."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n < 2 * min_sub:
        return None
    var = float(x.var())
    csum = np.cumsum(x)
    n0 = np.arange(min_sub, n - min_sub + 1, dtype=np.float64)
    mu0 = csum[n0.astype(int) - 1] / n0
    mu1 = (csum[-1] - csum[n0.astype(int) - 1]) / (n - n0)
    m = 1.0 / (1.0 / n0 + 1.0 / (n - n0))
    log_term = math.log(2.0 * n / delta)
    eps = np.sqrt(2.0 * var * log_term / m) + 2.0 * log_term / (3.0 * m)
    excess = np.abs(mu0 - mu1) - eps
    k = int(np.argmax(excess))
    if excess[k] <= 0:
        return None
    return AdwinChange(float(mu0[k]), float(mu1[k]), float(eps[k]), int(n0[k]))


def adwin_update(ad: Adwin, value: float) -> tuple[Adwin, AdwinChange | None]:
    """Feed one value; on a change the older sub-window is dropped and the change returned."""
    window = (ad.window + (float(value),))[-ad.max_window:]
    change = adwin_cut(window, ad.delta, ad.min_sub)
    if change is not None:
        window = window[change.dropped:]
    return replace(ad, window=window), change


def _smooth(p: Sequence[float], eps: float) -> np.ndarray:
    a = np.clip(np.asarray(p, dtype=np.float64), 0.0, None) + eps
    return a / a.sum()


def psi(reference: Sequence[float], current: Sequence[float], eps: float = 1e-4) -> float:
    """Population stability index Σ (q - p) ln(q / p) of two categorical distributions (>= 0)."""
    p, q = _smooth(reference, eps), _smooth(current, eps)
    return float(np.sum((q - p) * np.log(q / p)))


def kl(reference: Sequence[float], current: Sequence[float], eps: float = 1e-4) -> float:
    """KL(current || reference) = Σ q ln(q / p) (>= 0)."""
    p, q = _smooth(reference, eps), _smooth(current, eps)
    return float(np.sum(q * np.log(q / p)))


def ewma(previous: Sequence[float] | None, value: Sequence[float], alpha: float) -> tuple[float, ...]:
    """Exponentially weighted mean of vectors; ``previous`` None starts at ``value``."""
    v = np.asarray(value, dtype=np.float64)
    if previous is None:
        return tuple(v.tolist())
    return tuple(((1.0 - alpha) * np.asarray(previous, dtype=np.float64) + alpha * v).tolist())


@dataclass(frozen=True, slots=True)
class Hysteresis:
    enter: float
    exit: float
    min_dwell_s: float = 0.0
    active: bool = False
    since: float = -math.inf  # time of the last change

    def __post_init__(self) -> None:
        if self.exit > self.enter:
            raise ValueError("exit threshold must be <= enter threshold")


def hysteresis_update(h: Hysteresis, value: float, now: float) -> tuple[Hysteresis, bool]:
    """Feed one statistic at time ``now``; returns the new state and whether it changed."""
    if now - h.since < h.min_dwell_s:
        return h, False
    if not h.active and value >= h.enter:
        return replace(h, active=True, since=now), True
    if h.active and value <= h.exit:
        return replace(h, active=False, since=now), True
    return h, False
