"""`agmarl eval`: small real runs (a 60-node openb sub-cluster, 200 pods; a 20-node synthetic cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agmarl_cli.evaluate import EvalError, EvalSpec, parse_seeds, run_dynamic_with_reward
from agmarl_cli.main import main
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import dynamic, synthetic
from agmarl_common.core.sim.inflation import MAX_ARRIVED_PCT
from agmarl_common.core.sim.traces import GPU_NODES, openb_node_path, openb_pod_path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _head(src: Path, dst: Path, rows: int) -> Path:
    with src.open() as f:
        dst.write_text("".join(line for _, line in zip(range(rows + 1), f)))
    return dst


@pytest.fixture(scope="module")
def openb_small(tmp_path_factory) -> tuple[str, str]:
    """(node csv, pod csv): the first 60 GPU nodes and the first 200 pods of the default trace."""
    d = tmp_path_factory.mktemp("openb")
    return (str(_head(openb_node_path(GPU_NODES), d / "nodes.csv", 60)),
            str(_head(openb_pod_path("default"), d / "pods.csv", 200)))


def _eval(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["eval", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _inflation(openb_small, tmp_path, seeds="42-43", policies="random,bestfit,fgd", *extra):
    nodes, pods = openb_small
    return ["--protocol", "inflation", "--workload", f"openb:{pods}", "--nodes", nodes, "--policies", policies,
            "--seeds", seeds, "--json", str(tmp_path / "out.json"), "--plot", str(tmp_path / "out.png"), *extra]


def test_inflation_report_table_and_png(capsys, tmp_path, openb_small):
    rc, out, err = _eval(capsys, *_inflation(openb_small, tmp_path))
    assert rc == 0, err
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["protocol"] == "inflation" and report["n_nodes"] == 60 and report["seeds"] == [42, 43]
    assert list(report["policies"]) == ["random", "bestfit", "fgd"]
    for name, entry in report["policies"].items():
        for m in ("gpu_alloc_100", "gpu_alloc_130", "frag_100", "frag_130", "failed"):
            cell = entry["metrics"][m]
            assert set(cell) == {"mean", "std"} and cell["std"] >= 0
        assert 50 < entry["metrics"]["gpu_alloc_130"]["mean"] <= 100
        for c in ("allocation", "frag", "frag_ratio"):
            assert len(entry["curves"][c]["mean"]) == len(entry["curves"][c]["std"]) == MAX_ARRIVED_PCT + 1
        assert [r["seed"] for r in entry["runs"]] == [42, 43]
        # the aggregate is the mean of the per-seed runs
        per_seed = [r["metrics"]["gpu_alloc_100"] for r in entry["runs"]]
        assert entry["metrics"]["gpu_alloc_100"]["mean"] == pytest.approx(np.mean(per_seed), abs=1e-6)
        assert f"| {name} |" in out
    # FGD packs at least as well as random on this trace (the paper's ordering)
    p = report["policies"]
    assert p["fgd"]["metrics"]["gpu_alloc_130"]["mean"] > p["random"]["metrics"]["gpu_alloc_130"]["mean"]
    assert (tmp_path / "out.png").read_bytes()[:8] == PNG_MAGIC


def test_same_seed_same_result_across_runs_and_workers(capsys, tmp_path, openb_small):
    args = _inflation(openb_small, tmp_path, "7", "random,fgd")
    assert _eval(capsys, *args)[0] == 0
    first = json.loads((tmp_path / "out.json").read_text())["policies"]
    assert _eval(capsys, *args, "--workers", "2")[0] == 0
    second = json.loads((tmp_path / "out.json").read_text())["policies"]
    assert first == second
    assert _eval(capsys, *_inflation(openb_small, tmp_path, "8", "random,fgd"))[0] == 0
    other = json.loads((tmp_path / "out.json").read_text())["policies"]
    assert other["random"]["curves"]["allocation"] != first["random"]["curves"]["allocation"]


def test_dynamic_report_on_synthetic(capsys, tmp_path):
    rc, out, err = _eval(capsys, "--protocol", "dynamic", "--workload", "synthetic:batch_online_mix",
                         "--nodes", "synthetic:20", "--policies", "kube-default,most-allocated", "--seeds", "1-2",
                         "--horizon", "300", "--json", str(tmp_path / "d.json"), "--plot", str(tmp_path / "d.png"))
    assert rc == 0, err
    report = json.loads((tmp_path / "d.json").read_text())
    for name, entry in report["policies"].items():
        m = entry["metrics"]
        for key in ("util_mean", "util_cpu_mean", "util_mem_mean", "util_gpu_mean", "balance_mean",
                    "pending_time_p50_s", "pending_time_p99_s", "unschedulable", "failed",
                    "sla_violation_rate", "hard_violations", "reward_mean", "reward_balance_mean"):
            assert set(m[key]) == {"mean", "std"}, key
        assert m["hard_violations"]["mean"] == 0
        assert 0 < m["reward_mean"]["mean"] <= 1
        assert len(entry["series"]["time"]) == len(entry["series"]["reward"]["mean"]) == 10
        assert f"| {name} |" in out
    # MostAllocated stacks pods: less balanced than kube-default's LeastAllocated + BalancedAllocation
    p = report["policies"]
    assert p["most-allocated"]["metrics"]["balance_mean"]["mean"] > p["kube-default"]["metrics"]["balance_mean"]["mean"]
    assert (tmp_path / "d.png").read_bytes()[:8] == PNG_MAGIC


def test_reward_runner_replays_dynamic_run():
    nodes = synthetic.synthetic_cluster(12, seed=0)
    pods = synthetic.generate("affinity_heavy", nodes, horizon_s=240, seed=3)
    config = dynamic.SimConfig(horizon_s=240)
    ours, rewards = run_dynamic_with_reward(get_policy("kube-default"), nodes, pods, config, 3, 20.0)
    ref = dynamic.run(get_policy("kube-default"), nodes, pods, config, 3, 20.0)
    assert ours.summary() == ref.summary()
    assert len(rewards) == len(ref.series.time) == 12
    assert all(0 <= r["total"] <= 1 and r["constraints"] == 1.0 for r in rewards)


@pytest.mark.parametrize("text,seeds", [("42-44", [42, 43, 44]), ("5", [5]), ("1,3", [1, 3]), (" 7-7 ", [7])])
def test_parse_seeds(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "51-42", "a-b", "x", "1,1", "-3", "0-5000"])
def test_parse_seeds_rejects(text):
    with pytest.raises(EvalError, match="bad seed range"):
        parse_seeds(text)


BAD = [  # (what, args replacing the defaults, expected words in the message)
    ("missing file", {"--workload": "openb:/nonexistent/pods.csv"}, "file not found"),
    ("wrong columns: nodes as pods", {"--workload": "openb:NODES"}, "missing columns"),
    ("wrong columns: pods as nodes", {"--nodes": "PODS"}, "missing columns"),
    ("unknown policy", {"--policies": "fgd,no-such-policy"}, "unknown policy 'no-such-policy'"),
    ("unknown model", {"--policies": "model:no-such-model"}, "unknown model policy"),
    ("unknown synthetic workload", {"--workload": "synthetic:nope"}, "unknown workload 'synthetic:nope'"),
    ("unknown openb workload", {"--workload": "openb:nope"}, "unknown workload 'openb:nope'"),
    ("unknown workload kind", {"--workload": "alibaba:default"}, "unknown workload"),
    ("bad seed range", {"--seeds": "51-42"}, "bad seed range"),
    ("bad node spec", {"--nodes": "synthetic:many"}, "bad node spec"),
    ("bad output dir", {"--json": "/nonexistent/dir/out.json"}, "does not exist"),
]


@pytest.mark.parametrize("what,override,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, openb_small, what, override, words):
    nodes, pods = openb_small
    args = dict(zip(*[iter(_inflation(openb_small, tmp_path))] * 2))
    for k, v in override.items():
        args[k] = v.replace("NODES", nodes).replace("PODS", pods)
    rc, out, err = _eval(capsys, *[x for kv in args.items() for x in kv])
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agmarl eval: error: ") and words in lines[0], err
    assert not (tmp_path / "out.json").exists()


def test_bad_input_from_the_command_line_has_no_traceback(tmp_path, openb_small):
    nodes, _ = openb_small
    cmd = [sys.executable, "-m", "agmarl_cli.main", "eval", "--protocol", "inflation", "--workload",
           f"openb:{nodes}", "--policies", "fgd", "--seeds", "42"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "missing columns" in proc.stderr


@pytest.mark.parametrize("times,durations,horizon,want_times,want_durations", [
    ((100.0, 150.0), (10.0, 0.0), 3600.0, (0.0, 50.0), (10.0, 0.0)),  # fits: shifted only
    ((0.0, 7200.0), (3600.0, 100.0), 3600.0, (0.0, 3600.0), (1800.0, 50.0)),  # squeezed by 1/2
    ((0.0, 36000.0), (5.0, 0.0), 3600.0, (0.0, 3600.0), (1.0, 0.0)),  # short -> 1 s, forever stays 0
])
def test_compress_times(times, durations, horizon, want_times, want_durations):
    from agmarl_cli.evaluate import compress_times  # noqa: PLC0415
    from agmarl_common.core.cluster.model import Pod  # noqa: PLC0415
    pods = tuple(Pod(name=f"p{k}", cpu_milli=100, memory_mib=1, creation_time=t, duration=d)
                 for k, (t, d) in enumerate(zip(times, durations)))
    out = compress_times(pods, horizon)
    assert tuple(p.creation_time for p in out) == want_times
    assert tuple(p.duration for p in out) == want_durations


def test_spec_defaults_pick_the_cluster_by_workload():
    from agmarl_cli.evaluate import load_nodes  # noqa: PLC0415
    assert len(load_nodes(EvalSpec("dynamic", "synthetic:diurnal"))) == 50
    assert len(load_nodes(EvalSpec("dynamic", "synthetic:diurnal", nodes="synthetic:7"))) == 7


def test_tie_break_option_reaches_the_simulator(capsys, tmp_path, openb_small):
    """FGD's integer scores tie often: the tie-break rule changes its result, BestFit's min-max scores less so."""
    args = _inflation(openb_small, tmp_path, "42-43", "fgd")
    assert _eval(capsys, *args)[0] == 0
    order = json.loads((tmp_path / "out.json").read_text())["policies"]["fgd"]["curves"]["allocation"]["mean"]
    assert _eval(capsys, *args, "--tie-break", "random")[0] == 0
    rand = json.loads((tmp_path / "out.json").read_text())["policies"]["fgd"]["curves"]["allocation"]["mean"]
    assert order != rand
    with pytest.raises(SystemExit):
        main(["eval", *args, "--tie-break", "first"])
    assert EvalSpec(protocol="inflation", workload="openb:default", tie_break="first") is not None
    from agmarl_cli.evaluate import check_spec  # noqa: PLC0415
    with pytest.raises(EvalError, match="tie-break"):
        check_spec(EvalSpec(protocol="inflation", workload="openb:default", tie_break="first"))
