"""CI smoke: `agmarl train` with the smoke config -> ONNX export -> parity -> the exported actor schedules a
real openb pod through the one Policy interface."""

import json
from pathlib import Path

import numpy as np
import pytest

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, bind
from agmarl_common.core.policies.base import select_node
from agmarl_common.core.sim import traces
from agmarl_trainer.cli import main
from agmarl_trainer.evaluate import onnx_scorer
from agmarl_trainer.export import sha256_file
from agmarl_trainer.rollout import LearnedPolicy, torch_scorer
from agmarl_trainer.train import load_checkpoint

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smoke")
    out = tmp / "model"
    rc = main(["--config", str(ROOT / "configs/train/smoke.yaml"), "--out", str(out), "--runs-dir", str(tmp / "runs")])
    return rc, out, tmp / "runs" / "smoke"


def test_smoke_training_writes_a_complete_model(trained):
    rc, out, run = trained
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    for name in ("encoder.onnx", "actor.onnx", "model.pt", "report.md"):
        assert manifest["files"][name] == sha256_file(out / name)
    assert max(manifest["parity"]["max_abs_diff"].values()) <= 1e-4
    assert manifest["training"]["config"]["name"] == "smoke"
    assert manifest["contract"]["actor"]["inputs"] == ["node_emb", "node_x", "pod_x", "cand_pod", "cand_node",
                                                       "cand_attr"]
    rows = (run / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("phase,step") and any(r.startswith("imitation,") for r in rows)
    assert any(r.startswith("rl,") for r in rows) and any(r.startswith("eval,") for r in rows)
    assert 0 < manifest["evaluation"]["quick"]["alloc_at_100"] <= 100


def test_exported_actor_schedules_a_real_openb_pod(trained):
    _, out, _ = trained
    nodes, pods = traces.load_openb_nodes(), traces.load_openb_pods()
    onnx_policy = LearnedPolicy(onnx_scorer(out))
    torch_policy = LearnedPolicy(torch_scorer(load_checkpoint(out / "model.pt")))
    for p in (onnx_policy, torch_policy):
        p.observe_workload(pods)
    state = ClusterState.empty(nodes)
    for pod in pods[:50]:
        cand = feasible_nodes(pod, state)
        i = select_node(onnx_policy, pod, state, cand)
        gpus = onnx_policy.choose_gpus(pod, state, i)
        assert i in set(cand.tolist()) and gpus is not None and len(gpus) == pod.num_gpu
        state = bind(state, pod, i, gpus)
    pod = next(p for p in pods[50:] if p.is_gpu_share)
    cand = feasible_nodes(pod, state)
    s_onnx = onnx_policy.score(pod, state, cand)
    s_torch = torch_policy.score(pod, state, cand)
    assert s_onnx.shape == cand.shape and np.isfinite(s_onnx).all()
    assert np.abs(s_onnx - s_torch).max() <= 1e-4


def test_full_protocol_evaluation_runs_the_exported_model_and_baselines(trained):
    from agmarl_trainer.evaluate import evaluate_openb

    _, out, _ = trained
    res = evaluate_openb(out, ["default"], [42], policies=("model", "fgd"), workers=1, n_nodes=150)
    per = res["default"]
    assert set(per) == {"model", "fgd", "gap_to_fgd"}
    assert 50.0 < per["model"]["seeds"][42] <= 100.0 and 50.0 < per["fgd"]["mean"] <= 100.0
    assert per["gap_to_fgd"] == round(per["model"]["mean"] - per["fgd"]["mean"], 3)


def test_evaluate_only_refuses_a_model_folder_whose_files_do_not_match_the_manifest(trained, tmp_path, capsys):
    import shutil

    _, out, _ = trained
    copy = tmp_path / "model"
    shutil.copytree(out, copy)
    before = (copy / "manifest.json").read_text()
    with open(copy / "actor.onnx", "ab") as f:
        f.write(b"\0")
    rc = main(["--config", str(ROOT / "configs/train/smoke.yaml"), "--out", str(copy), "--evaluate-only"])
    assert rc == 1 and "digest mismatch for actor.onnx" in capsys.readouterr().err
    assert (copy / "manifest.json").read_text() == before  # nothing rewritten
