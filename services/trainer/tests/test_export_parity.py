"""Export parity: ONNX Runtime (row-wise GAT, one thread) against the PyG networks, on random graphs of
several sizes and on a real openb graph built by agmarl_common.core.features."""

import numpy as np
import pytest
import torch

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, bind
from agmarl_common.core.features import F_EDGE, F_NODE, F_POD, FeatureContext, build_graph, device_for
from agmarl_common.core.sim import traces
from agmarl_trainer.export import (ACTOR_INPUTS, ACTOR_OUTPUTS, ENCODER_INPUTS, ENCODER_OUTPUTS, RowActor,
                                   RowEncoder, export_onnx, onnx_scores, onnx_sessions)
from agmarl_trainer.model import NetConfig, PolicyNet

TOL = 1e-4


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(7)
    net = PolicyNet(NetConfig(hidden=32, heads=2, encoder_layers=2, mlp=64)).eval()
    out = tmp_path_factory.mktemp("onnx")
    export_onnx(net, out)
    return net, onnx_sessions(out)


def random_graph(n: int, p: int, per_pod: int, seed: int):
    rng = np.random.default_rng(seed)
    src = np.concatenate([np.arange(n), rng.integers(0, n, 4 * n)])
    dst = np.concatenate([np.arange(n), rng.integers(0, n, 4 * n)])
    cand_pod = np.repeat(np.arange(p), per_pod).astype(np.int64)
    cand_node = np.concatenate([rng.choice(n, size=per_pod, replace=False) for _ in range(p)]).astype(np.int64)
    return {"node_x": rng.random((n, F_NODE), dtype=np.float32), "nn_edge_index": np.stack([src, dst]).astype(np.int64),
            "pod_x": rng.random((p, F_POD), dtype=np.float32), "cand_pod": cand_pod, "cand_node": cand_node,
            "cand_attr": (rng.standard_normal((p * per_pod, F_EDGE)) * 2).astype(np.float32)}


def torch_outputs(net, g):
    t = {k: torch.from_numpy(v) for k, v in g.items()}
    with torch.no_grad():
        emb = net.encoder(t["node_x"], t["nn_edge_index"])
        logits, att = net.actor(emb, t["node_x"], t["pod_x"], t["cand_pod"], t["cand_node"], t["cand_attr"],
                                return_attention=True)
    return emb.numpy(), logits.numpy(), att.numpy()


def ort_outputs(sessions, g):
    enc, act = sessions
    emb = enc.run(None, {k: g[k] for k in ENCODER_INPUTS})[0]
    feeds = {"node_emb": emb, **{k: g[k] for k in ACTOR_INPUTS if k != "node_emb"}}
    logits, att = act.run(None, feeds)
    return emb, logits, att


def test_onnx_io_names_are_the_contract(exported):
    _, (enc, act) = exported
    assert [i.name for i in enc.get_inputs()] == list(ENCODER_INPUTS)
    assert [o.name for o in enc.get_outputs()] == list(ENCODER_OUTPUTS)
    assert [i.name for i in act.get_inputs()] == list(ACTOR_INPUTS)
    assert [o.name for o in act.get_outputs()] == list(ACTOR_OUTPUTS)


@pytest.mark.parametrize("n,p,per_pod", [(10, 1, 3), (10, 4, 5), (200, 8, 50), (1523, 3, 1000)])
def test_onnx_matches_pyg(exported, n, p, per_pod):
    net, sessions = exported
    g = random_graph(n, p, per_pod, seed=n + p)
    emb_t, logits_t, att_t = torch_outputs(net, g)
    emb_o, logits_o, att_o = ort_outputs(sessions, g)
    assert emb_o.shape == (n, 32) and logits_o.shape == (p * per_pod,) and att_o.shape == (p * per_pod,)
    assert np.abs(emb_o - emb_t).max() <= TOL
    assert np.abs(logits_o - logits_t).max() <= TOL
    assert np.abs(att_o - att_t).max() <= TOL
    # attention is a softmax over each pod's candidates
    assert np.allclose(np.bincount(g["cand_pod"], weights=att_o, minlength=p), 1.0, atol=1e-5)


def test_rowwise_modules_match_pyg_in_torch(exported):
    net, _ = exported
    g = {k: torch.from_numpy(v) for k, v in random_graph(50, 2, 10, seed=3).items()}
    with torch.no_grad():
        emb = net.encoder(g["node_x"], g["nn_edge_index"])
        assert torch.allclose(RowEncoder(net)(g["node_x"], g["nn_edge_index"]), emb, atol=1e-6)
        a = net.actor(emb, g["node_x"], g["pod_x"], g["cand_pod"], g["cand_node"], g["cand_attr"])
        b, _ = RowActor(net)(emb, g["node_x"], g["pod_x"], g["cand_pod"], g["cand_node"], g["cand_attr"])
    assert torch.allclose(a, b, atol=1e-6)


def test_onnx_matches_pyg_on_a_real_openb_graph(exported):
    net, sessions = exported
    nodes, pods = traces.load_openb_nodes(), traces.load_openb_pods()
    ctx = FeatureContext.from_workload(pods)
    state = ClusterState.empty(nodes)
    for k, pod in enumerate(pods[:300]):  # a partly filled cluster
        cand = feasible_nodes(pod, state)
        i = int(cand[(k * 37) % len(cand)])
        state = bind(state, pod, i, device_for(pod, state, i, ctx))
    batch = [p for p in pods[300:305]]
    graph = build_graph(batch, state, [feasible_nodes(p, state) for p in batch], ctx)
    g = {k: getattr(graph, k) for k in ("node_x", "nn_edge_index", "pod_x", "cand_pod", "cand_node", "cand_attr")}
    emb_t, logits_t, _ = torch_outputs(net, g)
    emb_o, logits_o, att_o = onnx_scores(sessions, graph)
    assert graph.n_nodes == 1523 and graph.n_cand > 1000
    assert np.abs(emb_o - emb_t).max() <= TOL
    assert np.abs(logits_o - logits_t).max() <= TOL


def test_incremental_encoder_equals_full_passes(exported):
    from agmarl_trainer.evaluate import IncrementalEncoder

    _, (enc, _) = exported
    nodes = traces.load_openb_nodes()
    state = ClusterState.empty(nodes)
    ctx = FeatureContext.from_workload(traces.load_openb_pods())
    edges = ctx.nn_edges(state)
    inc = IncrementalEncoder(enc, layers=2)
    inc(ctx.node_x(state), edges)
    rng = np.random.default_rng(0)
    for pod in traces.load_openb_pods()[:20]:
        cand = feasible_nodes(pod, state)
        i = int(rng.choice(cand))
        state = bind(state, pod, i, device_for(pod, state, i, ctx))
        x = ctx.node_x(state)
        full = enc.run(None, {"node_x": x, "nn_edge_index": edges})[0]
        assert np.abs(inc(x, edges) - full).max() <= 1e-5
