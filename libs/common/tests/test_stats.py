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


# two-sided 95 % Student t quantiles (t 0.975) to 3 decimals, as in standard tables (checked against the
# regularised incomplete beta function when the table was extended)
KNOWN_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
              2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
              2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


@pytest.mark.parametrize("df", range(1, 31))
def test_t975_is_the_known_quantile_for_1_to_30_degrees_of_freedom(df):
    assert t975(df) == KNOWN_T975[df - 1]


def test_t975_is_conservative_between_table_entries_and_normal_for_large_samples():
    assert t975(35) == t975(30) == 2.042 and t975(45) == t975(39) == 2.023 and t975(500) == 1.96
    with pytest.raises(ValueError):
        t975(0)
