"""Credit per agent: the difference reward of one placement against a reference placement, on tiny clusters."""

import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.credit import DecisionCredit, difference_reward, placement_components
from agmarl_common.core.reward import Outcomes, RewardWeights, reward_components, total_reward


def two_nodes(load_a: int = 500) -> ClusterState:
    s = ClusterState.empty([Node("a", 1000, 1000), Node("b", 1000, 1000)])
    return bind(s, Pod("old", load_a, load_a), 0) if load_a else s


def test_the_reference_placement_earns_nothing():
    s = two_nodes()
    assert difference_reward(s, Pod("p", 200, 200), 1, (), 1, ()) == DecisionCredit(0.0, {})


def test_a_balancing_placement_earns_the_weighted_balance_gain():
    s, pod = two_nodes(), Pod("p", 500, 500)
    credit = difference_reward(s, pod, 1, (), 0, ())
    # on b both nodes sit at 0.5 (std 0, balance 1); on a: 1.0 and 0 (std 0.5, balance 0)
    assert set(credit.components) == {"balance"}
    assert credit.components["balance"] == pytest.approx(1.0)
    w = RewardWeights()
    assert credit.total == pytest.approx(w.balance / sum(w.as_dict().values()))
    # antisymmetric: the reference's view of the same pair
    assert difference_reward(s, pod, 0, (), 1, ()).total == pytest.approx(-credit.total)


def test_it_is_the_composite_reward_of_the_two_clusters():
    s, pod = two_nodes(300), Pod("p", 400, 100, qos="LS")
    mine = total_reward(reward_components(bind(s, pod, 0), Outcomes(scheduled=1)))
    ref = total_reward(reward_components(bind(s, pod, 1), Outcomes(scheduled=1)))
    assert difference_reward(s, pod, 0, (), 1, ()).total == pytest.approx(mine - ref)


def test_an_ls_pod_on_a_hot_node_loses_ls_ok():
    s, pod = two_nodes(700), Pod("web", 200, 100, qos="LS")  # node a goes to 0.9 cpu: over the 0.8 hot line
    credit = difference_reward(s, pod, 0, (), 1, ())
    assert credit.components["ls_ok"] == pytest.approx(-1.0)
    assert credit.total < 0


def test_placing_a_pod_the_reference_leaves_waiting_earns_the_pending_terms():
    s, pod = two_nodes(), Pod("p", 100, 100)
    credit = difference_reward(s, pod, 1, (), None, ())
    assert credit.components["pending"] == pytest.approx(1.0) and credit.total > 0
    assert placement_components(s, pod, None)["pending"] == 0.0  # one pod seen, still waiting
    # and a pick the arbiter refused (left pending) against a reference that placed it: the opposite sign
    assert difference_reward(s, pod, None, (), 1, ()).total == pytest.approx(-credit.total)


def test_gpu_devices_count():
    s = ClusterState.empty([Node("g", 8000, 8000, gpu_count=2), Node("h", 8000, 8000, gpu_count=2)])
    pod = Pod("t", 100, 100, num_gpu=1, gpu_milli=1000)
    same_node = difference_reward(s, pod, 0, (0,), 0, (1,))  # another device of the same node: nothing moves
    assert same_node.total == pytest.approx(0.0) and same_node.components == {}


def test_reference_credit_places_the_pod_where_the_reference_policy_would():
    from agmarl_common.core.credit import reference_credit, reference_placement
    from agmarl_common.core.policies.kube import KubeDefaultPolicy
    from agmarl_common.core.reward import RewardScheme

    s, pod, kube = two_nodes(), Pod("p", 500, 500), KubeDefaultPolicy()
    node, gpus = reference_placement(s, pod, kube)
    assert (node, gpus) == (1, ())  # kube-default spreads: the empty node
    credit, ref = reference_credit(s, pod, 0, (), kube)
    assert ref == 1 and credit == difference_reward(s, pod, 0, (), 1, ())
    assert credit.total < 0  # packing onto the busy node loses the balance kube-default keeps
    assert reference_credit(s, pod, 1, (), kube)[0] == DecisionCredit(0.0, {})  # did what the reference does
    # a pod no node fits: the reference leaves it waiting, so placing it is all gain
    big = Pod("big", 900, 900)
    assert reference_placement(two_nodes(500), big, kube)[0] == 1
    full = bind(two_nodes(500), Pod("other", 600, 600), 1)
    assert reference_placement(full, big, kube) == (None, ())
    # a scheme's total: the same moved components, the scheme's weights
    fixed = reference_credit(s, pod, 0, (), kube, scheme=RewardScheme("fixed"))[0]
    assert fixed.total == pytest.approx(credit.total) and fixed.components == credit.components


def test_reference_devices_come_from_the_policy_or_the_given_chooser():
    from agmarl_common.core.credit import reference_placement
    from agmarl_common.core.policies.kube import KubeDefaultPolicy

    s = ClusterState.empty([Node("g", 8000, 8000, gpu_count=2)])
    pod = Pod("t", 100, 100, num_gpu=1, gpu_milli=1000)
    assert reference_placement(s, pod, KubeDefaultPolicy()) == (0, (0,))
    assert reference_placement(s, pod, KubeDefaultPolicy(), gpus_for=lambda p, st, i: (1,)) == (0, (1,))
    assert reference_placement(s, pod, KubeDefaultPolicy(), gpus_for=lambda p, st, i: None) == (None, ())
