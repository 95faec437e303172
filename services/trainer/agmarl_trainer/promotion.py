"""The promotion gate: a freshly trained model is published only when it beats what serves today.

Both sides must have been evaluated on the same protocol, workloads and seeds (the trainer runs the
incumbent through the same evaluation as the candidate). Pure: metrics in, verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class GateResult:
    promote: bool
    reason: str


@dataclass(frozen=True)
class GateRule:
    primary: str = "alloc_at_100"  # higher is better
    min_gain: float = 0.0  # the candidate must beat the incumbent's primary metric by more than this
    guards: tuple[tuple[str, float], ...] = (("hard_violations", 0.0),)  # metric, maximum allowed (lower is better)


def promotion_gate(candidate: Mapping[str, float], incumbent: Mapping[str, float] | None,
                   rule: GateRule = GateRule()) -> GateResult:
    """Promote when every guard holds and the primary metric improves on the incumbent (if any)."""
    if rule.primary not in candidate:
        return GateResult(False, f"candidate was not evaluated on {rule.primary}")
    for metric, limit in rule.guards:
        value = candidate.get(metric, 0.0)
        if value > limit:
            return GateResult(False, f"candidate {metric}={value:g} exceeds {limit:g}")
    if not incumbent or rule.primary not in incumbent:
        return GateResult(True, f"no evaluated incumbent; candidate {rule.primary}={candidate[rule.primary]:.3f}")
    gain = candidate[rule.primary] - incumbent[rule.primary]
    if gain > rule.min_gain:
        return GateResult(True, f"{rule.primary} {incumbent[rule.primary]:.3f} -> {candidate[rule.primary]:.3f} "
                                f"(+{gain:.3f})")
    return GateResult(False, f"not better: {rule.primary} {candidate[rule.primary]:.3f} vs incumbent "
                             f"{incumbent[rule.primary]:.3f} (gain {gain:+.3f} <= {rule.min_gain:g})")
