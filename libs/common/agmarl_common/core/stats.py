"""Paired comparisons: the mean of per-run differences with a 95 % Student t interval.

One owner for the interval that the benchmarks print and the trainer's promotion gate decides on. Pure.
"""

from __future__ import annotations

import math
from typing import Sequence

# Student's t 97.5 % quantiles (two-sided 95 %) by degrees of freedom; between entries the value at or below
# df is used (conservative: a wider interval)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 14: 2.145, 16: 2.120, 19: 2.093, 24: 2.064, 29: 2.045, 39: 2.023, 59: 2.001}


def t975(df: int) -> float:
    """Student's t 97.5 % quantile for ``df`` >= 1 degrees of freedom (tabulated value at or below ``df``)."""
    if df < 1:
        raise ValueError(f"t975 needs at least 1 degree of freedom, got {df}")
    return T975[max(k for k in T975 if k <= df)] if df < 120 else 1.96


def interval(diffs: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % t interval of the mean of paired differences; low and high are NaN for
    fewer than two differences (no spread to estimate)."""
    d = [float(x) for x in diffs]
    if not d:
        raise ValueError("interval of no differences")
    mean = sum(d) / len(d)
    if len(d) < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    half = t975(len(d) - 1) * sd / math.sqrt(len(d))
    return mean, mean - half, mean + half
