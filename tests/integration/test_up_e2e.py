"""End to end: `agmarl up` headless on a fresh state directory (its own embedded NATS), with one service
killed with SIGKILL once the system is up (the supervisor restarts it), then the summary it writes, the
decision log it leaves, and the CLI commands that read them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

AGMARL = [sys.executable, "-m", "agmarl_cli.main"]


@pytest.fixture(scope="module")
def up_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("agmarl-up")
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "AGMARL_NATS_URL")}
    env["AGMARL_STATE_DIR"] = str(root / ".state")
    summary = root / "summary.json"
    proc = subprocess.Popen([*AGMARL, "up", "--duration", "25", "--summary", str(summary)], env=env, cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    up = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("agmarl: cluster "):  # printed once every service answered healthy
                up.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if up.wait(120):  # the adaptive-engine killed: `up` restarts it and counts the exit
            pid = json.loads((root / ".state" / "run.json").read_text())["pids"]["adaptive-engine"]
            os.kill(pid, signal.SIGKILL)
        stderr = proc.communicate(timeout=180)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reader.join(10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), stderr), summary, env, root


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
    # a trace is complete once its pod is bound (the state-collector's span is the bind): decisions still in
    # flight when the run ends cannot be (1-14 % of them, by the machine's load)
    assert s["traces_complete"] >= 0.9 * s["pods_bound"]
    lat = s["decision_latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"]
    # the latency is over the pods announced once every service was healthy; earlier ones are start-up, apart
    assert lat["count"] + s["startup"]["decisions"] == s["decisions"]
    assert lat["measured"].startswith("pod published (state-collector) -> decision made (inference)")
    # parted by inference's spans into the wait before inference took the pod up and the decision itself
    assert 0 < lat["split_count"] <= lat["count"]
    assert lat["queue_ms"]["count"] == lat["decide_ms"]["count"] == lat["split_count"]
    # the offered load against what was decided, and the machine it ran on
    load = s["load"]
    assert load["announced_per_s"] > 0 and load["decided_per_s"] > 0 and isinstance(load["keeping_up"], bool)
    assert load["cpus"] >= 1 and len(load["load_1m"]) == 2
    assert s["ended"] == "duration" and s["short_run"] is False


def test_up_restarts_a_killed_service_and_reports_its_exit(up_run):
    proc, summary, _, _ = up_run
    s = json.loads(summary.read_text())
    assert s["supervision"]["adaptive-engine"] == {"restarts": 1, "exits": ["exited -9"], "running": True}
    assert s["restarts"] == 1
    assert s["supervision"]["nats-server"] == {"restarts": 0, "exits": [], "running": True}
    assert "adaptive-engine exited -9" in proc.stderr


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
