"""benchmarks/experience_cost.py: both forms of one experience decode to a decision the trainer can use, and the
deflated one is the smaller on the wire."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agmarl_testing.scripts import script_module

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "experience_cost.py"


@pytest.fixture(scope="module")
def ec():
    with script_module(_PATH, "experience_cost_bench") as module:
        yield module


def test_the_deflated_experience_is_smaller_and_both_decode(ec, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["experience_cost.py", "--bound", "300", "--pending", "200", "--repeats", "3"])
    assert ec.main() == 0
    out = capsys.readouterr().out
    found = re.findall(r"^(deflated|plain)\s*:\s+([\d.]+) KB on EXPERIENCE", out, re.M)
    sizes = {form: float(kb) for form, kb in found}
    assert set(sizes) == {"deflated", "plain"} and sizes["deflated"] < sizes["plain"]
    assert "3 experiences" in out and out.count("decode_decision") == 2
