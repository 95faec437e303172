"""`agmarl fidelity kube`: the recorded kube-scheduler v1.36 placements (../shared/k8s/sim-to-real)
and tiny literal placement files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agmarl_cli.fidelity import parse_recording, replay, summarise
from agmarl_cli.main import main
from agmarl_common.core.policies.registry import get_policy

TARGET = 0.99


def _repo_root() -> Path:
    for d in Path(__file__).resolve().parents:
        if (d / "pyproject.toml").is_file() and (d / "cli" / "agmarl_cli").is_dir():
            return d
    raise AssertionError("repository root not found above " + str(Path(__file__)))


def _sim_to_real_dir() -> Path:
    """AGMARL_SIM_TO_REAL_DIR, else ../shared/k8s/sim-to-real beside the repository root."""
    d = Path(os.environ.get("AGMARL_SIM_TO_REAL_DIR") or _repo_root().parent / "shared" / "k8s" / "sim-to-real")
    files = sorted(d.glob("placements-*.json"))
    if not files:
        pytest.fail(f"no placement files (placements-*.json) in {d}: the recorded kube-scheduler v1.36 "
                    "placements are expected there (or set AGMARL_SIM_TO_REAL_DIR)")
    return d


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["fidelity", "kube", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_recorded_placements_agree_with_kube_default(capsys, tmp_path):
    d = _sim_to_real_dir()
    for placements in sorted(d.glob("placements-*.json")):
        scores = d / placements.name.replace("placements-", "scores-")
        out_json = tmp_path / f"{placements.stem}.json"
        args = ["--placements", str(placements), "--json", str(out_json)]
        if scores.is_file():
            args += ["--scores", str(scores)]
        rc, out, err = _run(capsys, *args)
        assert rc == 0, err
        assert "real node ranked first (ties allowed)" in out
        report = json.loads(out_json.read_text())
        s = report["summary"]
        assert s["ranked_first"]["total"] > 0 and s["unschedulable_agreement"]["real_unschedulable"] > 0
        assert s["ranked_first"]["share"] >= TARGET, (placements.name, s["ranked_first"])
        assert s["unschedulable_agreement"]["share"] >= TARGET, (placements.name, s["unschedulable_agreement"])
        assert len(report["pods"]) == s["pods"]
        if scores.is_file():  # every weighted plugin score and final score as the real scheduler logged it
            per_plugin = report["scores"]["per_plugin"]
            assert {"final", "NodeResourcesBalancedAllocation", "NodeResourcesFit"} <= set(per_plugin)
            for name, share in per_plugin.items():
                assert share["share"] >= TARGET, (placements.name, name, share, report["scores"]["first_mismatch"])


def test_a_policy_that_is_not_kube_scheduler_falls_short(capsys, tmp_path):
    placements = sorted(_sim_to_real_dir().glob("placements-*.json"))[0]
    out_json = tmp_path / "most.json"
    rc, _, err = _run(capsys, "--placements", str(placements), "--policy", "most-allocated", "--json", str(out_json))
    assert rc == 0, err
    s = json.loads(out_json.read_text())["summary"]
    assert s["ranked_first"]["share"] < 0.8
    assert s["unschedulable_agreement"]["share"] == 1.0  # the hard filter does not depend on the policy


def _node(name: str, cpu: str, mem: str, zone: str = "a") -> dict:
    alloc = {"cpu": cpu, "memory": mem, "pods": "110"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone}},
            "status": {"allocatable": alloc, "capacity": alloc}}


def _pod(name: str, cpu: str, mem: str, node: str | None = None, kind: str = "plain") -> dict:
    spec: dict = {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "rec", "labels": {"kind": kind}}, "spec": spec}


def tiny() -> dict:
    """n0 empty, n1 half full. kube-default puts a small pod on n0 (least allocated)."""
    return {
        "nodes": [_node("n0", "4", "8Gi"), _node("n1", "4", "8Gi")],
        "bound": [_pod("b0", "2", "4Gi", "n1")],
        "sequence": [
            {"pod": _pod("p0", "1", "2Gi"), "node": "n0", "best_nodes": ["n0"], "unschedulable": None},
            {"pod": _pod("p1", "1", "2Gi"), "node": "n1", "best_nodes": ["n1"], "unschedulable": None},  # disagrees
            {"pod": _pod("p2", "64", "1Gi", kind="too-big"), "node": None, "best_nodes": None,
             "unschedulable": "0/2 nodes are available: 2 Insufficient cpu."},
            {"pod": _pod("p3", "100m", "128Mi"), "node": None, "best_nodes": None,
             "unschedulable": "recorded unschedulable, yet it fits"},
        ],
    }


def test_replay_counts_disagreements_and_binds_where_the_real_scheduler_did():
    outcomes = replay(parse_recording(tiny()), get_policy("kube-default"))
    assert [o.ranked_first for o in outcomes] == [True, False, None, None]
    # p1 was scored after p0 went to n0: n0 (1/2 used) against n1 (2/4 used) -> n0 still first
    assert outcomes[1].top_nodes == ("n0",)
    assert [o.unschedulable_agrees for o in outcomes] == [True, True, True, False]
    assert [o.top_set_exact for o in outcomes] == [True, False, None, None]
    s = summarise(outcomes)
    assert s["ranked_first"] == {"agree": 1, "total": 2, "share": 0.5}
    assert s["unschedulable_agreement"]["agree"] == 3 and s["unschedulable_agreement"]["real_only"] == 1
    assert s["ranked_first_by_kind"] == {"plain": {"agree": 1, "total": 2, "share": 0.5}}


def test_tiny_file_through_the_command(capsys, tmp_path):
    f = tmp_path / "placements.json"
    f.write_text(json.dumps(tiny()))
    rc, out, err = _run(capsys, "--placements", str(f))
    assert rc == 0, err
    assert "1/2 = 50.0 %" in out and "3/4 = 75.0 %" in out


@pytest.mark.parametrize("mutate, args, message", [
    (None, ["--placements", "{dir}/absent.json"], "no such file"),
    (lambda d: "not json", ["--placements", "{file}"], "not readable JSON"),
    (lambda d: {**d, "nodes": []}, ["--placements", "{file}"], "'nodes' must be a non-empty list"),
    (lambda d: {**d, "sequence": [{**d["sequence"][0], "node": "n9"}]}, ["--placements", "{file}"],
     "node 'n9' is not one of the file's nodes"),
    (lambda d: {**d, "bound": [_pod("b", "1", "1Gi", "n7")]}, ["--placements", "{file}"], "spec.nodeName 'n7'"),
    (lambda d: {**d, "sequence": [{"pod": {"metadata": {"name": "x"}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "lots"}}}]}}, "node": None}]},
     ["--placements", "{file}"], "lots"),
    (lambda d: d, ["--placements", "{file}", "--policy", "no-such-policy"], "unknown policy"),
    (lambda d: d, ["--placements", "{file}", "--json", "{dir}/missing/out.json"], "does not exist"),
    (lambda d: d, ["--placements", "{file}", "--json", "{dir}/out.txt"], "expected a .json file"),
    (lambda d: d, ["--placements", "{file}", "--policy", "most-allocated", "--scores", "{file}"],
     "needs a weighted-plugins policy"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, mutate, args, message):
    f = tmp_path / "p.json"
    if mutate is not None:
        data = mutate(tiny())
        f.write_text(data if isinstance(data, str) else json.dumps(data))
    rc, out, err = _run(capsys, *[a.format(dir=tmp_path, file=f) for a in args])
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("agmarl fidelity: error:") and message in err, err
