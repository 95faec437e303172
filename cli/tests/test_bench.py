"""`agmarl bench latency` and `model:<dir>` policies in `agmarl eval`, on small real runs.

The model comes from the trainer's smoke config (trained once per session in a subprocess). The bench
runs in a subprocess: it pins its process to one CPU, which must not pin the test runner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agmarl_cli.bench import cluster_nodes
from agmarl_cli.main import main
from agmarl_common.serving import modelstore
from agmarl_common.core.sim.traces import GPU_NODES, openb_node_path, openb_pod_path

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def trusted_test_models(trusted_model_env, tmp_path_factory, monkeypatch):
    """This process and the bench it starts trust the throwaway key and load folders from models/ and the
    session's temporary folder."""
    monkeypatch.setenv(modelstore.ALLOWED_DIRS_ENV,
                       os.pathsep.join((str(modelstore.MODELS_DIR), str(tmp_path_factory.getbasetemp()))))


def bench(model: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    run = subprocess.run([sys.executable, "-m", "agmarl_cli.main", "bench", "latency", "--model", str(model),
                          "--json", str(out), *args], capture_output=True, text=True, timeout=120)
    return run, (json.loads(out.read_text()) if out.is_file() else {})


@pytest.mark.parametrize("batch", [1, 8])
def test_bench_latency_reports_percentiles_of_warm_incremental_scoring(smoke_model, tmp_path, batch):
    run, report = bench(smoke_model, tmp_path / "lat.json", "--nodes", "400", "--batch", str(batch),
                        "--steps", "30", "--warmup", "5", "--fill", "600")
    assert run.returncode == 0, run.stderr[-3000:]
    version = json.loads((smoke_model / "manifest.json").read_text())["version"]
    assert report["model_version"] == version and report["nodes"] == 400 and report["batch"] == batch
    assert report["steps"] == 30 and report["onnx_threads"] == 1 and report["cpu"] is not None
    assert 0 < report["p50_ms"] <= report["p99_ms"] <= report["max_ms"]
    assert report["fill_pods"] > 300 and report["candidates_mean"] > 0
    # one encoder call per step at most; with one pod a step (two node rows change) it is incremental:
    # one full pass, then partial ones
    assert 1 <= report["encoder_full_passes"] + report["encoder_partial_passes"] <= 35
    if batch == 1:
        assert report["encoder_full_passes"] == 1 and report["encoder_partial_passes"] >= 30
    assert f"p99 {report['p99_ms']} ms" in run.stdout
    assert "target_p99_ms" not in report  # targets are for the 1,523 / 5,000-node settings only


def test_bench_latency_refuses_a_missing_model(tmp_path):
    run, report = bench(tmp_path / "none", tmp_path / "lat.json", "--nodes", "50", "--steps", "1")
    assert run.returncode == 2 and not report
    assert "not found" in run.stderr


def test_synthetic_large_cluster_replicates_openb_nodes_with_unique_names():
    nodes = cluster_nodes(5000)
    assert len(nodes) == 5000 and len({n.name for n in nodes}) == 5000
    base = cluster_nodes(1523)
    assert nodes[:1523] == base and nodes[1523].cpu_milli == base[0].cpu_milli
    assert len(cluster_nodes(10)) == 10


def _head(src: Path, dst: Path, rows: int) -> Path:
    with src.open() as f:
        dst.write_text("".join(line for _, line in zip(range(rows + 1), f)))
    return dst


def test_eval_runs_a_model_policy_next_to_a_baseline(smoke_model, tmp_path, capsys):
    nodes = _head(openb_node_path(GPU_NODES), tmp_path / "nodes.csv", 40)
    pods = _head(openb_pod_path("default"), tmp_path / "pods.csv", 150)
    name = f"model:{smoke_model}"
    rc = main(["eval", "--protocol", "inflation", "--workload", f"openb:{pods}", "--nodes", str(nodes),
               "--policies", f"{name},bestfit", "--seeds", "42", "--json", str(tmp_path / "out.json")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads((tmp_path / "out.json").read_text())
    assert list(report["policies"]) == [name, "bestfit"]
    alloc = report["policies"][name]["metrics"]["gpu_alloc_130"]["mean"]
    assert 30 < alloc <= 100
    assert name in out
    rc = main(["eval", "--protocol", "inflation", "--workload", f"openb:{pods}", "--nodes", str(nodes),
               "--policies", f"model:{tmp_path / 'missing'},bestfit", "--seeds", "42"])
    assert rc == 2 and "unknown model policy" in capsys.readouterr().err
