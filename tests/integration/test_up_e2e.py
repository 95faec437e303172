"""End to end: `agmarl up` headless on a fresh state directory (its own embedded NATS), then the
summary it writes, the decision log it leaves, and the CLI commands that read them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

AGMARL = [sys.executable, "-m", "agmarl_cli.main"]


@pytest.fixture(scope="module")
def up_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("agmarl-up")
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "AGMARL_NATS_URL")}
    env["AGMARL_STATE_DIR"] = str(root / ".state")
    summary = root / "summary.json"
    proc = subprocess.run([*AGMARL, "up", "--duration", "20", "--summary", str(summary)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=180)
    return proc, summary, env, root


def test_up_headless_summary(up_run):
    proc, summary, _, root = up_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    s = json.loads(summary.read_text())
    assert s["decisions"] > 0
    assert s["pods_bound"] > 0
    assert s["constraint_violations"] == 0
    assert s["services"] == {name: "healthy" for name in
                             ("state-collector", "graph-builder", "inference", "reward-calculator",
                              "adaptive-engine", "trainer")}
    assert s["traces_complete"] >= 0.9 * s["decisions"]
    assert 0 < s["decision_latency_ms"]["p50"] <= s["decision_latency_ms"]["p99"]


def test_up_leaves_no_process_and_no_run_file(up_run):
    _, _, env, root = up_run
    assert not (root / ".state" / "run.json").exists()
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(root) not in out, "a process started by `agmarl up` is still running"


def test_trace_command_prints_span_tree_across_services(up_run):
    _, summary, env, _ = up_run
    s = json.loads(summary.read_text())
    spans = []
    for f in Path(s["trace_dir"]).glob("*.jsonl"):
        spans += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    pod = next(sp["attributes"]["agmarl.pod"] for sp in spans
               if sp["service"] == "inference" and "agmarl.pod" in sp.get("attributes", {}))
    out = subprocess.run([*AGMARL, "trace", pod, "--dir", s["trace_dir"]], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    for service in ("state-collector", "graph-builder", "inference"):
        assert service in out.stdout


def test_up_signs_with_a_key_of_its_state_directory_and_serves_the_signed_shipped_model(up_run):
    _, _, _, root = up_run
    keys = root / ".state" / "keys"
    assert oct((keys / "model-signing.key").stat().st_mode & 0o777) == "0o600"
    assert (keys / "model-signing.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    logs = sorted((root / ".state" / "logs").glob("*/inference.log"))
    assert logs and "loaded from disk default" in logs[-1].read_text()  # signature and digests verified
