"""Reward-aware expert: each gain is the reward's own change, and the choices it leads to, on tiny clusters."""

from __future__ import annotations

import numpy as np
import pytest

from agmarl_common.core.cluster.model import (
    ZONE_LABEL,
    ClusterState,
    LabelRequirement,
    LabelSelector,
    Node,
    NodeSelectorTerm,
    Pod,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    WeightedPodAffinityTerm,
    bind,
)
from agmarl_common.core.policies.base import Policy, select_node
from agmarl_common.core.policies.registry import get_policy, policy_names
from agmarl_common.core.policies.rewardaware import RewardAwarePolicy
from agmarl_common.core.scoring.rewardaware import (
    RewardAwareConfig,
    gain_weights,
    overload_loss,
    reward_gains,
    scheme_gain_weights,
    score_balance_gain,
    score_io_gain,
    score_ls_gain,
    score_net_gain,
    score_utilisation_gain,
)
from agmarl_common.core.reward import (
    IO_HEAVY_LABEL,
    LOCAL_SSD_LABEL,
    NETWORK_HEAVY_LABEL,
    RewardScheme,
    RewardWeights,
    balance_std,
    business_terms,
    score_balance,
    score_ls_placement,
    score_utilisation,
)

CAP = 10000
SSD = {LOCAL_SSD_LABEL: "true"}
IO = {IO_HEAVY_LABEL: "true"}
NET = {NETWORK_HEAVY_LABEL: "true"}


def pod(name="p", cpu=1000, mem=1000, **kw) -> Pod:
    return Pod(name=name, cpu_milli=cpu, memory_mib=mem, **kw)


def cluster(loads: list[tuple[int, int]], ls: list[int] | None = None,
            labels: list[dict] | None = None) -> ClusterState:
    """Nodes of CAP milli / CAP MiB; node k holds one BE pod of ``loads[k]`` (cpu, mem) and ``ls[k]``
    LS pods of 1 milli / 1 MiB."""
    labels = labels or [{} for _ in loads]
    s = ClusterState.empty([Node(f"n{k}", CAP, CAP, labels=labels[k]) for k in range(len(loads))])
    for k, (c, m) in enumerate(loads):
        if c or m:
            s = bind(s, pod(f"be{k}", cpu=c, mem=m, qos="BE"), k)
        for j in range((ls or [0] * len(loads))[k]):
            s = bind(s, pod(f"ls{k}-{j}", cpu=1, mem=1, qos="LS"), k)
    return s


def all_of(s: ClusterState) -> np.ndarray:
    return np.arange(s.n_nodes)


# --- each gain is the reward component's own change --------------------------------------------------

@pytest.mark.parametrize("loads", [
    [(5000, 5000), (1000, 1000), (3000, 3000)],
    [(9000, 1000), (2000, 6000), (0, 0), (4000, 4000)],
    [(0, 0), (0, 0)],
])
@pytest.mark.parametrize("p", [pod(), pod(cpu=4000, mem=500), pod(cpu=0, mem=3000)])
def test_balance_gain_is_the_change_of_the_balance_component(loads, p):
    s = cluster(loads)
    got = score_balance_gain(p, s, all_of(s))
    before = score_balance(balance_std(s))
    want = [score_balance(balance_std(bind(s, p, i))) - before for i in range(s.n_nodes)]
    np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("loads, ls, p", [
    ([(7500, 0), (7000, 7000)], [2, 0], pod(qos="BE")),  # n0 crosses 80 % with 2 LS pods on it
    ([(7500, 0), (7000, 7000)], [2, 1], pod(qos="LS")),  # an LS pod counts itself too
    ([(8500, 0), (1000, 1000)], [3, 1], pod(qos="LS")),  # n0 already hot: only the new LS pod turns bad
    ([(1000, 0), (2000, 0)], [1, 1], pod(qos="BE")),  # nobody crosses
])
def test_ls_gain_is_the_change_of_ls_ok(loads, ls, p):
    s = cluster(loads, ls)
    got = score_ls_gain(p, s, all_of(s))
    before = score_ls_placement(s)
    want = [score_ls_placement(bind(s, p, i)) - before for i in range(s.n_nodes)]
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_io_gain_ranks_like_io_locality():
    s = cluster([(0, 0), (0, 0)], labels=[{}, SSD])
    s = bind(s, pod("old", labels=IO), 0)  # one IO-heavy pod already off SSD
    p = pod(labels=IO)
    got = score_io_gain(p, s, all_of(s))
    after = [business_terms(bind(s, p, i))["io_locality"] for i in range(2)]
    assert got[1] - got[0] == pytest.approx(after[1] - after[0])
    assert score_io_gain(pod(), s, all_of(s)).tolist() == [0.0, 0.0]  # not IO-heavy: indifferent


def net_cluster() -> ClusterState:
    """n0 in zone a, n1 and n2 in zone b; two network-heavy pods of service web on n1."""
    zones = [{ZONE_LABEL: "a"}, {ZONE_LABEL: "b"}, {ZONE_LABEL: "b"}]
    s = cluster([(0, 0)] * 3, labels=zones)
    for k in range(2):
        s = bind(s, pod(f"web{k}", cpu=1, mem=1, service="web", labels={"app": "web", **NET}), 1)
    return s


@pytest.mark.parametrize("p", [pod(service="web", labels={"app": "web", **NET}),
                               pod(service="web", labels={"app": "web"})])  # a plain peer helps the heavy ones
def test_net_gain_ranks_like_net_locality(p):
    s = net_cluster()
    got = score_net_gain(p, s, all_of(s))
    after = [business_terms(bind(s, p, i))["net_locality"] for i in range(3)]
    assert got[1] - got[0] == pytest.approx(after[1] - after[0])
    assert got[2] == got[1] > got[0]
    assert score_net_gain(pod(service="other", labels=NET), s, all_of(s)).tolist() == [0.0] * 3


def test_utilisation_gain_is_the_knee_only():
    assert overload_loss(np.array([0.0, 0.5, 0.8])).tolist() == [0.0, 0.0, 0.0]
    u = np.array([0.9, 1.0])
    np.testing.assert_allclose(u / 0.8 - overload_loss(u), [score_utilisation(0.9), score_utilisation(1.0)])
    s = cluster([(7500, 7500), (8500, 8500)])
    g = score_utilisation_gain(pod(cpu=1000, mem=1000), s, all_of(s))
    assert g[0] < 0 and g[1] < g[0]  # n0 crosses the knee by 0.05, n1 goes 0.1 deeper past it
    assert score_utilisation_gain(pod(), cluster([(0, 0), (1000, 1000)]), np.array([0, 1])).tolist() == [0.0, 0.0]


# --- the choices ----------------------------------------------------------------------------------

SELECTS = [
    # (case, state, pod, expected node)
    ("low load: the emptiest node balances", cluster([(5000, 5000), (1000, 1000), (3000, 3000)]), pod(), 1),
    ("a big pod goes where it evens the nodes out", cluster([(6000, 6000), (2000, 2000)]), pod(cpu=3000, mem=3000), 1),
    # n0 is cpu-hot (85 %) but its mean utilisation is the lowest: balance alone would pick it
    ("an LS pod stays off a hot node", cluster([(8500, 0), (5000, 5000)]), pod(qos="LS"), 1),
    ("a BE pod may use it", cluster([(8500, 0), (5000, 5000)]), pod(qos="BE"), 0),
    # a BE pod that would push n0 (2 LS pods, 75 % cpu) over 80 % goes elsewhere
    ("a BE pod does not make LS pods hot", cluster([(7500, 0), (6000, 6000)], ls=[2, 0]), pod(qos="BE"), 1),
    ("unless no LS pod is there", cluster([(7500, 0), (6000, 6000)]), pod(qos="BE"), 0),
    ("an IO-heavy pod goes to local SSD", cluster([(0, 0), (0, 0)], labels=[{}, SSD]), pod(labels=IO), 1),
    ("a plain pod does not care", cluster([(0, 0), (0, 0)], labels=[{}, SSD]), pod(), 0),
    ("a network-heavy pod joins its peers' zone", net_cluster(), pod(service="web", labels={"app": "web", **NET}), 2),
]


@pytest.mark.parametrize("case, state, p, expected", SELECTS, ids=[c[0] for c in SELECTS])
def test_selects(case, state, p, expected):
    assert select_node(RewardAwarePolicy(), p, state, all_of(state)) == expected


def test_keeps_kube_default_preferences():
    s = cluster([(0, 0), (0, 0)], labels=[{}, {"disk": "fast"}])
    term = NodeSelectorTerm((LabelRequirement("disk", "In", ("fast",)),))
    p = pod(preferred_node_affinity=(PreferredSchedulingTerm(100, term),))
    assert select_node(RewardAwarePolicy(), p, s, all_of(s)) == 1
    # preferred anti-affinity to a pod of app=db on n0's zone
    s = cluster([(0, 0), (0, 0)], labels=[{ZONE_LABEL: "a"}, {ZONE_LABEL: "b"}])
    s = bind(s, pod("db", cpu=0, mem=0, labels={"app": "db"}), 0)
    anti = WeightedPodAffinityTerm(100, PodAffinityTerm(LabelSelector({"app": "db"}), ZONE_LABEL))
    p = pod(preferred_pod_anti_affinity=(anti,))
    assert select_node(RewardAwarePolicy(), p, s, all_of(s)) == 1
    # with the preferences switched off, the even cluster ties -> first candidate
    assert select_node(RewardAwarePolicy(RewardAwareConfig(preference_weight=0)), p, s, all_of(s)) == 0


def test_only_candidates_are_scored():
    s = cluster([(5000, 5000), (1000, 1000), (3000, 3000)])
    policy = RewardAwarePolicy()
    full = policy.score(pod(), s, all_of(s))
    sub = policy.score(pod(), s, np.array([2, 0]))
    assert sub.shape == (2,)
    np.testing.assert_allclose(sub, full[[2, 0]])
    assert select_node(policy, pod(), s, np.array([2, 0])) == 2  # the best node (1) is not a candidate
    assert policy.score(pod(), s, np.array([], dtype=np.int64)).shape == (0,)
    assert select_node(policy, pod(), s, np.array([], dtype=np.int64)) is None


def test_no_ls_pod_anywhere_gives_finite_scores():
    s = cluster([(7900, 0), (0, 0)])
    assert np.isfinite(RewardAwarePolicy().score(pod(qos="BE"), s, all_of(s))).all()
    assert score_ls_gain(pod(qos="BE"), s, all_of(s)).tolist() == [0.0, 0.0]


# --- weights from the reward scheme ---------------------------------------------------------------

def test_gain_weights_follow_the_reward_weights():
    w = gain_weights(RewardWeights())
    assert w == pytest.approx({"balance": 0.2, "utilisation": 0.25, "ls_ok": 0.0625, "io_locality": 0.05,
                               "net_locality": 0.05})
    low = scheme_gain_weights(RewardScheme("load_conditional"), 0.3)
    high = scheme_gain_weights(RewardScheme("load_conditional"), 0.9)
    assert low["balance"] > high["balance"] and low["utilisation"] < high["utilisation"]
    calm = scheme_gain_weights(RewardScheme("lexicographic"), 0.3)
    stressed = scheme_gain_weights(RewardScheme("lexicographic"), 0.9)
    assert stressed["ls_ok"] == pytest.approx(100 * calm["ls_ok"])


def test_scheme_changes_the_choice():
    # n0: cpu 70 %, mean utilisation 50 %, 1 LS pod; the pod would make it hot. n1 is already hot with 20
    # LS pods, n2 is at 80 % without any. Fixed weights: one LS pod of 21 is worth less than balance;
    # lexicographic at a stressful load (>= 0.75): the sla tier comes first
    s = cluster([(7000, 3000), (8000, 9800), (8000, 9800)], ls=[1, 20, 0])
    p = pod(cpu=1500, mem=0, qos="BE")
    gains = reward_gains(p, s, all_of(s))
    assert gains["ls_ok"][0] < 0 and gains["balance"][0] > max(gains["balance"][1:])
    fixed = RewardAwarePolicy(RewardAwareConfig(scheme="fixed", preference_weight=0))
    lexi = RewardAwarePolicy(RewardAwareConfig(scheme="lexicographic", preference_weight=0))
    assert select_node(fixed, p, s, all_of(s)) == 0
    assert select_node(lexi, p, s, all_of(s)) != 0


def test_registry_and_protocol():
    assert {"reward-aware", "reward-aware-load-conditional", "reward-aware-lexicographic"} <= set(policy_names())
    p = get_policy("reward-aware", 3)
    assert isinstance(p, RewardAwarePolicy) and isinstance(p, Policy) and p.name == "reward-aware"
    assert get_policy("reward-aware-lexicographic").config.scheme == "lexicographic"
    with pytest.raises(ValueError):
        RewardAwareConfig(scheme="nope")
    with pytest.raises(ValueError):
        RewardAwareConfig(factors={"nope": 1.0})
    with pytest.raises(ValueError):
        RewardAwareConfig(preference_weight=-1)


def test_factors_reweight_single_gains():
    s = cluster([(0, 0), (0, 0)], labels=[{}, SSD])
    s = bind(s, pod("w", cpu=3000, mem=3000), 1)  # the SSD node is busier: balance says n0, io says n1
    p = pod(labels=IO)
    assert select_node(RewardAwarePolicy(RewardAwareConfig(factors={"io_locality": 0.0})), p, s, all_of(s)) == 0
    assert select_node(RewardAwarePolicy(RewardAwareConfig(factors={"balance": 0.0})), p, s, all_of(s)) == 1
