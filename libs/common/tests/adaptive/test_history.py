"""The selection history: rollback targets and what promotions do to the gate's experts."""

from agmarl_common.core.adaptive import history as hist

EXPERTS = {"low_load": "model:default", "batch": "model:default", "affinity": "kube-default"}


def entry(policy, reason, previous="", mode="full"):
    return {"policy": policy, "model_version": "", "mode": mode, "reason": reason, "time": 0.0, "previous": previous}


def test_follow_table():
    on_v2 = dict(EXPERTS, low_load="model:v2", batch="model:v2")
    cases = [
        # (entry, experts before, superseded before, experts after, superseded after)
        (entry("model:v2", "promoted: model v2 published by the trainer", "model:default"), EXPERTS, {},
         on_v2, {"model:v2": "model:default"}),
        (entry("model:v2", "promoted: x", "kube-resources"), EXPERTS, {}, EXPERTS, {}),  # only a model is superseded
        (entry("model:v2", "manual: try", "model:default"), EXPERTS, {}, EXPERTS, {}),  # manual: experts unchanged
        (entry("model:default", "rollback: reward mean 0.1", "model:v2"), on_v2, {"model:v2": "model:default"},
         EXPERTS, {}),  # a promoted model rolled back: its experts go back
        (entry("kube-resources", "rollback: reward mean 0.1", "most-allocated"), EXPERTS, {}, EXPERTS, {}),
    ]
    for e, experts, sup, want_experts, want_sup in cases:
        assert hist.follow(experts, sup, e) == (want_experts, want_sup), e


def test_rollback_after_a_promotion_goes_back_to_the_previous_model():
    h = [entry("kube-resources", "initial"), entry("model:default", "gate: regime low_load", "kube-resources"),
         entry("model:v2", "promoted: model v2", "model:default")]
    sel, new = hist.rollback(h, "kube-resources", "rollback: reward", 9.0)
    assert (sel["policy"], sel["previous"]) == ("model:default", "model:v2")
    assert [e["policy"] for e in new] == ["kube-resources", "model:default"]


def test_consecutive_rollbacks_replay_to_the_same_experts_as_live():
    h = [entry("model:default", "initial"),
         entry("model:v2", "promoted: model v2", "model:default"),
         entry("model:v3", "promoted: model v3", "model:v2")]

    def replay(history):
        experts, sup = dict(EXPERTS), {}
        for e in history:
            experts, sup = hist.follow(experts, sup, e)
        return experts

    live, live_sup = dict(EXPERTS), {}
    for e in h:
        live, live_sup = hist.follow(live, live_sup, e)
    assert live["low_load"] == "model:v3"
    for want in ("model:v2", "model:default"):
        sel, h = hist.rollback(h, "kube-resources", "rollback: reward", 9.0)
        live, live_sup = hist.follow(live, live_sup, sel)
        assert sel["policy"] == want and "superseded" in h[-1] and "superseded" not in sel
        assert live["low_load"] == want and replay(h) == live, (want, h)
