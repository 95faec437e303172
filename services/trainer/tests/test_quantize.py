"""The INT8 variant (``agmarl_trainer.quantize``): the Gemm rewrite is the same function, the quantiser writes
a loadable model folder, and the shipped ``models/default-int8`` is current, loads through the policy registry
and picks what the float model picks on an openb sub-cluster."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from agmarl_common.serving import modelstore
from agmarl_common.serving.onnx_model import OnnxModelPolicy, make_session
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import traces
from agmarl_common.core.sim.inflation import run_inflation
from agmarl_trainer.quantize import QuantizeConfig, gemm_to_matmul, quantize_model

REPO = Path(__file__).resolve().parents[3]
FLOAT_DIR, INT8_DIR = REPO / "models" / "default", REPO / "models" / "default-int8"
GRAPHS = (modelstore.ENCODER_FILE, modelstore.ACTOR_FILE)
# share of the float model's decisions the INT8 pick equals, 100 openb GPU nodes, default pods, seed 0
# (measured 0.978 for dynamic INT8; seeds 1-2: 0.981, 0.989)
MIN_AGREEMENT = 0.95


def _actor_inputs(rng: np.random.Generator, n: int = 40, p: int = 3, e: int = 60) -> dict[str, np.ndarray]:
    return {"node_emb": rng.normal(size=(n, 32)).astype(np.float32),
            "node_x": rng.random((n, 27), dtype=np.float32), "pod_x": rng.random((p, 12), dtype=np.float32),
            "cand_pod": np.sort(rng.integers(0, p, e)).astype(np.int64), "cand_node": rng.integers(0, n, e),
            "cand_attr": rng.random((e, 15), dtype=np.float32)}


def test_gemm_to_matmul_is_the_same_function():
    model = onnx.load(FLOAT_DIR / modelstore.ACTOR_FILE)
    rewritten = gemm_to_matmul(model)
    assert not [n for n in rewritten.graph.node if n.op_type == "Gemm"]
    assert len([n for n in rewritten.graph.node if n.op_type == "MatMul"]) == \
        len([n for n in model.graph.node if n.op_type == "Gemm"])
    feeds = _actor_inputs(np.random.default_rng(0))
    want = make_session(model.SerializeToString()).run(None, feeds)
    got = make_session(rewritten.SerializeToString()).run(None, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["dynamic", "weight-only"])
def test_quantize_model_writes_a_variant_folder(tmp_path, method):
    manifest = quantize_model(FLOAT_DIR, tmp_path, QuantizeConfig(method=method))
    source = json.loads((FLOAT_DIR / modelstore.MANIFEST).read_text())
    on_disk = json.loads((tmp_path / modelstore.MANIFEST).read_text())
    assert on_disk == manifest
    assert sorted(manifest["files"]) == sorted(GRAPHS)
    for name in GRAPHS:
        assert manifest["files"][name] == modelstore.sha256((tmp_path / name).read_bytes())
    assert manifest["variant"] == f"int8-{method}"
    assert manifest["quantised_from"] == {"version": source["version"],
                                          "files": {n: source["files"][n] for n in GRAPHS}}
    assert manifest["version"].startswith(f"{source['version']}-int8-")
    assert manifest["contract"] == source["contract"] and manifest["training"] == source["training"]
    assert manifest["quantisation"]["graphs"]["actor.onnx"]["float"] == ["score.0.weight"]
    ops = {n.op_type for name in GRAPHS for n in onnx.load(tmp_path / name).graph.node}
    assert ({"MatMulInteger", "DynamicQuantizeLinear"} if method == "dynamic" else {"MatMulNBits"}) <= ops
    assert "Gemm" not in ops
    again = quantize_model(FLOAT_DIR, tmp_path / "again", QuantizeConfig(method=method))
    assert again["files"] == manifest["files"]  # the same bytes from the same source: reproducible


def test_quantize_refuses_graphs_that_do_not_match_their_manifest(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(FLOAT_DIR, src)
    (src / modelstore.ACTOR_FILE).write_bytes((src / modelstore.ACTOR_FILE).read_bytes() + b"\0")
    with pytest.raises(modelstore.ModelIntegrityError):
        quantize_model(src, tmp_path / "out")


def test_shipped_int8_is_quantised_from_the_shipped_default():
    int8 = json.loads((INT8_DIR / modelstore.MANIFEST).read_text())
    source = json.loads((FLOAT_DIR / modelstore.MANIFEST).read_text())
    assert int8["quantised_from"]["files"] == {n: source["files"][n] for n in GRAPHS}, \
        "models/default changed: regenerate with `agmarl train --quantize models/default --out models/default-int8`"
    for name in GRAPHS:
        assert int8["files"][name] == modelstore.sha256((INT8_DIR / name).read_bytes())


@pytest.fixture
def trusted_int8(tmp_path, trusted_model_env, monkeypatch) -> Path:
    """A copy of models/default-int8 signed with the session's throwaway key, which this process trusts next
    to the release key: the registry loads it whether or not the shipped folder carries its signature yet."""
    d = tmp_path / "models" / "default-int8"
    shutil.copytree(INT8_DIR, d, ignore=shutil.ignore_patterns(modelstore.SIGNATURE_FILE))
    trusted_model_env.sign(d)
    monkeypatch.setenv(modelstore.ALLOWED_DIRS_ENV, os.pathsep.join([str(modelstore.MODELS_DIR), str(tmp_path)]))
    return d


def test_int8_loads_through_the_registry_and_picks_as_the_float_model(trusted_int8):
    int8 = get_policy(f"model:{trusted_int8}")
    assert isinstance(int8, OnnxModelPolicy)
    assert int8.manifest["variant"].startswith("int8")
    nodes = traces.load_openb_nodes(traces.openb_node_path(traces.GPU_NODES))[:100]
    pods = traces.load_openb_pods(traces.openb_pod_path("default"))

    count = {"decisions": 0, "agree": 0}

    class Probe(OnnxModelPolicy):  # the float model's run; counts where the INT8 pick is the same
        def score(self, pod, state, candidates):
            s, q = super().score(pod, state, candidates), int8.score(pod, state, candidates)
            assert q.shape == s.shape and np.isfinite(q).all()
            count["decisions"] += 1
            count["agree"] += int(np.argmax(s) == np.argmax(q))
            return s

    probe = Probe(get_policy("model:default").artifact)
    int8.set_objective("allocation")  # what run_inflation tells the probe
    int8.observe_workload(pods)
    run_inflation(nodes, pods, probe, np.random.default_rng(0))
    assert count["decisions"] > 500
    assert count["agree"] / count["decisions"] >= MIN_AGREEMENT, count
