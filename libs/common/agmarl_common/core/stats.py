"""Paired comparisons: the mean of per-run differences with a 95 % Student t interval.

One owner for the interval that the benchmarks print and the trainer's promotion gate decides on. Pure.
"""

from __future__ import annotations

import math
from typing import Sequence

# Student's t 97.5 % quantiles (two-sided 95 %) by degrees of freedom, to 3 decimals: exact for 1..30, 39 and
# 59; between 30 and 120 the value at or below df is used (conservative: a wider interval)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
        29: 2.045, 30: 2.042, 39: 2.023, 59: 2.001}


def t975(df: int) -> float:
    """Student's t 97.5 % quantile for ``df`` >= 1 degrees of freedom (tabulated value at or below ``df``; 1.96
    from 120 on)."""
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
