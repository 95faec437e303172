"""The learned policy's explanation of a loop decision: its feature contributions are the occlusion the
docstring defines (checked against a plain one-feature-at-a-time computation with the shipped ONNX model),
and the explanation's top lists are the stable orders a full sort gives."""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from agmarl_common.core.cluster.filters import feasible_mask
from agmarl_common.core.cluster.model import ClusterState, bind
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import catalog
from agmarl_common.serving.onnx_model import EXPLAIN_TOP, OnnxModelPolicy, top_order
from agmarl_inference.decide import decide

ROOT = Path(__file__).resolve().parents[3]


def shipped_model(tmp_path: Path) -> Path:
    model_dir = ROOT / "models" / "default"
    if (model_dir / "manifest.json").exists():
        return model_dir
    for f in ("actor.onnx", "encoder.onnx", "manifest.json", "manifest.sig", "model.pt", "report.md"):  # being retrained
        data = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:models/default/{f}"], capture_output=True).stdout
        (tmp_path / f).write_bytes(data)
    return tmp_path


def occlusion_reference(policy: OnnxModelPolicy, emb, g, logits) -> dict[str, float]:
    """The definition, one actor call per feature: the pick's logit over the ``EXPLAIN_TOP`` best candidates
    as scored, minus its logit with that one feature set to its mean over them."""
    keep = np.argsort(-logits, kind="stable")[:EXPLAIN_TOP]
    nodes = g.cand_node[keep]
    k = keep.size

    def pick_logit(attr, node_x) -> float:
        out, _ = policy.actor.run(None, {"node_emb": emb[nodes], "node_x": node_x, "pod_x": g.pod_x,
                                         "cand_pod": np.zeros(k, np.int64), "cand_node": np.arange(k, dtype=np.int64),
                                         "cand_attr": attr})
        return float(out[0])

    attr0, node0 = g.cand_attr[keep], g.node_x[nodes]
    base = pick_logit(attr0, node0)
    out = {}
    for j, f in enumerate(policy._names["edge"]):
        attr = attr0.copy()
        attr[:, j] = attr0[:, j].mean()
        out[f"edge.{f}"] = base - pick_logit(attr, node0)
    for j, f in enumerate(policy._names["node"]):
        node_x = node0.copy()
        node_x[:, j] = node0[:, j].mean()
        out[f"node.{f}"] = base - pick_logit(attr0, node_x)
    return out


@pytest.fixture(scope="module")
def policy_and_pods(tmp_path_factory):
    policy = OnnxModelPolicy.from_dir(shipped_model(tmp_path_factory.mktemp("model")))
    pods = catalog.openb_pods("openb:default")
    policy.observe_workload(pods)
    return policy, pods


def test_feature_contributions_are_the_occlusion_of_the_pick_against_the_runner_up(policy_and_pods):
    policy, pods = policy_and_pods
    nodes = catalog.cluster_nodes("openb:all")[::12]
    state = ClusterState.empty(nodes)
    default = get_policy("kube-resources")
    checked = zeros = 0
    for pod in pods[:160]:  # fill the cluster with the learned policy's own decisions, checking each one
        choice = decide(pod, state, policy, default, "full", 0.7, explain_model=True)
        if not choice.node:
            continue
        cand = np.flatnonzero(feasible_mask(pod, state))
        _, _, _, g, emb, logits, attention = policy._last
        got = policy._occlusion(emb, g, logits)
        want = occlusion_reference(policy, emb, g, logits)
        assert got.keys() == want.keys()
        for f in want:
            assert got[f] == pytest.approx(want[f], abs=1e-4), f  # float32, batched vs one call each
        zeros += sum(v == 0.0 for v in got.values())
        model = choice.explanation["model"]
        assert model["chosen"] == choice.node and model["candidates"] == cand.size
        shown = [a["node"] for a in model["attention"]]
        assert shown == [state.nodes[int(cand[k])].name for k in np.argsort(-attention, kind="stable")[:3]]
        ranked = sorted(got.items(), key=lambda kv: -abs(kv[1]))[:3]
        assert [c["feature"] for c in model["feature_contributions"]] == [f for f, _ in ranked]
        state = bind(state, pod, state.index[choice.node], choice.gpus)
        checked += 1
    assert checked >= 100
    assert zeros > 0  # features equal on both candidates contribute exactly 0 (not run through the actor)


def test_top_order_is_the_stable_order_of_a_full_sort():
    rng = np.random.default_rng(3)
    for t in range(3000):
        n, k = int(rng.integers(0, 30)), int(rng.integers(1, 6))
        values = (rng.integers(0, 4, n) if t % 2 else rng.random(n)).astype(np.float32)  # many ties, or none
        assert top_order(values, k).tolist() == np.argsort(-values, kind="stable")[:k].tolist()
