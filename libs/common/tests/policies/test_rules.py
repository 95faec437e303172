"""Placement rules: ``cpu-first:<policy>`` (a CPU-only pod goes to a node without GPUs whenever one is a
candidate) and ``fgd-shares:<policy>`` (a GPU share goes to one of FGD's best nodes); everything else is the
wrapped policy's."""

from __future__ import annotations

import numpy as np
import pytest

from agmarl_common.core.cluster.filters import feasible_mask
from agmarl_common.core.cluster.model import ClusterState, bind
from agmarl_common.core.policies.fgd import FgdPolicy
from agmarl_common.core.policies.rules import CpuFirstPolicy, FgdSharesPolicy, cpu_nodes_first, put_last
from agmarl_common.core.policies.kube import KubeDefaultPolicy, MostAllocatedPolicy
from agmarl_common.core.policies.registry import get_policy, is_model, model_ref, unwrap, with_model, wrap
from agmarl_common.core.sim.inflation import run_inflation
from agmarl_testing.states import node, pod


def mixed() -> ClusterState:
    """g0 (2 GPUs, busy), c1 (no GPU, idle), g2 (2 GPUs, idle), c3 (no GPU, half busy)."""
    s = ClusterState.empty([node("g0", gpu_count=2, gpu_model="T4"), node("c1"),
                            node("g2", gpu_count=2, gpu_model="T4"), node("c3")])
    return bind(bind(s, pod("x", cpu=3000), 0), pod("y", cpu=2000), 3)


def test_a_cpu_pod_goes_to_a_node_without_gpus_and_each_group_keeps_its_order():
    s, cand = mixed(), np.arange(4)
    inner = MostAllocatedPolicy()
    raw = inner.score(pod("p", cpu=500), s, cand)
    assert int(np.argmax(raw)) == 0  # the wrapped policy alone packs onto the busy GPU node
    out = CpuFirstPolicy(inner).score(pod("p", cpu=500), s, cand)
    assert int(np.argmax(out)) == 3  # the fuller node without GPUs
    gpu, cpu = np.array([0, 2]), np.array([1, 3])
    assert out[cpu].min() > out[gpu].max()
    assert np.argsort(out[cpu]).tolist() == np.argsort(raw[cpu]).tolist()
    assert np.argsort(out[gpu]).tolist() == np.argsort(raw[gpu]).tolist()
    assert np.array_equal(out[cpu], raw[cpu])


@pytest.mark.parametrize("which, cand", [("gpu pod", [0, 1, 2, 3]), ("only gpu nodes", [0, 2]),
                                         ("only cpu nodes", [1, 3])])
def test_scores_are_the_wrapped_policys_otherwise(which, cand):
    s, cand = mixed(), np.array(cand)
    p = pod("g", cpu=500, num_gpu=1, gpu_milli=1000) if which == "gpu pod" else pod("p", cpu=500)
    inner = MostAllocatedPolicy()
    assert np.array_equal(CpuFirstPolicy(inner).score(p, s, cand), inner.score(p, s, cand))


def test_batch_scores_equal_the_pod_by_pod_ones():
    s = mixed()
    pods = [pod("a", cpu=500), pod("b", cpu=500, num_gpu=1, gpu_milli=500), pod("c", cpu=100)]
    cands = [np.arange(4), np.array([0, 2]), np.array([0, 1])]
    wrapped = CpuFirstPolicy(KubeDefaultPolicy())
    batch = wrapped.score_batch(pods, s, cands)
    for p, c, b in zip(pods, cands, batch):
        assert np.array_equal(b, wrapped.score(p, s, c))
    assert int(np.argmax(batch[2])) == 1


def test_the_registry_resolves_the_prefixes_and_rules_compose():
    p = get_policy("cpu-first:fgd-pack")
    assert isinstance(p, CpuFirstPolicy) and p.name == "cpu-first:fgd-pack"
    assert callable(p.observe_workload)  # delegated
    both = get_policy("fgd-shares:cpu-first:fgd-pack")
    assert isinstance(both, FgdSharesPolicy) and isinstance(both.policy, CpuFirstPolicy)
    assert both.name == "fgd-shares:cpu-first:fgd-pack"
    for bad in ("cpu-first:", "cpu-first:cpu-first:fgd", "fgd-shares:", "fgd-shares:nope"):
        with pytest.raises(KeyError):
            get_policy(bad)


def test_a_name_that_wraps_a_model_is_a_model_selection_and_a_promotion_keeps_the_wrappers():
    assert unwrap("fgd-shares:cpu-first:model:v1") == ("fgd-shares:cpu-first:", "model:v1")
    assert unwrap("fgd") == ("", "fgd") and unwrap("capped:reward-aware") == ("capped:", "reward-aware")
    assert is_model("model:v1") and is_model("cpu-first:model:v1") and is_model("capped:model:default")
    assert not is_model("cpu-first:fgd-pack") and not is_model("kube-default")
    assert model_ref("cpu-first:model:v1") == "v1"
    with pytest.raises(ValueError):
        model_ref("cpu-first:fgd")
    assert with_model("cpu-first:model:default", "v2") == "cpu-first:model:v2"
    assert with_model("model:default", "v2") == "model:v2"
    assert with_model("cpu-first:fgd", "v2") == "model:v2"  # a baseline's wrappers are not the model's
    p = wrap("fgd-shares:cpu-first:", get_policy("fgd-pack"))
    assert isinstance(p, FgdSharesPolicy) and isinstance(p.policy, CpuFirstPolicy)
    assert p.name == "fgd-shares:cpu-first:fgd-pack"
    for bad in ("cpu-first:cpu-first:", "nope:", "cpu-first:fgd"):
        with pytest.raises(KeyError):
            wrap(bad, get_policy("fgd-pack"))


def test_no_candidate_is_dropped_or_added():
    s = mixed()
    out = cpu_nodes_first(pod("p"), s, np.arange(4), np.array([4.0, 1.0, 3.0, 2.0]))
    assert out.shape == (4,) and np.isfinite(out).all()
    assert out.tolist() == [4.0 - 3.0 - 1.0, 1.0, 3.0 - 3.0 - 1.0, 2.0]
    assert put_last(np.array([1.0, 2.0]), np.array([True, True])).tolist() == [1.0, 2.0]


def share_cluster() -> ClusterState:
    """Four 2-GPU nodes; g1 has 300 milli free on device 0 after a 700 share, g2 one whole GPU taken."""
    s = ClusterState.empty([node(f"g{k}", cpu=16000, gpu_count=2, gpu_model="T4") for k in range(4)])
    s = bind(s, pod("a", cpu=100, num_gpu=1, gpu_milli=700), 1, (0,))
    return bind(s, pod("b", cpu=100, num_gpu=1, gpu_milli=1000), 2, (0,))


def test_a_share_goes_to_one_of_fgds_best_nodes_and_the_wrapped_policy_picks_among_them():
    s, cand = share_cluster(), np.arange(4)
    workload = [pod("t1", cpu=100, num_gpu=1, gpu_milli=300), pod("t2", cpu=100, num_gpu=1, gpu_milli=1000)]
    fgd = FgdPolicy()
    fgd.observe_workload(workload)
    share = pod("s", cpu=100, num_gpu=1, gpu_milli=300)
    f = fgd.score(share, s, cand)
    best = set(np.flatnonzero(f == f.max()).tolist())
    assert best and best != {0, 1, 2, 3}  # FGD separates the nodes here
    inner = MostAllocatedPolicy()  # packs: prefers the busiest nodes
    wrapped = FgdSharesPolicy(inner)
    wrapped.observe_workload(workload)
    out = wrapped.score(share, s, cand)
    raw = inner.score(share, s, cand)
    chosen = int(np.argmax(out))
    assert chosen in best
    assert chosen == max(best, key=lambda k: raw[k])  # the wrapped policy's choice among FGD's best
    others = sorted(set(range(4)) - best)
    assert out[sorted(best)].min() > out[others].max()
    whole = pod("w", cpu=100, num_gpu=1, gpu_milli=1000)  # not a share: unchanged
    assert np.array_equal(wrapped.score(whole, s, cand), inner.score(whole, s, cand))


def test_fgd_shares_measures_fragmentation_against_the_wrapped_policys_target():
    class WithTarget(MostAllocatedPolicy):
        def __init__(self, target):
            super().__init__()
            self.target = target

        def target_workload(self):
            return self.target

    reference = FgdPolicy()
    reference.observe_workload([pod("t", cpu=100, num_gpu=1, gpu_milli=300)])
    wrapped = FgdSharesPolicy(WithTarget(reference.target))  # never told the workload itself
    s, cand = share_cluster(), np.arange(4)
    share = pod("s", cpu=100, num_gpu=1, gpu_milli=300)
    out = wrapped.score(share, s, cand)
    f = reference.score(share, s, cand)
    assert int(np.argmax(out)) in set(np.flatnonzero(f == f.max()).tolist())
    assert wrapped.fgd.target is reference.target


def test_in_an_inflation_run_cpu_pods_use_gpu_nodes_only_when_no_cpu_node_fits():
    nodes = [node(f"g{k}", cpu=8000, mem=1 << 16, gpu_count=2, gpu_model="T4") for k in range(4)]
    nodes += [node(f"c{k}", cpu=4000, mem=1 << 16) for k in range(2)]
    workload = [pod("cpu", cpu=1500, mem=64), pod("gpu", cpu=1000, mem=64, num_gpu=1, gpu_milli=500)]
    policy = get_policy("cpu-first:fgd-pack")
    r = run_inflation(nodes, workload, policy, np.random.default_rng(3))
    state = ClusterState.empty(nodes)
    checked = 0
    for p, i in zip(r.pods, r.node_index.tolist()):
        if i < 0:
            continue
        if p.num_gpu == 0:
            fits_cpu_node = feasible_mask(p, state)[4:].any()
            assert (nodes[i].gpu_count == 0) == bool(fits_cpu_node), (p.key, nodes[i].name)
            checked += 1
        state = bind(state, p, i, tuple(policy.choose_gpus(p, state, i)))
    assert checked >= 4


def test_the_learned_policy_lends_fgd_its_target_workload():
    p = get_policy("fgd-shares:model:default")  # never told the workload: the model's implicit target
    p.set_objective("allocation")
    s, cand = share_cluster(), np.arange(4)
    share = pod("s", cpu=100, num_gpu=1, gpu_milli=300)
    out = p.score(share, s, cand)
    assert p.policy.target_workload() is not None and p.fgd.target is p.policy.target_workload()
    f = p.fgd.score(share, s, cand)
    assert int(np.argmax(out)) in set(np.flatnonzero(f == f.max()).tolist())
    assert p.choose_gpus(share, s, int(np.argmax(out))) is not None


def test_the_explanation_says_which_rules_reordered_the_candidates():
    p = get_policy("fgd-shares:cpu-first:model:default")
    p.set_objective("allocation")
    s, cand = mixed(), np.arange(4)
    cpu_pod = pod("p", cpu=500)
    p.score(cpu_pod, s, cand)
    rules = p.explain(cpu_pod, s, cand, top=2)["rules"]
    assert [r["rule"] for r in rules] == ["cpu-first", "fgd-shares"]
    assert rules[0]["applied"] and "2 candidates without GPUs first" in rules[0]["why"]
    assert not rules[1]["applied"] and rules[1]["why"] == ""
    gpu_only = np.array([0, 2])
    assert not p.explain(cpu_pod, s, gpu_only, top=2)["rules"][0]["applied"]


def test_a_rule_in_force_makes_scores_non_local_whatever_the_wrapped_policy_says():
    assert MostAllocatedPolicy.local_scores and not CpuFirstPolicy(MostAllocatedPolicy()).local_scores


def test_the_rules_serve_the_allocation_objective_only():
    # under composite the wrapped model's scores, batch scores and score locality stand, and the explanation
    # says the rule is not in force; told allocation, the rule reorders; a heuristic never told one: in force
    s, cand = mixed(), np.arange(4)
    cpu_pod = pod("p", cpu=500)
    model = get_policy("model:default")
    p = get_policy("cpu-first:model:default")
    for told in (model, p):
        told.set_objective("composite")
    assert p.policy.objective == p.objective == "composite" and not p.in_force()
    np.testing.assert_array_equal(p.score(cpu_pod, s, cand), model.score(cpu_pod, s, cand))
    np.testing.assert_array_equal(p.score_batch([cpu_pod], s, [cand])[0], model.score_batch([cpu_pod], s, [cand])[0])
    [rule] = p.explain(cpu_pod, s, cand, top=2)["rules"]
    assert not rule["applied"] and "not in force under the composite objective" in rule["why"]
    assert not CpuFirstPolicy(MostAllocatedPolicy()).local_scores  # in force: not local
    untold = CpuFirstPolicy(MostAllocatedPolicy())
    untold.set_objective("composite")
    assert untold.local_scores  # not in force: the wrapped policy's locality
    p.set_objective("allocation")
    assert p.policy.objective == "allocation" and p.in_force()
    out = p.score(cpu_pod, s, cand)
    assert set(np.argsort(-out)[:2].tolist()) == set(np.flatnonzero(s.gpu_count[cand] == 0).tolist())
    assert CpuFirstPolicy(KubeDefaultPolicy()).in_force()
