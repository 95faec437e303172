"""SLA and business components, and the three weighting schemes, on tiny literal clusters."""

import pytest

from agmarl_common.core.cluster.model import ZONE_LABEL, ClusterState, Node, Pod, bind
from agmarl_common.core.reward import (IO_HEAVY_LABEL, LOCAL_SSD_LABEL, NETWORK_HEAVY_LABEL, Outcomes, RewardScheme,
                                  RewardWeights, business_terms, lexicographic_total, outcomes_from_stats,
                                  reward_components, scheme_total, scheme_weights, score_constraints,
                                  score_ls_placement, score_wait)


def nodes() -> list[Node]:
    return [Node("ssd-a", 1000, 1000, labels={LOCAL_SSD_LABEL: "true", ZONE_LABEL: "a"}),
            Node("hdd-a", 1000, 1000, labels={ZONE_LABEL: "a"}),
            Node("hdd-b", 1000, 1000, labels={ZONE_LABEL: "b"})]


def place(*placements: tuple[Pod, int]) -> ClusterState:
    s = ClusterState.empty(nodes())
    for pod, i in placements:
        s = bind(s, pod, i)
    return s


IO = {IO_HEAVY_LABEL: "true"}
NET = {NETWORK_HEAVY_LABEL: "true"}


@pytest.mark.parametrize("wait_s,expected", [(0.0, 1.0), (30.0, 0.5), (90.0, 0.25), (-5.0, 1.0)])
def test_score_wait(wait_s, expected):
    assert score_wait(wait_s) == pytest.approx(expected)


@pytest.mark.parametrize("violations,n_bound,expected", [(0, 0, 1.0), (0, 5, 1.0), (1, 4, 0.75), (9, 3, 0.0)])
def test_score_constraints(violations, n_bound, expected):
    assert score_constraints(violations, n_bound) == pytest.approx(expected)


@pytest.mark.parametrize("placements,expected", [
    ((), 1.0),                                                             # no LS pod
    (((Pod("ls", 100, 10, qos="LS"), 0),), 1.0),                           # LS on a cool node
    (((Pod("ls", 100, 10, qos="LS"), 0), (Pod("be", 850, 10, qos="BE"), 0)), 0.0),  # LS on a hot node (95 %)
    (((Pod("ls1", 100, 10, qos="LS"), 0), (Pod("be", 850, 10), 0), (Pod("ls2", 100, 10, qos="LS"), 1)), 0.5),
])
def test_ls_placement(placements, expected):
    assert score_ls_placement(place(*placements)) == pytest.approx(expected)


@pytest.mark.parametrize("placements,io,net", [
    ((), 1.0, 1.0),
    (((Pod("x", 10, 10, labels=IO), 0),), 1.0, 1.0),                        # IO-heavy on SSD
    (((Pod("x", 10, 10, labels=IO), 0), (Pod("y", 10, 10, labels=IO), 2)), 0.5, 1.0),
    # network-heavy pod of service s with two peers: one in its zone, one not -> 0.5 for it;
    # the peers are not network-heavy, so they are not judged
    (((Pod("n", 10, 10, labels=NET, service="s"), 0), (Pod("p1", 10, 10, service="s"), 1),
      (Pod("p2", 10, 10, service="s"), 2)), 1.0, 0.5),
    # a lone network-heavy pod has no peer: not judged
    (((Pod("n", 10, 10, labels=NET, service="s"), 2),), 1.0, 1.0),
    # peers in another namespace are not peers
    (((Pod("n", 10, 10, labels=NET, service="s"), 0), (Pod("p", 10, 10, service="s", namespace="x"), 2)), 1.0, 1.0),
])
def test_business_terms(placements, io, net):
    got = business_terms(place(*placements))
    assert got == pytest.approx({"io_locality": io, "net_locality": net})


def test_components_are_in_unit_interval_and_sla_averages_its_terms():
    s = place((Pod("ls", 100, 10, qos="LS"), 0), (Pod("be", 850, 10), 0))
    c = reward_components(s, Outcomes(pending=1, scheduled=2, failed=1, violations=0, pending_time_s=30.0))
    assert all(0.0 <= v <= 1.0 for v in c.values())
    assert c["sla"] == pytest.approx((0.75 + 0.75 + 0.5 + 0.0) / 4)
    assert {"utilisation", "balance", "sla", "constraints", "business"} <= set(c)


def comps(**over) -> dict[str, float]:
    base = {"utilisation": 0.5, "balance": 0.5, "sla": 0.5, "constraints": 1.0, "business": 0.5}
    base.update(over)
    return base


@pytest.mark.parametrize("load,field_up", [(0.3, "balance"), (0.59, "balance"), (0.6, "utilisation"),
                                           (0.9, "utilisation")])
def test_load_conditional_weights_balance_below_threshold_and_utilisation_above(load, field_up):
    w = scheme_weights(RewardScheme("load_conditional"), load)
    other = "utilisation" if field_up == "balance" else "balance"
    assert getattr(w, field_up) > getattr(w, other)


@pytest.mark.parametrize("load,better", [(0.3, comps(balance=0.9, utilisation=0.1)),
                                         (0.9, comps(balance=0.1, utilisation=0.9))])
def test_load_conditional_prefers_the_right_component(load, better):
    scheme = RewardScheme("load_conditional")
    worse = comps(balance=better["utilisation"], utilisation=better["balance"])
    assert scheme_total(better, scheme, load) > scheme_total(worse, scheme, load)


def test_fixed_scheme_ignores_load():
    scheme = RewardScheme("fixed", weights=RewardWeights())
    c = comps(balance=0.9)
    assert scheme_total(c, scheme, 0.1) == scheme_total(c, scheme, 0.95)


@pytest.mark.parametrize("scores,expected", [([0.0, 0.0], 0.0), ([1.0, 1.0], 1.0), ([1.0], 1.0), ([], 0.0)])
def test_lexicographic_total_bounds(scores, expected):
    assert lexicographic_total(scores, base=10) == pytest.approx(expected)


@pytest.mark.parametrize("high,low", [
    # one level more of a higher tier beats the best of every tier below
    ([0.5, 0.0, 0.0], [0.45, 1.0, 1.0]),
    ([1.0, 0.2, 0.0], [1.0, 0.1, 1.0]),
    ([1.0, 1.0, 0.6], [1.0, 1.0, 0.5]),
])
def test_lexicographic_order_dominates(high, low):
    assert lexicographic_total(high) > lexicographic_total(low)


@pytest.mark.parametrize("load,sla_dominates", [(0.9, True), (0.3, False)])
def test_lexicographic_is_stress_aware(load, sla_dominates):
    scheme = RewardScheme("lexicographic", stress_sla=0.0)  # stress from load only
    good_sla = comps(sla=0.8, utilisation=0.0, balance=0.0, business=0.0)
    good_rest = comps(sla=0.7, utilisation=1.0, balance=1.0, business=1.0)
    assert (scheme_total(good_sla, scheme, load) > scheme_total(good_rest, scheme, load)) == sla_dominates


def test_lexicographic_constraints_come_first():
    scheme = RewardScheme("lexicographic")
    ok = comps(constraints=1.0, sla=0.0, utilisation=0.0, balance=0.0, business=0.0)
    bad = comps(constraints=0.9, sla=1.0, utilisation=1.0, balance=1.0, business=1.0)
    for load in (0.2, 0.9):
        assert scheme_total(ok, scheme, load) > scheme_total(bad, scheme, load)


def test_unknown_scheme_is_rejected():
    with pytest.raises(ValueError, match="unknown reward scheme"):
        RewardScheme("greedy")


def test_outcomes_from_stats_uses_window_deltas():
    before = {"bound": 10, "failed": 1, "unschedulable": 0, "bind_rejected": 2}
    after = {"bound": 15, "failed": 2, "unschedulable": 1, "bind_rejected": 2, "pending": 4, "violations": 0}
    assert outcomes_from_stats(before, after, 12.0) == Outcomes(pending=4, scheduled=5, failed=2, violations=0,
                                                                pending_time_s=12.0)
