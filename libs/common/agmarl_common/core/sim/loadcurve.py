"""Load-curve shapes for synthetic workloads, read from real datacenter utilisation series.

A ``LoadCurve`` is a normalised arrival-rate multiplier (mean 1) sampled every ``step_s``
seconds; ``multiplier(t)`` interpolates it linearly and wraps around periodically.

The series are cluster-wide aggregates, one row per 300 s step (see SOURCE.md next to them):
Alibaba 2018 (``cpu_util_percent``), Azure v2 (``cpu_usage``), Google 2019 (``avg_cpu``).
Reading a CSV is the only I/O here and lives in ``read_series`` / ``load_curve``; everything
else is pure. A sinusoid is available, but only when asked for by name.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TRACE_STEP_S = 300.0
DAY_S = 86400.0

# name -> (file name, column) in the utilisation-series folder
LOAD_SERIES: dict[str, tuple[str, str]] = {
    "alibaba2018": ("alibaba2018_machine_usage_days_1_to_8_300s.csv", "cpu_util_percent"),
    "azure_v2": ("azure_v2_vm_month_cpu_mem_300s.csv", "cpu_usage"),
    "google2019": ("google2019_instance_usage_month_300s.csv", "avg_cpu"),
}
DEFAULT_SERIES = "alibaba2018"


def default_series_dir() -> Path:
    """<repo>/../shared/data/traces/datacenter-utilization-timeseries (repo = the folder holding libs/)."""
    repo = Path(__file__).resolve().parents[5]
    return repo.parent / "shared" / "data" / "traces" / "datacenter-utilization-timeseries"


@dataclass(frozen=True)
class LoadCurve:
    """Arrival-rate multiplier sampled every ``step_s`` seconds, normalised to mean 1."""

    values: np.ndarray  # (k,) float64, mean 1, > 0
    step_s: float
    source: str = ""

    @property
    def period_s(self) -> float:
        return self.step_s * len(self.values)

    def multiplier(self, t: float | np.ndarray) -> np.ndarray:
        """Linear interpolation between samples, periodic with ``period_s``."""
        t = np.asarray(t, dtype=np.float64)
        k = len(self.values)
        pos = np.mod(t / self.step_s, k)
        lo = np.floor(pos).astype(np.int64) % k
        hi = (lo + 1) % k
        frac = pos - np.floor(pos)
        return self.values[lo] * (1.0 - frac) + self.values[hi] * frac


def normalise(values: np.ndarray, floor: float = 0.05) -> np.ndarray:
    """Scale to mean 1 and clip at ``floor`` (a zero rate would stall a Poisson process)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError("load curve needs at least one finite value and no NaN/inf")
    mean = float(v.mean())
    if mean <= 0:
        raise ValueError(f"load curve mean must be positive, got {mean}")
    v = np.maximum(v / mean, floor)
    return v / v.mean()


def read_series(path: str | Path, column: str) -> np.ndarray:
    """One numeric column of a CSV file with a header row; clear ValueError on any problem."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"load series file not found: {p}")
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or column not in reader.fieldnames:
            raise ValueError(f"{p.name}: no column {column!r} (columns: {reader.fieldnames})")
        out = []
        for line, row in enumerate(reader, start=2):
            try:
                x = float(row[column])
            except (TypeError, ValueError):
                raise ValueError(f"{p.name}:{line}: {column}={row[column]!r} is not a number") from None
            if not math.isfinite(x):
                raise ValueError(f"{p.name}:{line}: {column} is not finite")
            out.append(x)
    if not out:
        raise ValueError(f"{p.name}: no rows")
    return np.array(out, dtype=np.float64)


def load_curve(name: str = DEFAULT_SERIES, path: str | Path | None = None, column: str | None = None,
               step_s: float = TRACE_STEP_S) -> LoadCurve:
    """The normalised curve of a known series (``LOAD_SERIES``) or of any CSV ``path``/``column``."""
    if name not in LOAD_SERIES and (path is None or column is None):
        raise ValueError(f"unknown load series {name!r}; known: {sorted(LOAD_SERIES)} (or give path and column)")
    file_name, col = LOAD_SERIES.get(name, ("", ""))
    p = Path(path) if path is not None else default_series_dir() / file_name
    if p.is_dir():
        p = p / file_name
    values = read_series(p, column or col)
    return LoadCurve(values=normalise(values), step_s=float(step_s), source=f"{p.name}:{column or col}")


def sinusoid_curve(period_s: float = DAY_S, amplitude: float = 0.5, steps: int = 288, phase: float = 0.0) -> LoadCurve:
    """1 + amplitude * sin(2 pi t / period + phase); only used when asked for explicitly."""
    if not 0 <= amplitude < 1:
        raise ValueError("amplitude must be in [0, 1)")
    t = np.arange(steps) / steps
    values = 1.0 + amplitude * np.sin(2 * np.pi * t + phase)
    return LoadCurve(values=values / values.mean(), step_s=period_s / steps, source="sinusoid")


def fit_to_horizon(curve: LoadCurve, horizon_s: float, span_s: float = DAY_S, offset_s: float = 0.0,
                   points: int = 288) -> LoadCurve:
    """Squeeze the window [offset, offset + span) of ``curve`` onto [0, horizon), renormalised.

    A 1-hour simulation with ``span_s = DAY_S`` sees a whole day of the real diurnal shape.
    """
    if horizon_s <= 0 or span_s <= 0 or points < 1:
        raise ValueError("horizon_s, span_s and points must be positive")
    t = offset_s + np.arange(points) * (span_s / points)
    return LoadCurve(values=normalise(curve.multiplier(t)), step_s=horizon_s / points,
                     source=f"{curve.source}[{offset_s:g}+{span_s:g}s]")


def flat_curve() -> LoadCurve:
    return LoadCurve(values=np.ones(1), step_s=1.0, source="flat")
