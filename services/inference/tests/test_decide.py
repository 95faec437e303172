"""One decision for one pod on the whole cluster: hard filter, blending by rollout mode, ties, explanation."""

import numpy as np
import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.policies.base import PolicyBase
from agmarl_common.core.policies.registry import get_policy
from agmarl_inference.decide import TIE_ORDER_LABEL, TOP_SCORES, best_first, blend, decide, tie_order


class PreferLast(PolicyBase):
    """A stand-in 'model' that prefers the last candidate."""

    name = "prefer-last"

    def score(self, pod, state, candidates):
        return np.asarray(candidates, dtype=float)


def cluster() -> ClusterState:
    s = ClusterState.empty([Node("a", 4000, 4000), Node("b", 4000, 4000), Node("c", 1000, 1000)])
    return bind(s, Pod("busy", 3000, 3000), 0)


def test_hard_filter_runs_on_the_whole_state():
    """a has 1000 cpu left, c has 1000: only b fits a 2000 m pod; the explanation names why a was filtered."""
    choice = decide(Pod("p", 2000, 100), cluster(), PreferLast(), get_policy("kube-resources"), "full", 0.7)
    assert choice.node == "b" and set(choice.scores) == {"b"}
    assert choice.explanation["filtered_out"] == 2
    assert "Insufficient cpu" in choice.explanation["filter_reasons"]["a"]


def test_ties_go_to_the_lowest_tie_order_else_the_first_node():
    nodes = [Node(f"n{k}", 4000, 4000, labels={TIE_ORDER_LABEL: str(r)}) for k, r in enumerate((2, 0, 1))]
    state = ClusterState.empty(nodes)
    flat = get_policy("random")  # not used for ties: a constant scorer below
    const = PreferLast()
    const.score = lambda pod, st, cand: np.zeros(len(cand))  # type: ignore[method-assign]
    assert tie_order(state).tolist() == [2, 0, 1]
    assert decide(Pod("p", 100, 100), state, const, flat, "full", 0.7, rank=tie_order(state)).node == "n1"
    assert decide(Pod("p", 100, 100), state, const, flat, "full", 0.7).node == "n0"
    assert tie_order(cluster()) is None


def test_a_decision_logs_the_top_candidates_only():
    nodes = [Node(f"n{k}", 4000, 4000) for k in range(TOP_SCORES + 10)]
    choice = decide(Pod("p", 100, 100), ClusterState.empty(nodes), PreferLast(), get_policy("kube-resources"),
                    "full", 0.7)
    assert choice.node == nodes[-1].name and len(choice.scores) == TOP_SCORES and choice.node in choice.scores
    assert choice.explanation["candidates"] == len(nodes)


@pytest.mark.parametrize("mode,expected", [("full", [100.0, 0.0]), ("shadow", [0.0, 100.0]),
                                           ("hybrid", [70.0, 30.0])])
def test_blend(mode, expected):
    assert blend(np.array([100.0, 0.0]), np.array([0.0, 100.0]), mode, 0.7).tolist() == pytest.approx(expected)


def test_decide_uses_default_scoring_least_allocated():
    choice = decide(Pod("p", 500, 500), cluster(), get_policy("kube-resources"), get_policy("kube-resources"),
                    "full", 0.7)
    assert choice.node == "b"  # emptiest node with room
    assert choice.explanation["top"][0]["node"] == "b"
    assert set(choice.scores) == {"a", "b", "c"}


def test_decide_modes_follow_model_or_default():
    default = get_policy("kube-resources")
    model = PreferLast()
    full = decide(Pod("p", 500, 500), cluster(), model, default, "full", 0.7)
    shadow = decide(Pod("p", 500, 500), cluster(), model, default, "shadow", 0.7)
    assert full.node == "c" and shadow.node == "b"
    assert shadow.model_scores["c"] == 100.0  # the model's choice is still logged


def test_decide_with_no_feasible_node_says_why():
    choice = decide(Pod("huge", 99_000, 1), cluster(), get_policy("kube-resources"), get_policy("kube-resources"),
                    "full", 0.7)
    assert choice.node == "" and choice.explanation["reason"] == "no feasible node"
    assert choice.explanation["filtered_out"] == 3
    assert all("Insufficient cpu" in r for r in choice.explanation["filter_reasons"].values())


def test_learned_policy_explains_its_pick():
    """With a real ONNX model (the shipped one, from git), the decision carries attention and feature
    contributions."""
    import subprocess
    from pathlib import Path

    from agmarl_common.serving.onnx_model import OnnxModelPolicy

    root = Path(__file__).resolve().parents[3]
    model_dir = root / "models" / "default"
    if not (model_dir / "manifest.json").exists():  # being retrained in this checkout: use the committed one
        model_dir = Path(subprocess.run(["mktemp", "-d"], capture_output=True, text=True).stdout.strip())
        for f in ("actor.onnx", "encoder.onnx", "manifest.json", "model.pt", "report.md"):
            data = subprocess.run(["git", "-C", str(root), "show", f"HEAD:models/default/{f}"], capture_output=True).stdout
            (model_dir / f).write_bytes(data)
    policy = OnnxModelPolicy.from_dir(model_dir)
    pod = Pod("p", 500, 500)
    policy.observe_workload([pod])
    choice = decide(pod, cluster(), policy, get_policy("kube-resources"), "full", 0.7)
    model = choice.explanation["model"]
    assert model["chosen"] == choice.node
    assert model["attention"] and model["feature_contributions"]


def test_decide_applies_the_policys_admission_outside_shadow_mode():
    """capped:most-allocated: a BE pod would take a (3000/4000) to 87.5 % cpu, so it goes elsewhere; when
    every node that fits is over the cap it is not admitted anywhere and stays pending; in shadow mode the
    cap does not apply."""
    capped, default = get_policy("capped:most-allocated"), get_policy("kube-resources")
    be = Pod("p", 500, 500, qos="BE")
    assert decide(be, cluster(), get_policy("most-allocated"), default, "full", 0.7).node == "a"
    assert decide(be, cluster(), capped, default, "full", 0.7).node in ("b", "c")
    packed = bind(bind(cluster(), Pod("more", 3000, 100), 1), Pod("fill", 600, 100), 2)  # c cannot fit it
    refused = decide(be, packed, capped, default, "full", 0.7)
    assert refused.node == "" and refused.explanation["reason"] == "not admitted by the policy"
    assert "LoadCap" in refused.explanation["admission"] and refused.explanation["candidates"] == 2
    assert decide(be, packed, capped, default, "shadow", 0.7).node != ""
    assert decide(Pod("ls", 500, 500, qos="LS"), packed, capped, default, "full", 0.7).node != ""


def test_best_first_is_the_head_of_a_stable_full_sort():
    rng = np.random.default_rng(4)
    for t in range(3000):
        n, k = int(rng.integers(0, 40)), int(rng.integers(1, 20))
        values = rng.integers(0, 4, n).astype(float) if t % 2 else rng.random(n)  # many ties, or none
        if t % 5 == 0 and n:
            values[rng.integers(0, n, int(rng.integers(1, n + 1)))] = np.nan  # NaNs last, as argsort puts them
        assert best_first(values, k).tolist() == np.argsort(-values, kind="stable")[:k].tolist()
