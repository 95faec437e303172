"""The pressure suite's report (benchmarks/pressure_suite.py): loss decomposition, headroom against the best
heuristic, the target line and the requested load per resource."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agmarl_common.core.cluster.model import Node
from agmarl_testing.scripts import script_module

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "pressure_suite.py"


@pytest.fixture(scope="module")
def ps():
    with script_module(_PATH, "pressure_suite_bench") as module:
        yield module


def policy(ps, reward, p99, sla, unsched=(0, 0, 0), ls_ok=0.5, util=0.9):
    vals = {"reward_mean": reward, "pending_time_p99_s": p99, "sla_violating_pods": sla, "unschedulable": unsched}
    comps = {c: 1.0 for c in ps.LOSS_TERMS} | {"ls_ok": ls_ok, "utilisation": util}
    return {k: np.asarray(v, float) for k, v in vals.items()} | {f"reward_{c}_mean": np.full(3, v) for c, v in comps.items()}


def test_losses_weigh_each_component_by_its_share_of_the_composite(ps):
    lost = ps.losses(policy(ps, [0.9] * 3, [1] * 3, [1] * 3, ls_ok=0.2, util=0.9))
    assert lost["ls_ok"] == pytest.approx(0.25 / 4 * 0.8) and lost["utilisation"] == pytest.approx(0.25 * 0.1)
    assert lost["balance"] == lost["pending"] == 0.0


def test_the_upper_reference_is_the_best_placement_reference_and_the_gap_share_is_measured_to_it(ps):
    vals = {"reward-aware": policy(ps, [0.90, 0.91, 0.92], [100, 100, 100], [50, 50, 50]),
            "kube-default": policy(ps, [0.89, 0.90, 0.91], [90, 90, 90], [60, 60, 60]),
            "lookahead": policy(ps, [0.91, 0.92, 0.93], [100, 100, 100], [50, 50, 50]),
            "lookahead-wide": policy(ps, [0.92, 0.93, 0.94], [100, 100, 100], [50, 50, 50]),
            "model:x": policy(ps, [0.91, 0.925, 0.93], [70, 80, 90], [50, 49, 48])}
    assert ps.best_heuristic(vals, ["reward-aware", "kube-default"]) == "reward-aware"
    assert ps.best_heuristic(vals, ["lookahead", "lookahead-wide"]) == "lookahead-wide"
    row = ps.headroom_row(vals, "w", "lookahead-wide", "reward-aware")
    assert "+0.0200 (+2.20 %" in row and "3/3" in row
    line = ps.target_line(vals, "model:x", "reward-aware", ["lookahead-wide", ps.BEST_OF])
    assert "target >= +3 %: missed" in line and "pending p99 -20.0 %" in line
    assert "neither worse: met" in line and "gap (+0.0200) closed: 58 %" in line
    text = ps.report({"w": vals}, list(vals))
    assert "upper reference lookahead-wide" in text and "| w | reward-aware | lookahead | +0.0100" in text


def test_offered_load_counts_memory_too(ps):
    nodes = [Node(f"n{i}", 32000, 131072) for i in range(4)]
    cpu, mem, gpu = ps.offered_load(nodes, "pressure_load", 600.0, [1, 2])
    assert 0.8 < cpu < 1.1 and gpu == 0.0
    assert mem > cpu  # pods ask ~4.8 GiB per core, these nodes have 4


def test_placement_freedom_counts_the_candidates_of_every_placement(ps):
    spec = ps.EvalSpec(protocol="dynamic", workload="synthetic:pressure_load", nodes="synthetic:4", horizon_s=60.0)
    single, mean, n = ps.placement_freedom(spec, [1])
    assert n > 0 and 0.0 <= single <= 1.0 and 1.0 <= mean <= 4.0
    assert (single == 1.0) == (mean == 1.0)


def test_best_of_references_takes_each_seed_from_the_reference_best_there(ps):
    vals = {"lookahead": policy(ps, [0.90, 0.95, 0.91], [10, 20, 30], [1, 2, 3]),
            "lookahead-deep": policy(ps, [0.92, 0.93, 0.90], [40, 50, 60], [4, 5, 6])}
    best = ps.with_best_of(vals, ["lookahead", "lookahead-deep"])[ps.BEST_OF]
    assert best["reward_mean"].tolist() == [0.92, 0.95, 0.91] and best["pending_time_p99_s"].tolist() == [40, 20, 30]
    assert ps.BEST_OF not in ps.with_best_of(vals, ["lookahead"])
