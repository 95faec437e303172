"""The paired 95 % interval the benchmarks print and the promotion gate decides on."""

import math

import pytest

from agmarl_common.core.stats import interval, t975


def test_interval_matches_the_t_formula():
    mean, low, high = interval([1.0, 1.0, 2.0, 2.0])
    half = 3.182 * math.sqrt(1 / 3) / 2  # t(3) * sd / sqrt(n)
    assert mean == 1.5 and low == pytest.approx(1.5 - half) and high == pytest.approx(1.5 + half)


def test_a_mixed_sign_sample_has_an_interval_across_zero():
    mean, low, high = interval([0.3, -0.2, 0.25, -0.1, 0.05])
    assert mean > 0 and low < 0 < high


def test_one_difference_has_no_interval_and_none_is_an_error():
    mean, low, high = interval([0.4])
    assert mean == 0.4 and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError):
        interval([])


def test_t975_is_conservative_between_table_entries_and_normal_for_large_samples():
    assert t975(11) == t975(10) == 2.228 and t975(500) == 1.96
    with pytest.raises(ValueError):
        t975(0)
