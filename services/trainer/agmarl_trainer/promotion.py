"""The promotion gate: a freshly trained model is published only when it beats what serves today.

Both sides must have been evaluated on the same protocol, workloads and seeds (the trainer runs the
incumbent through the same evaluation as the candidate). Pure: metrics in, verdict out.

Paired when both sides carry the per-run scores (``<primary>_runs``, one per (workload, seed), same order):
the gain is the candidate's minus the incumbent's score on each run; the candidate is promoted only when the
mean gain is above ``min_gain``, it wins more runs than it loses, and (``require_interval``, the default) the
95 % t interval of the mean gain lies above zero, so that seed noise alone does not publish a model. Without
per-run scores the two means are compared (gain above ``min_gain``). The verdict's ``figures`` hold the per-run
gains, their mean, standard error, the interval, wins, losses and ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from agmarl_common.core.stats import interval


@dataclass(frozen=True)
class GateResult:
    promote: bool
    reason: str
    figures: dict = field(default_factory=dict)  # the paired comparison (empty when not paired)


@dataclass(frozen=True)
class GateRule:
    primary: str = "alloc_at_100"  # higher is better
    min_gain: float = 0.0  # the candidate must beat the incumbent's primary metric (mean paired gain) by more than this
    guards: tuple[tuple[str, float], ...] = (("hard_violations", 0.0),)  # metric, maximum allowed (lower is better)
    require_interval: bool = True  # paired: the 95 % interval of the mean gain must lie above zero


def paired_figures(candidate: Sequence[float], incumbent: Sequence[float]) -> dict:
    """Per-run gains (candidate - incumbent), their mean, standard error and 95 % interval (``ci95``, None
    for one run), and wins / losses / ties."""
    gains = [round(float(c) - float(i), 4) for c, i in zip(candidate, incumbent)]
    n = len(gains)
    mean, low, high = interval(gains)
    sd = math.sqrt(sum((g - mean) ** 2 for g in gains) / (n - 1)) if n > 1 else 0.0
    return {"runs": n, "gains": gains, "mean_gain": round(mean, 4), "se": round(sd / math.sqrt(n), 4),
            "ci95": [round(low, 4), round(high, 4)] if n > 1 else None,
            "wins": sum(g > 0 for g in gains), "losses": sum(g < 0 for g in gains),
            "ties": sum(g == 0 for g in gains)}


def promotion_gate(candidate: Mapping, incumbent: Mapping | None, rule: GateRule = GateRule()) -> GateResult:
    """Promote when every guard holds and the primary metric improves on the incumbent (if any) by more than
    ``rule.min_gain``: paired over the runs when both sides have ``<primary>_runs`` (see the module docstring)."""
    p = rule.primary
    if p not in candidate:
        return GateResult(False, f"candidate was not evaluated on {p}")
    for metric, limit in rule.guards:
        value = candidate.get(metric, 0.0)
        if value > limit:
            return GateResult(False, f"candidate {metric}={value:g} exceeds {limit:g}")
    if not incumbent or p not in incumbent:
        return GateResult(True, f"no evaluated incumbent; candidate {p}={candidate[p]:.3f}")
    runs_c, runs_i = candidate.get(f"{p}_runs"), incumbent.get(f"{p}_runs")
    if runs_c and runs_i and len(runs_c) == len(runs_i):
        fig = paired_figures(runs_c, runs_i)
        gain = fig["mean_gain"]
        ci = fig["ci95"]
        ci_text = f", 95 % CI {ci[0]:+.3f} .. {ci[1]:+.3f}" if ci else ""
        paired = (f"{p} {incumbent[p]:.3f} -> {candidate[p]:.3f}, mean paired gain {gain:+.3f} (se {fig['se']:.3f}"
                  f"{ci_text}) over {fig['runs']} runs, {fig['wins']} won / {fig['losses']} lost / {fig['ties']} tied")
        if gain <= rule.min_gain:
            why = f"gain <= {rule.min_gain:g}"
        elif fig["wins"] <= fig["losses"]:
            why = "no more runs won than lost"
        elif rule.require_interval and not (ci and ci[0] > 0):
            why = "95 % interval of the gain not above 0" if ci else "one run: no interval"
        else:
            return GateResult(True, f"better: {paired}", fig)
        return GateResult(False, f"not better ({why}): {paired}", fig)
    gain = candidate[p] - incumbent[p]
    if gain > rule.min_gain:
        return GateResult(True, f"{p} {incumbent[p]:.3f} -> {candidate[p]:.3f} (+{gain:.3f})")
    return GateResult(False, f"not better: {p} {candidate[p]:.3f} vs incumbent "
                             f"{incumbent[p]:.3f} (gain {gain:+.3f} <= {rule.min_gain:g})")
