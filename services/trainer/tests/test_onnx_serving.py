"""The learned policy in ONNX Runtime: parity with the trainer's reference calls on real openb graphs,
the incremental encoder cache against full passes, batch scoring, explanations, and model integrity.

The model comes from the trainer's smoke config, trained once per session in a subprocess (torch stays
out of this process); the reference ``export.onnx_scores`` runs in a subprocess too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agmarl_common.serving import modelstore
from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, bind
from agmarl_common.core.features import EDGE_FEATURES, POD_FEATURES, build_graph, device_for, objective_gains
from agmarl_common.serving.onnx_model import EncoderCache, OnnxModelPolicy, make_session
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import traces

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def trusted_test_models(trusted_model_env, tmp_path_factory, monkeypatch):
    """The registry's ``model:`` names (read from the environment) trust the throwaway key and load folders
    from models/ and the session's temporary folder."""
    monkeypatch.setenv(modelstore.ALLOWED_DIRS_ENV,
                       os.pathsep.join((str(modelstore.MODELS_DIR), str(tmp_path_factory.getbasetemp()))))


@pytest.fixture(scope="module")
def openb():
    nodes = traces.load_openb_nodes(traces.openb_node_path(traces.ALL_NODES))
    pods = traces.load_openb_pods(traces.openb_pod_path("default"))
    return nodes, pods


def filled(nodes, pods, count: int, seed: int) -> ClusterState:
    """``count`` random openb pods bound on a random feasible node (partially filled cluster)."""
    rng = np.random.default_rng(seed)
    state = ClusterState.empty(nodes)
    bestfit = get_policy("bestfit")
    for k, j in enumerate(rng.integers(0, len(pods), size=count)):
        pod = replace(pods[j], name=f"fill-{k}")
        cand = feasible_nodes(pod, state)
        if cand.size:
            i = int(rng.choice(cand))
            gpus = bestfit.choose_gpus(pod, state, i)
            if gpus is not None:
                state = bind(state, pod, i, gpus)
    return state


def test_scores_match_the_trainer_reference_on_real_openb_graphs(smoke_model, openb, tmp_path):
    nodes, pods = openb
    state = filled(nodes, pods, 1500, seed=1)
    policy = OnnxModelPolicy.from_dir(smoke_model)
    policy.observe_workload(pods)
    rng = np.random.default_rng(2)
    graphs, ours = {}, []
    for k in range(4):
        pod = pods[int(rng.integers(len(pods)))]
        cand = feasible_nodes(pod, state)
        g = build_graph([pod], state, [cand], policy._context)
        graphs.update({f"{k}_{name}": getattr(g, name) for name in
                       ("node_x", "nn_edge_index", "pod_x", "cand_pod", "cand_node", "cand_attr")})
        ours.append(policy.score(pod, state, cand))
        i = int(cand[int(np.argmax(ours[-1]))])
        state = bind(state, pod, i, policy.choose_gpus(pod, state, i))  # the next graph needs the cache to follow
    np.savez(tmp_path / "graphs.npz", **graphs)
    code = (
        "import sys, numpy as np\n"
        "from types import SimpleNamespace\n"
        "from agmarl_trainer.export import onnx_scores, onnx_sessions\n"
        "d = np.load(sys.argv[2]); s = onnx_sessions(sys.argv[1]); out = {}\n"
        "for k in range(4):\n"
        "    g = SimpleNamespace(**{n: d[f'{k}_{n}'] for n in ('node_x','nn_edge_index','pod_x','cand_pod',"
        "'cand_node','cand_attr')})\n"
        "    out[str(k)] = onnx_scores(s, g)[1]\n"
        "np.savez(sys.argv[3], **out)\n")
    run = subprocess.run([sys.executable, "-c", code, str(smoke_model), str(tmp_path / "graphs.npz"),
                          str(tmp_path / "ref.npz")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    ref = np.load(tmp_path / "ref.npz")
    for k in range(4):
        assert ref[str(k)].shape == ours[k].shape and ours[k].size > 100
        assert np.abs(ref[str(k)] - ours[k]).max() <= 1e-4


def test_incremental_encoder_equals_a_full_pass_after_random_binds(smoke_model, openb):
    nodes, pods = openb
    artifact = modelstore.load_dir(smoke_model, trust=modelstore.trust_from_environment())
    session = make_session(artifact.files["encoder.onnx"])
    policy = OnnxModelPolicy(artifact)
    policy.observe_workload(pods)
    state = filled(nodes, pods, 800, seed=3)
    cache = EncoderCache(session, artifact.layers)
    rng = np.random.default_rng(4)
    worst = 0.0
    for step in range(25):
        for _ in range(int(rng.integers(1, 4))):  # a few binds between encodings
            pod = replace(pods[int(rng.integers(len(pods)))], name=f"rand-{step}-{_}")
            cand = feasible_nodes(pod, state)
            if cand.size:
                i = int(rng.choice(cand))
                state = bind(state, pod, i, policy.choose_gpus(pod, state, i))
        g = build_graph([pods[0]], state, [np.arange(3)], policy._context)
        got = cache(g.node_x, g.nn_edge_index)
        full = session.run(None, {"node_x": g.node_x, "nn_edge_index": g.nn_edge_index})[0]
        worst = max(worst, float(np.abs(got - full).max()))
    assert cache.partial_passes >= 20 and cache.full_passes == 1
    assert worst <= 1e-4


def test_batch_scores_equal_one_pod_at_a_time_and_devices_follow_the_features(smoke_model, openb):
    nodes, pods = openb
    state = filled(nodes[::5], pods, 400, seed=5)
    policy = OnnxModelPolicy.from_dir(smoke_model)
    policy.observe_workload(pods)
    batch = [pods[j] for j in (0, 7, 42, 99, 512, 1024)]
    cands = [feasible_nodes(p, state) for p in batch]
    together = policy.score_batch(batch, state, cands)
    for p, c, s in zip(batch, cands, together):
        assert s.shape == c.shape
        np.testing.assert_allclose(s, policy.score(p, state, c), atol=1e-4)
    # replicas (same inputs) are scored once and copied; a different candidate list is scored apart
    twins = [batch[0], batch[1], batch[0], batch[1], batch[0]]
    twin_cands = [cands[0], cands[1], cands[0], cands[1], cands[0][:-1]]
    out = policy.score_batch(twins, state, twin_cands)
    np.testing.assert_array_equal(out[0], out[2])
    np.testing.assert_array_equal(out[1], out[3])
    assert out[4].shape == twin_cands[4].shape and out[0] is not out[2]
    for p, c, s in zip(twins, twin_cands, out):
        np.testing.assert_allclose(s, policy.score(p, state, c), atol=1e-4)
    share = next(p for p in pods if p.is_gpu_share)
    c = feasible_nodes(share, state)
    i = int(c[int(np.argmax(policy.score(share, state, c)))])
    assert policy.choose_gpus(share, state, i) == device_for(share, state, i, policy._context)


def test_the_same_nodes_in_a_new_tuple_reuse_the_caches(smoke_model, openb):
    nodes, pods = openb
    state = filled(nodes[::8], pods, 200, seed=6)
    policy = OnnxModelPolicy.from_dir(smoke_model)
    policy.observe_workload(pods)
    pod = next(p for p in pods if p.num_gpu > 0 and feasible_nodes(p, state).size > 10)
    c = feasible_nodes(pod, state)
    first = policy.score(pod, state, c)
    copy = replace(state, nodes=tuple(list(state.nodes)))  # what a state rebuilt from the wire looks like
    np.testing.assert_allclose(policy.score(pod, copy, c), first, atol=1e-6)
    assert policy._cache.full_passes == 1
    # the equal tuple is remembered by identity: asked again, it is not walked node by node a second time
    walks = []
    key = OnnxModelPolicy._key
    policy._key = lambda s: walks.append(1) or key(s)
    np.testing.assert_allclose(policy.score(pod, copy, c), first, atol=1e-6)
    assert walks == []
    other = replace(state, nodes=tuple(replace(n, name=n.name + "-x") for n in state.nodes))  # another cluster
    policy.score(pod, other, c)
    assert walks == [1] and policy._nodes is other.nodes  # compared once, then the caches start afresh


def test_explain_names_attention_and_feature_contributions(smoke_model, openb):
    nodes, pods = openb
    state = filled(nodes[::8], pods, 150, seed=7)
    policy = OnnxModelPolicy.from_dir(smoke_model)
    policy.observe_workload(pods)
    pod = next(p for p in pods if p.num_gpu > 0)
    c = feasible_nodes(pod, state)
    scores = policy.score(pod, state, c)
    ex = policy.explain(pod, state, c, top=4)
    assert ex["chosen"] == state.nodes[int(c[int(np.argmax(scores))])].name
    assert ex["model_version"] == policy.version and ex["candidates"] == c.size
    att = [a["attention"] for a in ex["attention"]]
    assert len(att) == 4 and att == sorted(att, reverse=True) and 0 < att[0] <= 1
    contrib = ex["feature_contributions"]
    assert len(contrib) == 4 and all(np.isfinite(x["contribution"]) for x in contrib)
    assert any(abs(x["contribution"]) > 0 for x in contrib)
    assert all(x["feature"].startswith(("edge.", "node.")) for x in contrib)


def test_registry_resolves_model_prefix_and_refuses_a_digest_mismatch(smoke_model, tmp_path):
    policy = get_policy(f"model:{smoke_model}")
    version = json.loads((smoke_model / "manifest.json").read_text())["version"]
    assert isinstance(policy, OnnxModelPolicy) and policy.name == f"model:{version}"
    with pytest.raises(KeyError, match="not found"):
        get_policy(f"model:{tmp_path / 'nothing-here'}")
    bad = tmp_path / "bad"
    shutil.copytree(smoke_model, bad)
    data = bytearray((bad / "actor.onnx").read_bytes())
    data[-1] ^= 0xFF
    (bad / "actor.onnx").write_bytes(bytes(data))
    with pytest.raises(modelstore.ModelIntegrityError, match="sha256 of actor.onnx") as err:
        get_policy(f"model:{bad}")
    assert err.value.reason == "digest"
    (bad / "actor.onnx").unlink()
    with pytest.raises(modelstore.ModelIntegrityError, match="missing") as err:
        modelstore.load_dir(bad, trust=modelstore.trust_from_environment())
    assert err.value.reason == "missing"


def test_set_objective_switches_the_objective_inputs(smoke_model, openb):
    nodes, pods = openb
    state = filled(nodes, pods, 300, seed=4)
    policy = OnnxModelPolicy.from_dir(smoke_model)
    policy.observe_workload(pods)
    pod = pods[7]
    cand = feasible_nodes(pod, state)
    flag, gain = POD_FEATURES.index("objective_composite"), EDGE_FEATURES.index("reward_gain")
    g = policy.graph([pod], state, [cand])
    assert policy.objective == "composite" and g.pod_x[0, flag] == 1.0 and g.cand_attr[:, gain].min() == -1.0
    policy.set_objective("allocation")
    g = policy.graph([pod], state, [cand])
    assert g.pod_x[0, flag] == 0.0 and not g.cand_attr[:, gain].any()
    assert policy.score(pod, state, cand).shape == cand.shape
    with pytest.raises(ValueError, match="unknown objective"):
        policy.set_objective("throughput")
    conditional = OnnxModelPolicy(modelstore.load_local(str(smoke_model), trust=modelstore.trust_from_environment()), scheme="load_conditional")
    conditional.observe_workload(pods)
    want = objective_gains([pod], state, [cand], "composite", "load_conditional")
    assert np.allclose(conditional.graph([pod], state, [cand]).cand_attr[:, gain], want)
    with pytest.raises(ValueError, match="unknown reward scheme"):
        OnnxModelPolicy(modelstore.load_local(str(smoke_model), trust=modelstore.trust_from_environment()), scheme="greedy")


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "models").iterdir() if (p / "manifest.json").is_file()))
def test_every_shipped_model_scores_under_both_objectives(name, openb):
    """Shipped models may predate a feature (their manifest names the columns they read)."""
    nodes, pods = openb
    state = filled(nodes, pods, 200, seed=5)
    pod = pods[3]
    cand = feasible_nodes(pod, state)
    for objective in ("composite", "allocation"):
        policy = OnnxModelPolicy(modelstore.load_local(str(REPO / "models" / name), trust=modelstore.ModelTrust.load()), objective=objective)
        scores = policy.score(pod, state, cand)
        assert scores.shape == cand.shape and np.isfinite(scores).all()
