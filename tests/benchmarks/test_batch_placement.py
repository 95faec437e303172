"""benchmarks/batch_placement.py: a policy with local node scores places the same backlog identically in any
batch size (as one pod at a time), and the benchmark prints a line per policy and batch size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agmarl_common.core.sim import catalog
from agmarl_common.core.sim.inflation import plan
from agmarl_testing.scripts import script_module

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "batch_placement.py"


@pytest.fixture(scope="module")
def bp():
    with script_module(_PATH, "batch_placement_bench") as module:
        yield module


def test_local_scores_place_a_backlog_the_same_in_every_batch_size(bp):
    nodes = tuple(catalog.cluster_nodes("openb:all"))[::25]  # 61 nodes, GPU ones among them
    workload = catalog.openb_pods("openb:default")
    arrivals, rank = plan(nodes, workload, np.random.default_rng(42))
    results = {b: bp.run(nodes, rank, workload, arrivals[:400], "fgd", b) for b in (1, 16, 128)}
    assert results[1] == results[16] == results[128]
    assert 0 < results[1][0] < 400  # the backlog overflows the 61 nodes: placement decides who fits


def test_the_benchmark_prints_a_line_per_policy_and_batch_size(bp, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["batch_placement.py", "--pods", "50", "--policies", "fgd", "kube-resources",
                                     "--batch-sizes", "1", "25"])
    bp.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if " batch " in line]
    assert len(lines) == 4 and all("/ 50 placed, GPU allocation" in line for line in lines)
