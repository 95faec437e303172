"""Promotion gate: publish only a better candidate, and say why not otherwise."""

import pytest

from agmarl_trainer.promotion import GateRule, promotion_gate


@pytest.mark.parametrize("candidate,incumbent,promote,why", [
    ({"alloc_at_100": 95.1}, {"alloc_at_100": 94.0}, True, "+1.100"),
    ({"alloc_at_100": 94.0}, {"alloc_at_100": 95.1}, False, "not better"),
    ({"alloc_at_100": 95.0}, {"alloc_at_100": 95.0}, False, "not better"),
    ({"alloc_at_100": 99.0, "hard_violations": 1}, {"alloc_at_100": 90.0}, False, "hard_violations=1"),
    ({"alloc_at_100": 90.0}, None, True, "no evaluated incumbent"),
    ({"reward": 0.9}, {"alloc_at_100": 90.0}, False, "not evaluated"),
])
def test_gate(candidate, incumbent, promote, why):
    result = promotion_gate(candidate, incumbent)
    assert result.promote is promote
    assert why in result.reason


def test_min_gain():
    assert not promotion_gate({"alloc_at_100": 95.05}, {"alloc_at_100": 95.0}, GateRule(min_gain=0.1)).promote
