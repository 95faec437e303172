"""The decomposed actor (``serving.actor_head``) against ``actor.onnx`` in ONNX Runtime with the shipped model:
the same logits and attention on real openb graphs of a filling cluster (one pod and batches), node tables
updated by rows equal to tables computed afresh, quantised graphs declined, and the learned policy's
``prepare`` doing a cluster change's work ahead of the next pod without changing its scores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, bind
from agmarl_common.core.sim import catalog
from agmarl_common.serving import modelstore
from agmarl_common.serving.actor_head import DecomposedActor
from agmarl_common.serving.onnx_model import OnnxModelPolicy, make_session

MODELS = Path(modelstore.MODELS_DIR)


@pytest.fixture(scope="module")
def artifact():
    return modelstore.load_dir(MODELS / "default", trust=modelstore.trust_from_environment())


@pytest.fixture(scope="module")
def pods():
    return catalog.openb_pods("openb:default")


def test_declines_a_quantised_actor_and_recognises_the_float_one():
    int8 = MODELS / "default-int8" / modelstore.ACTOR_FILE
    assert DecomposedActor.from_onnx(int8, make_session(int8)) is None
    actor = MODELS / "default" / modelstore.ACTOR_FILE
    assert DecomposedActor.from_onnx(actor, make_session(actor)) is not None


def test_same_logits_attention_and_picks_as_onnx_runtime_on_a_filling_openb_cluster(artifact, pods):
    ours, ref = OnnxModelPolicy(artifact), OnnxModelPolicy(artifact, decompose=False)
    assert ours.head is not None and ref.head is None
    for p in (ours, ref):
        p.observe_workload(pods)
    state = ClusterState.empty(catalog.cluster_nodes("openb:all")[::4])
    rng = np.random.default_rng(5)
    picks = 0
    for k in range(120):
        pod = pods[int(rng.integers(len(pods)))]
        cand = feasible_nodes(pod, state)
        if cand.size == 0:
            continue
        g = ours.graph([pod], state, [cand])
        _, logits, attention = ours.forward(g)
        _, want_logits, want_attention = ref.forward(ref.graph([pod], state, [cand]))
        np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(attention, want_attention, rtol=1e-4, atol=1e-6)
        assert int(np.argmax(logits)) == int(np.argmax(want_logits))
        i = int(cand[int(np.argmax(logits))])
        gpus = ours.choose_gpus(pod, state, i)
        if gpus is not None:
            state = bind(state, pod, i, gpus)  # one or a few rows change: the tables follow by rows
            picks += 1
        if k % 40 == 39:  # a batch of pods against the same state (several pods per graph)
            batch = [pods[int(j)] for j in rng.integers(len(pods), size=6)]
            cands = [feasible_nodes(p, state) for p in batch]
            got = ours.score_batch(batch, state, cands)
            want = ref.score_batch(batch, state, cands)
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    assert picks >= 100
    assert ours._cache.partial_passes > 0  # the tables were updated by rows, not only rebuilt


def test_node_tables_updated_by_rows_equal_tables_computed_afresh(artifact):
    actor = OnnxModelPolicy(artifact).head
    rng = np.random.default_rng(1)
    n = 300
    emb = rng.uniform(-1, 1, (n, 32)).astype(np.float32)
    node_x = rng.uniform(0, 1, (n, 27)).astype(np.float32)
    table = actor.table()
    table.update(emb, node_x, ("src", 1), None)
    for version in range(2, 6):
        rows = np.unique(rng.integers(0, n, 7))
        emb[rows] = rng.uniform(-1, 1, (rows.size, 32))
        node_x[rows] = rng.uniform(0, 1, (rows.size, 27))
        got = table.update(emb, node_x, ("src", version), rows)
        for a, b in zip(got, actor.table().update(emb, node_x, ("x", 0), None)):
            np.testing.assert_array_equal(a, b)
    emb[3] += 1.0  # a version skipped: the rows given are not the whole change, so every row is recomputed
    got = table.update(emb, node_x, ("src", 7), np.array([], np.int64))
    for a, b in zip(got, actor.table().update(emb, node_x, ("x", 0), None)):
        np.testing.assert_array_equal(a, b)


def test_prepare_and_warm_do_the_cluster_change_ahead_and_leave_the_scores_as_they_were(artifact, pods):
    """``prepare`` (node rows, embeddings, actor tables) and ``warm`` (the common pod shapes' pair rows) between
    pods: the next ``score`` runs no encoder pass and gives the scores of a policy never prepared, bit for bit."""
    prepared, plain = OnnxModelPolicy(artifact), OnnxModelPolicy(artifact)
    for p in (prepared, plain):
        p.observe_workload(pods)
    state = ClusterState.empty(catalog.cluster_nodes("openb:all")[::4])
    rng = np.random.default_rng(9)
    for _ in range(40):
        pod = pods[int(rng.integers(len(pods)))]
        cand = feasible_nodes(pod, state)
        if cand.size == 0:
            continue
        prepared.prepare(state)
        prepared.warm(state)
        passes = (prepared._cache.full_passes, prepared._cache.partial_passes, prepared.head.nodes.key)
        got = prepared.score(pod, state, cand)
        assert (prepared._cache.full_passes, prepared._cache.partial_passes, prepared.head.nodes.key) == passes
        np.testing.assert_array_equal(got, plain.score(pod, state, cand))
        i = int(cand[int(np.argmax(got))])
        gpus = prepared.choose_gpus(pod, state, i)
        if gpus is not None:
            state = bind(state, pod, i, gpus)
