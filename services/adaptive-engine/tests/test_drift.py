"""Page-Hinkley detects a drop in reward and stays quiet on a stationary stream."""

import numpy as np

from agmarl_adaptive_engine.drift import PageHinkley, ph_update


def run(stream):
    ph, alarms = PageHinkley(threshold=1.0, min_samples=20), []
    for i, x in enumerate(stream):
        ph, drift = ph_update(ph, float(x))
        if drift:
            alarms.append(i)
    return alarms


def test_stationary_stream_has_no_alarm():
    rng = np.random.default_rng(0)
    assert run(0.8 + 0.01 * rng.standard_normal(500)) == []


def test_drop_in_reward_is_detected_soon_after_the_change():
    rng = np.random.default_rng(1)
    stream = np.concatenate([0.8 + 0.01 * rng.standard_normal(200), 0.5 + 0.01 * rng.standard_normal(200)])
    alarms = run(stream)
    assert alarms and 200 <= alarms[0] < 220


def test_rise_in_reward_is_not_an_alarm():
    stream = np.concatenate([np.full(200, 0.5), np.full(200, 0.9)])
    assert run(stream) == []


def test_shipped_model_stands_in_for_configured_regimes_only_when_it_loads():
    from agmarl_adaptive_engine.app import expert_map
    from agmarl_adaptive_engine.settings import AdaptiveSettings

    s = AdaptiveSettings()
    with_model = expert_map(s, known=lambda name: True)
    without = expert_map(s, known=lambda name: False)
    assert with_model["low_load"] == with_model["batch"] == "cpu-first:model:default"
    assert with_model["affinity"] == without["affinity"] == s.experts["affinity"]
    assert without == dict(s.experts)
