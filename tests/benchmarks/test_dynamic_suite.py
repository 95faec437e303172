"""The dynamic suite's paired table (benchmarks/dynamic_suite.py): differences by seed, their interval, seeds
and runs ahead, from reports shaped as `agmarl eval` writes them; and a small real run that prints it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agmarl_common.core.stats import interval
from agmarl_testing.scripts import script_module

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "dynamic_suite.py"


@pytest.fixture(scope="module")
def ds():
    with script_module(_PATH, "dynamic_suite_bench") as module:
        yield module


def report(rewards: dict[str, dict[int, float]]) -> dict:
    """One workload's report: policy -> seed -> reward_mean."""
    return {"policies": {p: {"runs": [{"seed": s, "metrics": {"reward_mean": r}} for s, r in by_seed.items()]}
                         for p, by_seed in rewards.items()}}


def test_paired_table_pairs_by_seed_over_the_workloads(ds):
    reports = {
        "diurnal": report({"model:x": {1: 0.80, 2: 0.90, 3: 0.70}, "kube-default": {1: 0.78, 2: 0.91, 3: 0.66}}),
        "burst": report({"model:x": {1: 0.60, 2: 0.50, 3: 0.40}, "kube-default": {1: 0.58, 2: 0.50, 3: 0.41}}),
    }
    text = ds.paired_table(reports, ["model:x", "kube-default"], "model:x")
    # seed means: model 0.70 / 0.70 / 0.55, kube 0.68 / 0.705 / 0.535 -> +0.02, -0.005, +0.015
    mean, low, high = interval([0.02, -0.005, 0.015])
    row = next(line for line in text.splitlines() if line.startswith("| kube-default |"))
    assert f"| {mean:+.4f} |" in row and f"{low:+.4f} .. {high:+.4f}" in row
    assert "| 2/3 |" in row  # seeds ahead
    assert row.rstrip().endswith("| 3/6 |")  # runs ahead: seed 1 both, seed 2 none, seed 3 diurnal only
    assert "model:x" not in text.split("\n", 3)[-1]  # no row against itself


def test_the_suite_prints_the_paired_table(ds, capsys):
    code = ds.main(["--nodes", "synthetic:8", "--horizon", "120", "--seeds", "1-2", "--workloads", "diurnal",
                    "--policies", "kube-default,reward-aware", "--paired", "reward-aware"])
    out = capsys.readouterr().out
    assert code == 0
    assert "### Paired by seed: reward-aware minus each policy" in out
    assert any(line.startswith("| kube-default | ") and line.count("/2 |") == 2 for line in out.splitlines())


def test_paired_must_name_a_policy_run(ds, capsys):
    assert ds.main(["--nodes", "synthetic:8", "--horizon", "60", "--seeds", "1", "--workloads", "diurnal",
                    "--policies", "kube-default", "--paired", "fgd"]) == 2
    assert "--paired 'fgd' is not among the policies run" in capsys.readouterr().err
