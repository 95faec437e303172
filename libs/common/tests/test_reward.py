"""Reward components on tiny literal clusters."""

import pytest

from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind
from agmarl_common.core.reward import (Outcomes, balance_std, reward_components, score_balance, score_utilisation,
                                  total_reward, utilisation_by_resource)


def two_nodes() -> ClusterState:
    return ClusterState.empty([Node("a", 1000, 1000), Node("b", 1000, 1000)])


@pytest.mark.parametrize("util,expected", [(0.0, 0.0), (0.4, 0.5), (0.8, 1.0), (0.9, 0.75), (1.0, 0.5)])
def test_score_utilisation_peaks_at_knee(util, expected):
    assert score_utilisation(util) == pytest.approx(expected)


@pytest.mark.parametrize("std,expected", [(0.0, 1.0), (0.25, 0.5), (0.5, 0.0), (0.7, 0.0)])
def test_score_balance(std, expected):
    assert score_balance(std) == pytest.approx(expected)


def test_utilisation_and_balance_from_state():
    s = bind(two_nodes(), Pod("p", 500, 500), 0)
    assert utilisation_by_resource(s)["cpu"] == pytest.approx(0.25)
    # node a at 0.5, node b at 0 -> std 0.25
    assert balance_std(s) == pytest.approx(0.25)


def test_components_in_unit_interval_and_violation_zeroes_constraints():
    s = bind(two_nodes(), Pod("p", 500, 500), 0)
    ok = reward_components(s, Outcomes(pending=1, scheduled=3, failed=0, violations=0))
    bad = reward_components(s, Outcomes(pending=1, scheduled=3, failed=0, violations=2))
    assert all(0.0 <= v <= 1.0 for v in ok.values())
    assert ok["pending"] == pytest.approx(0.75)
    assert ok["constraints"] == 1.0 and bad["constraints"] == 0.0
    assert total_reward(bad) < total_reward(ok)
