"""The chaos benchmark's short version (benchmarks/chaos.py, issue 14.6): a small simulated cluster under
the supervised system, the reward-calculator killed with SIGKILL (the decisions it held come again after
ack_wait, some for pods that have finished and left since), inference killed with SIGKILL, then graph-builder
stopped (SIGSTOP, 3 s, SIGCONT).
Asserts what the system promises today: decisions flow again within the bound, no acknowledged decision
lost, no pod bound twice, every bound decision has its experience, no hard-filter violation."""

from __future__ import annotations

from pathlib import Path

import pytest
from agmarl_testing.scripts import script_module

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"


@pytest.fixture(scope="module")
def chaos():
    with script_module(_PATH, "chaos_bench") as module:
        yield module


async def test_short_chaos_run_keeps_the_invariants(chaos, tmp_path, monkeypatch):
    monkeypatch.setenv("AGMARL_STATE_DIR", str(tmp_path / ".state"))  # run() sets these: restored after the test
    for name in ("NATS_URL", "AGMARL_NATS_URL", "AGMARL_NATS_CREDS_DIR"):
        monkeypatch.delenv(name, raising=False)
    faults = [chaos.Fault("reward-calculator", "kill"), chaos.Fault("inference", "kill"),
              chaos.Fault("graph-builder", "stop")]
    result = await chaos.run(faults, tmp_path / ".state", nodes=20, stop_seconds=3.0, steady=3.0,
                             recover_timeout=60.0, ack_wait=5.0, log=lambda s: None)
    table = chaos.table(result)
    assert result["supervision"]["inference"]["exits"] == ["exited -9"], table
    assert result["supervision"]["reward-calculator"]["exits"] == ["exited -9"], table
    assert result["binder_consumer"].get("pending") == 0, result["binder_consumer"]  # read, and all applied
    for fault in result["faults"]:
        assert fault["recover_s"] is not None and fault["recover_s"] <= 60.0, table
        counts = fault["counts"]
        assert counts["decisions"] > 0, table
        assert counts["lost"] == 0, table
        assert counts["bound_twice"] == 0, table
        assert counts["bound_without_experience"] == 0, table
        assert counts["violations"] == 0, table
