"""benchmarks/inflation_ceiling.py: per seed, the device ceilings of the openb inflation run's own arrivals are
ordered (placing every early pod can only lower the ceiling), above the policies that respect them, and printed
with the share of the way the target is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agmarl_testing.scripts import script_module

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "inflation_ceiling.py"


@pytest.fixture(scope="module")
def ic():
    with script_module(_PATH, "inflation_ceiling_bench") as module:
        yield module


def test_the_ceilings_are_ordered_and_above_fgd(ic, capsys, monkeypatch, tmp_path):
    out = tmp_path / "ceiling.json"
    monkeypatch.setattr("sys.argv", ["inflation_ceiling.py", "--seeds", "42", "--must", "90,95",
                                     "--policies", "fgd", "--json", str(out), "--detail"])
    ic.main()
    printed = capsys.readouterr().out
    row = json.loads(out.read_text())["seeds"]["42"]
    assert 90.0 < row["must 95"] <= row["must 90"] <= row["free"] < 100.0
    fgd = row["fgd"]
    # FGD's first dropped pod on this seed arrives after 95 %: every ceiling bounds its allocation at 100 %
    assert fgd["first_drop_pct"] > 95.0 and fgd["alloc"] <= row["must 95"]
    assert "fgd: mean" in printed and "of the way to 'must 90'" in printed
    # --detail: the share sizes arrived and where FGD leaves milli empty, the most first
    assert "one-GPU shares arrived by 100 %" in printed and "milli left empty on devices holding shares" in printed
    waste = [w for _, _, w in fgd["waste"]]
    assert waste and waste == sorted(waste, reverse=True) and sum(row["shares"].values()) > 0
