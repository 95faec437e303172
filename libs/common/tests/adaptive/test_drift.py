"""Drift detectors and hysteresis on synthetic streams."""

import numpy as np
import pytest

from agmarl_common.core.adaptive.drift import (Adwin, Hysteresis, PageHinkley, adwin_update, ewma, hysteresis_update, kl,
                                          ph_update, psi)


def ph_alarms(stream, **kw):
    ph, out = PageHinkley(**kw), []
    for i, x in enumerate(stream):
        ph, drift = ph_update(ph, float(x))
        if drift:
            out.append(i)
    return out


def adwin_changes(stream, **kw):
    ad, out = Adwin(**kw), []
    for i, x in enumerate(stream):
        ad, change = adwin_update(ad, float(x))
        if change is not None:
            out.append((i, change))
    return out


def noisy(level, n, seed, std=0.02):
    return level + std * np.random.default_rng(seed).standard_normal(n)


def test_page_hinkley_flags_a_drop_and_not_noise():
    assert ph_alarms(noisy(0.8, 500, 0), threshold=1.0, min_samples=20) == []
    alarms = ph_alarms(np.concatenate([noisy(0.8, 200, 1), noisy(0.5, 200, 2)]), threshold=1.0, min_samples=20)
    assert alarms and 200 <= alarms[0] < 215
    assert PageHinkley(threshold=1.0).statistic == 0.0


def test_adwin_is_quiet_on_a_stationary_stream():
    assert adwin_changes(noisy(0.7, 600, 3)) == []


@pytest.mark.parametrize("after,drop", [(0.4, True), (0.95, False)])
def test_adwin_finds_a_change_and_its_direction(after, drop):
    changes = adwin_changes(np.concatenate([noisy(0.7, 150, 4), noisy(after, 150, 5)]))
    assert changes
    i, change = changes[0]
    assert 150 <= i < 250  # detection delay shrinks as the new sub-window grows
    assert change.drop is drop
    assert change.old_mean == pytest.approx(0.7, abs=0.1)


def test_adwin_window_is_bounded():
    ad = Adwin(max_window=32)
    for x in noisy(0.5, 100, 6):
        ad, _ = adwin_update(ad, float(x))
    assert len(ad.window) <= 32


@pytest.mark.parametrize("p,q,low,high", [
    ([0.5, 0.5], [0.5, 0.5], 0.0, 1e-9),
    ([0.5, 0.5], [0.45, 0.55], 0.0, 0.05),     # small move: stable
    ([0.9, 0.1], [0.1, 0.9], 1.0, 10.0),       # big shift
    ([1.0, 0.0], [0.0, 1.0], 5.0, 100.0),      # empty cells stay finite
])
def test_psi(p, q, low, high):
    assert low <= psi(p, q) <= high


def test_kl_is_asymmetric_and_zero_on_equal():
    assert kl([0.2, 0.8], [0.2, 0.8]) == pytest.approx(0.0, abs=1e-12)
    assert kl([0.5, 0.5], [0.9, 0.1]) != pytest.approx(kl([0.9, 0.1], [0.5, 0.5]))


def test_ewma():
    assert ewma(None, [1.0, 0.0], 0.5) == (1.0, 0.0)
    assert ewma((1.0, 0.0), [0.0, 1.0], 0.25) == pytest.approx((0.75, 0.25))


def run_hysteresis(h, values, dt=1.0):
    states = []
    for k, v in enumerate(values):
        h, _ = hysteresis_update(h, v, k * dt)
        states.append(h.active)
    return states


def test_hysteresis_enter_and_exit_thresholds():
    h = Hysteresis(enter=0.5, exit=0.3)
    assert run_hysteresis(h, [0.4, 0.5, 0.4, 0.35, 0.3, 0.45, 0.6]) == [False, True, True, True, False, False, True]


def test_hysteresis_does_not_flap_around_one_threshold():
    # a value oscillating around 0.5 turns the switch on once and never off (exit is 0.3)
    values = [0.49, 0.51] * 20
    assert sum(a != b for a, b in zip(run_hysteresis(Hysteresis(0.5, 0.3), values)[:-1],
                                      run_hysteresis(Hysteresis(0.5, 0.3), values)[1:])) == 1


def test_hysteresis_minimum_dwell():
    h = Hysteresis(enter=0.5, exit=0.3, min_dwell_s=5.0)
    # on at t=0, the drop at t=1..4 is ignored, it turns off at t=5
    assert run_hysteresis(h, [0.9, 0.1, 0.1, 0.1, 0.1, 0.1]) == [True, True, True, True, True, False]


def test_hysteresis_rejects_exit_above_enter():
    with pytest.raises(ValueError):
        Hysteresis(enter=0.3, exit=0.5)
