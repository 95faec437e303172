"""The adaptive controller: gate switches, guard rollbacks, holds, exploration and drift alarms."""

import numpy as np

from agmarl_common.core.adaptive.controller import AdaptiveController, ControllerConfig
from agmarl_common.core.adaptive.drift import PageHinkley
from agmarl_common.core.adaptive.explore import ExploreConfig
from agmarl_common.core.adaptive.features import RegimeFeatures
from agmarl_common.core.adaptive.gate import ExpertLibrary, GateConfig
from agmarl_common.core.adaptive.guard import GuardConfig

BASE = {"policy": "kube-resources", "model_version": "", "mode": "full", "reason": "initial", "time": 0.0,
        "previous": ""}
FAST_GATE = GateConfig(min_dwell_s=0.0)


def controller(**kw) -> AdaptiveController:
    cfg = ControllerConfig(gate=FAST_GATE, gate_period_s=10.0, hold_s=100.0, quarantine_s=1000.0,
                           guard=GuardConfig(window=10, min_samples=5), **kw)
    return AdaptiveController(cfg, BASE, [], now=0.0)


def test_gate_switches_expert_with_the_regime_and_says_why():
    c = controller()
    assert c.tick(0.0, features=RegimeFeatures(load=0.3)) == []  # low load: already kube-resources
    assert c.tick(5.0, features=RegimeFeatures(load=0.9)) == []   # not due before the gate period
    [sw] = c.tick(10.0, features=RegimeFeatures(load=0.9))
    assert (sw.kind, sw.selection["policy"], sw.selection["previous"]) == ("gate", "most-allocated", "kube-resources")
    assert sw.selection["reason"].startswith("gate: regime batch") and sw.evidence["regime"] == "batch"
    [sw] = c.tick(20.0, features=RegimeFeatures(load=0.5, affinity_share=0.6))
    assert sw.selection["policy"] == "kube-default"
    assert [e["policy"] for e in c.history] == ["kube-resources", "most-allocated", "kube-default"]


def test_guard_rolls_back_a_collapsing_selection_and_quarantines_it():
    c = controller()
    c.tick(0.0, features=RegimeFeatures(load=0.9))
    assert c.active["policy"] == "most-allocated"
    for k in range(5):
        c.on_reward(0.05, 1.0 + k)
    [sw] = c.tick(6.0)
    assert sw.kind == "rollback" and sw.selection["policy"] == "kube-resources"
    assert sw.selection["reason"].startswith("rollback: reward mean")
    assert sw.evidence["rolled_back"] == "most-allocated"
    # the gate still sees a busy cluster, but the failed expert is quarantined and the rollback held
    assert c.tick(200.0, features=RegimeFeatures(load=0.9)) == []
    assert c.active["policy"] == "kube-resources"


def test_guard_on_scheduling_success_rate():
    c = controller()
    c.tick(0.0, features=RegimeFeatures(load=0.9))
    c.on_stats({"bound": 0, "bind_rejected": 0})
    c.on_stats({"bound": 10, "bind_rejected": 15})
    [sw] = c.tick(1.0)
    assert sw.kind == "rollback" and "scheduling success" in sw.selection["reason"]


def test_no_rollback_loop_when_there_is_nothing_to_go_back_to():
    c = controller()
    for k in range(5):
        c.on_reward(0.05, float(k))
    assert c.tick(6.0) == []
    assert c.rewards == []  # judged afresh


def test_external_selection_is_judged_on_its_own_rewards_and_held_from_the_gate():
    c = controller()
    for k in range(10):
        c.on_reward(0.8, float(k))
    manual = dict(BASE, policy="rtcr", reason="manual: try it", previous="kube-resources")
    c.adopt(manual, [], now=10.0)
    assert c.rewards == [] and abs(c.reference - 0.8) < 1e-9
    assert c.tick(20.0, features=RegimeFeatures(load=0.9)) == []  # held
    for k in range(5):
        c.on_reward(0.5, 21.0 + k)  # 0.5 < 0.8 * 0.75: dropped too far
    [sw] = c.tick(30.0)
    assert sw.kind == "rollback" and sw.selection["policy"] == "kube-resources" and "dropped" in sw.selection["reason"]


def test_adopting_a_selection_read_before_its_history_rolls_back_from_that_selection():
    """The CLI writes the selection, then the history (two KV writes): a reader in between sees the new
    selection with the old history; the rollback must still name the adopted selection as the one left
    (a CI run of test_bad_model_rollback once saw ``previous`` = the baseline)."""
    c = controller()
    manual = dict(BASE, policy="model:bad", reason="manual: try it", previous="kube-resources", time=10.0)
    c.adopt(manual, [BASE], now=10.0)  # the history without the selection
    assert [e["policy"] for e in c.history] == ["kube-resources", "model:bad"]
    for k in range(5):
        c.on_reward(0.05, 11.0 + k)
    [sw] = c.tick(20.0)
    assert (sw.kind, sw.selection["policy"], sw.selection["previous"]) == ("rollback", "kube-resources", "model:bad")
    assert sw.evidence["rolled_back"] == "model:bad" and c.quarantine["model:bad"] == 20.0 + 1000.0


def test_exploration_only_in_canary_scope_and_for_one_period():
    off = controller()
    assert off.tick(0.0, u=0.0, features=RegimeFeatures(load=0.3)) == []
    c = controller(explore=ExploreConfig(rate=0.05, canary_namespaces=("team-a",)))
    [sw] = c.tick(0.0, u=0.01, pick=0.0, features=RegimeFeatures(load=0.3))
    assert sw.kind == "explore" and sw.selection["mode"] == "canary" and "team-a" in sw.selection["reason"]
    assert sw.selection["policy"] != "kube-resources"
    [end] = c.tick(10.0, u=0.99, features=RegimeFeatures(load=0.3))
    assert end.kind == "explore_end" and end.selection["policy"] == "kube-resources" and end.selection["mode"] == "full"
    assert c.tick(20.0, u=0.99, features=RegimeFeatures(load=0.3)) == []  # u above the rate: no exploration


def test_reward_drift_alarm_once_with_hysteresis():
    c = controller(ph=PageHinkley(threshold=1.0, min_samples=20), drift_dwell_s=1000.0)
    rng = np.random.default_rng(0)
    stream = np.concatenate([0.8 + 0.01 * rng.standard_normal(200), 0.4 + 0.01 * rng.standard_normal(300)])
    alarms = []
    for k, x in enumerate(stream):
        alarms += c.on_reward(float(x), float(k))
    assert len(alarms) == 1 and alarms[0].detector in ("page_hinkley", "adwin")
    assert 200 <= alarms[0].time < 260 and alarms[0].statistic > 0


def test_mix_shift_raises_a_psi_alarm():
    c = controller(drift_dwell_s=0.0)
    ls = (0, 0, 0, 0, 0, 1, 0, 0)  # cpu-ls-plain
    be = (0, 0, 0, 0, 0, 0, 0, 1)
    alarms = []
    for k in range(100):
        alarms += c.on_features(RegimeFeatures(mix=ls), float(k))
    assert alarms == []
    for k in range(100, 110):
        alarms += c.on_features(RegimeFeatures(mix=be), float(k))
    assert [a.detector for a in alarms] == ["psi"] and alarms[0].statistic >= 0.25


# --- promotion of a published model ------------------------------------------------------------------

MODEL = dict(BASE, policy="model:default", reason="initial selection: the shipped learned model")
MODEL_EXPERTS = {"low_load": "model:default", "batch": "model:default", "affinity": "kube-default"}


def model_controller(active=MODEL, history=(), **kw) -> AdaptiveController:
    lib = ExpertLibrary(experts=MODEL_EXPERTS, baseline="kube-resources")
    cfg = ControllerConfig(library=lib, gate=FAST_GATE, gate_period_s=10.0, hold_s=100.0, quarantine_s=1000.0,
                           guard=GuardConfig(window=10, min_samples=5), **kw)
    return AdaptiveController(cfg, active, list(history), now=0.0)


def test_published_model_supersedes_the_active_model_with_a_promoted_reason():
    c = model_controller()
    for k in range(5):
        c.on_reward(0.8, float(k))
    assert c.on_published("ft-1", "candidate alloc 94.8 > incumbent 94.5", 5.0) == ""
    [sw] = c.tick(5.5)
    assert (sw.kind, sw.selection["policy"], sw.selection["previous"]) == ("promote", "model:ft-1", "model:default")
    assert sw.selection["reason"] == ("promoted: model ft-1 published by the trainer "
                                      "(candidate alloc 94.8 > incumbent 94.5)")
    assert [e["policy"] for e in c.history] == ["model:default", "model:ft-1"]
    assert c.rewards == [] and abs(c.reference - 0.8) < 1e-9  # judged fresh, against the old model's mean
    assert c.library.experts["low_load"] == "model:ft-1" and c.library.experts["affinity"] == "kube-default"
    assert c.last_published == {"version": "ft-1", "outcome": "promoted"}
    # the gate does not drag it back to the superseded model
    assert c.tick(20.0, features=RegimeFeatures(load=0.3)) == [] and c.active["policy"] == "model:ft-1"


def test_rollback_of_a_promoted_model_returns_to_the_previous_model_and_its_experts():
    c = model_controller()
    c.on_published("ft-1", "", 1.0)
    [sw] = c.tick(1.0)
    assert sw.selection["reason"] == "promoted: model ft-1 published by the trainer"
    for k in range(5):
        c.on_reward(0.05, 2.0 + k)
    [rb] = c.tick(8.0)
    assert (rb.kind, rb.selection["policy"], rb.selection["previous"]) == ("rollback", "model:default", "model:ft-1")
    assert [e["policy"] for e in c.history] == ["model:default"]
    assert c.library.experts["low_load"] == "model:default"
    # a restart replays the same history: the same experts
    again = model_controller(active=c.active, history=c.history)
    assert again.library.experts == MODEL_EXPERTS


def test_restart_after_a_promotion_keeps_the_promoted_expert():
    c = model_controller()
    c.on_published("ft-1", "", 1.0)
    c.tick(1.0)
    c.on_published("ft-2", "", 2.0)
    [sw] = c.tick(2.0)
    assert sw.selection["previous"] == "model:ft-1"
    again = model_controller(active=c.active, history=c.history)
    assert again.library.experts["batch"] == "model:ft-2"


def test_a_promotion_over_a_wrapped_model_keeps_its_placement_rule():
    # the active selection serves the model inside a rule (cpu-first:model:default): a published model takes
    # the model's place, the rule stays; the experts that named the wrapped model follow, and a rollback
    # gives them back
    wrapped = dict(MODEL, policy="cpu-first:model:default")
    experts = {"low_load": "cpu-first:model:default", "batch": "model:default", "affinity": "kube-default"}
    lib = ExpertLibrary(experts=experts, baseline="kube-resources")
    c = AdaptiveController(ControllerConfig(library=lib, gate=FAST_GATE, guard=GuardConfig(window=10, min_samples=5)),
                           wrapped, [], now=0.0)
    assert c.on_published("ft-1", "", 1.0) == ""
    [sw] = c.tick(1.0)
    assert (sw.kind, sw.selection["policy"], sw.selection["previous"]) == (
        "promote", "cpu-first:model:ft-1", "cpu-first:model:default")
    assert c.library.experts == {**experts, "low_load": "cpu-first:model:ft-1"}
    assert "already the active selection" in c.on_published("ft-1", "", 2.0)
    for k in range(5):
        c.on_reward(0.05, 3.0 + k)
    [rb] = c.tick(9.0)
    assert (rb.kind, rb.selection["policy"]) == ("rollback", "cpu-first:model:default")
    assert c.library.experts == experts


def test_who_is_left_alone():
    # rule: only an active model selection is superseded; a baseline, a held manual selection or a
    # rollback stays, and auto_promote=False turns promotion off
    manual_model = dict(MODEL, policy="model:v7", reason="manual: pinned")
    cases = [
        (dict(BASE, reason="gate: regime low_load"), {}, 1.0, "is not a model"),
        (manual_model, {}, 50.0, "is held"),
        (dict(MODEL, reason="rollback: reward mean 0.1"), {}, 50.0, "is held"),
        (MODEL, {"auto_promote": False}, 1.0, "auto_promote is off"),
        (manual_model, {}, 150.0, ""),  # the hold has ended
    ]
    for active, kw, now, why in cases:
        c = model_controller(active=active, **kw)
        blocker = c.on_published("ft-1", "gate ok", now)
        out = c.tick(now)
        if why:
            assert why in blocker and out == [] and c.active["policy"] == active["policy"], (active, blocker)
            assert c.last_published["outcome"].startswith("left alone")
        else:
            assert blocker == "" and [s.selection["policy"] for s in out] == ["model:ft-1"]


def test_quarantined_version_is_not_promoted_again():
    c = model_controller()
    c.on_published("ft-1", "", 1.0)
    c.tick(1.0)
    for k in range(5):
        c.on_reward(0.05, 2.0 + k)
    c.tick(8.0)  # rolled back, ft-1 quarantined; the rollback is held meanwhile
    assert "held" in c.on_published("ft-1", "", 9.0)
    assert "quarantined" in c.on_published("ft-1", "", 200.0)
    assert c.tick(200.0) == []


def test_promotion_waits_for_the_end_of_an_exploration():
    c = model_controller(explore=ExploreConfig(rate=0.05, canary_namespaces=("team-a",)))
    [ex] = c.tick(0.0, u=0.01, pick=0.0, features=RegimeFeatures(load=0.3))
    assert ex.kind == "explore"
    c.on_published("ft-1", "", 1.0)
    assert c.tick(2.0) == []
    [end] = c.tick(10.0, u=0.99)
    assert end.kind == "explore_end" and end.selection["policy"] == "model:default"
    [sw] = c.tick(10.5, u=0.99)
    assert sw.kind == "promote" and sw.selection["previous"] == "model:default"


def test_restart_after_two_promotions_and_a_rollback_keeps_the_rolled_back_to_expert():
    # promote ft-1, promote ft-2, rollback -> ft-1: the rollback truncates both promotion entries,
    # so its history entry carries the chain and a restart's replay gives the same experts
    c = model_controller()
    for k, version in enumerate(("ft-1", "ft-2")):
        c.on_published(version, "", 1.0 + k)
        c.tick(1.0 + k)
    for k in range(5):
        c.on_reward(0.05, 3.0 + k)
    [rb] = c.tick(9.0)
    assert (rb.kind, rb.selection["policy"], rb.selection["previous"]) == ("rollback", "model:ft-1", "model:ft-2")
    assert "superseded" not in rb.selection  # the published selection keeps its schema
    assert c.library.experts["low_load"] == "model:ft-1"
    again = model_controller(active=c.active, history=c.history)
    assert again.library.experts == c.library.experts
    assert again.library.experts["batch"] == "model:ft-1" and again.library.experts["affinity"] == "kube-default"


# --- inference refused the selected model ---------------------------------------------------------------

def test_refused_active_model_rolls_back_and_is_quarantined():
    c = model_controller()
    c.on_published("ft-1", "", 1.0)
    [promoted] = c.tick(1.0)
    assert promoted.selection["policy"] == "model:ft-1"
    assert c.on_refused("model:gone", "not_found: no such version", 2.0) is None  # not the active one: stale
    assert c.active["policy"] == "model:ft-1"
    sw = c.on_refused("model:ft-1", "digest: actor.onnx sha256 mismatch", 3.0)
    assert sw is not None and sw.kind == "rollback"
    assert (sw.selection["policy"], sw.selection["previous"]) == ("model:default", "model:ft-1")
    assert sw.selection["reason"] == "rollback: inference refused model:ft-1: digest: actor.onnx sha256 mismatch"
    assert sw.evidence["rolled_back"] == "model:ft-1"
    assert c.active == sw.selection and [e["policy"] for e in c.history] == ["model:default"]
    assert c.library.experts["low_load"] == "model:default"  # the promotion's experts given back
    # quarantined: published again after the hold, it is not promoted; a repeated refusal changes nothing
    assert c.on_published("ft-1", "", 200.0) == "quarantined after a rollback"
    assert c.tick(200.0) == [] and c.active["policy"] == "model:default"
    assert c.on_refused("model:ft-1", "digest", 5.0) is None and c.active["policy"] == "model:default"


def test_refused_manual_selection_goes_back_to_the_previous_baseline():
    c = controller()
    manual = dict(BASE, policy="model:nope", reason="manual: try nope", previous="kube-resources", time=10.0)
    c.adopt(manual, [BASE, manual], now=10.0)
    sw = c.on_refused("model:nope", "not_found", 11.0)
    assert (sw.selection["policy"], sw.selection["mode"]) == ("kube-resources", "full")
    assert sw.selection["reason"].startswith("rollback: inference refused model:nope")
    assert c.quarantine["model:nope"] == 11.0 + 1000.0
