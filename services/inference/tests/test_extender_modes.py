"""Rollout modes over real HTTP: what the extender returns per mode (shadow, recommend, canary,
hybrid, full), the mode switched at run time from KV, and the active policy's admission (load cap) in
the filter verb only where the policy decides.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.metrics import sample
from agmarl_inference.extender_wire import NEUTRAL_SCORE
from agmarl_inference.http import parse_mode
from agmarl_testing.extender import LOADED, observe_binding, pod_json, prioritize, running, top, until


# --- rollout modes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, pod, expect", [
    ("full", pod_json(), "model"),
    ("recommend", pod_json(), "model"),
    ("hybrid", pod_json(), "model"),
    ("shadow", pod_json(), "neutral"),
    ("canary", pod_json(namespace="team-canary"), "model"),
    ("canary", pod_json(labels={"canary": "true"}), "model"),
    ("canary", pod_json(labels={"canary": "no"}), "neutral"),
])
async def test_rollout_modes(nats_url, mode, pod, expect):
    # what each mode returns, not the budget: a request that outlasts 100 ms on a loaded machine falls back to a
    # neutral answer (failed once in a CI rehearsal: canary, opted in, "neutral"), so the budget here is 5 s
    async with running(nats_url, rollout_mode=mode, canary_namespaces=["team-canary"],
                       canary_label_selector="canary=true", extender_budget_ms=5000) as r:
        sub = await r.bus.subscribe(subjects.decision_wildcard(r.cluster))
        scores = await prioritize(r, pod)
        await observe_binding(r, pod, top(scores))  # the decision is logged once its binding is known
        decision = m.decode(m.Decision, (await sub.next_msg(timeout=3)).data)
        assert decision.bound_node == decision.node == top(scores)
        assert decision.mode == mode and decision.explanation["returned"] == expect, decision.explanation
        model, default = np.array(list(decision.model_scores.values())), np.array(list(decision.default_scores.values()))
        if expect == "neutral":
            assert set(scores.values()) == {NEUTRAL_SCORE}
        else:  # the model's own 0..100 scores mapped to 0..10
            assert scores == {n: int(np.floor(s / 10 + 0.5)) for n, s in decision.model_scores.items()}
            assert max(scores, key=scores.get) == LOADED
        # the log records the model's choice in every mode, and the blend kube-scheduler ends up making
        assert decision.explanation["model_choice"] == LOADED
        assert decision.explanation["default_choice"] != LOADED
        blended = np.array(list(decision.scores.values()))
        w = {"hybrid": 0.7, "full": 1.0, "recommend": 1.0, "shadow": 0.0}.get(mode, 1.0 if expect == "model" else 0.0)
        assert np.allclose(blended, w * model + (1 - w) * default, atol=0.01)
        assert decision.explanation["extender_choice"] == list(decision.scores)[int(np.argmax(blended))]
        if mode == "recommend":
            assert decision.explanation["recommendation"] == LOADED


# --- rollout mode from KV at run time ------------------------------------------------------------------

async def test_kv_rollout_switches_mode_at_run_time(nats_url, caplog):
    caplog.set_level(logging.WARNING)
    async with running(nats_url, rollout_mode="full") as r:
        kv = await r.bus.kv(subjects.CONFIG_BUCKET)
        try:
            first = await prioritize(r)
            assert max(first, key=first.get) == LOADED
            await kv.put(subjects.KEY_ROLLOUT, b"shadow")
            await until(lambda: r.app.mode == "shadow", "shadow from KV")
            assert set((await prioritize(r)).values()) == {NEUTRAL_SCORE}
            await kv.put(subjects.KEY_ROLLOUT, json.dumps({"mode": "hybrid"}).encode())
            await until(lambda: r.app.mode == "hybrid", "hybrid from KV (JSON)")
            await kv.put(subjects.KEY_ROLLOUT, b"bogus")
            await until(lambda: "rollout key b'bogus' is not one of" in caplog.text, "the bogus value seen")
            assert r.app.mode == "hybrid"
            await kv.delete(subjects.KEY_ROLLOUT)
            await until(lambda: r.app.mode == "full", "back to the configured mode when the key goes")
            assert sample(r.rt.registry, "agmarl_active_policy_info",
                          {"policy": "most-allocated", "model_version": "none", "mode": "full"}) == 1
        finally:
            await kv.purge(subjects.KEY_ROLLOUT)


@pytest.mark.parametrize("raw, mode", [(b"hybrid", "hybrid"), (b" Shadow\n", "shadow"), (b'{"mode": "canary"}', "canary"),
                                       (b"nope", None), (b"", None), (None, None), (b"{bad", None)])
def test_parse_mode(raw, mode):
    assert parse_mode(raw) == mode


async def test_filter_applies_the_active_policys_load_cap_only_where_the_policy_decides(nats_url):
    """capped:most-allocated active: a best-effort pod that would take node-1 (12 of 32 cpu requested)
    above 80 % fails there with the admission reason in full mode; in shadow mode the policy does not
    decide, so only the hard filter runs."""
    be = pod_json("batch", cpu="14")  # 26/32 = 81 % on node-1, 14/32 elsewhere
    body = {"Pod": be, "NodeNames": ["node-0", LOADED, "node-2"]}
    async with running(nats_url, model="capped:most-allocated", rollout_mode="full") as r:
        out = (await r.client.post("/filter", json=body)).json()
        assert out["NodeNames"] == ["node-0", "node-2"]
        assert list(out["FailedNodes"]) == [LOADED] and "LoadCap" in out["FailedNodes"][LOADED]
        assert out["FailedAndUnresolvableNodes"] == {}
        small = {"Pod": pod_json("small", cpu="13"), "NodeNames": [LOADED]}  # 25/32 = 78 %: admitted
        assert (await r.client.post("/filter", json=small)).json()["NodeNames"] == [LOADED]
    async with running(nats_url, model="capped:most-allocated", rollout_mode="shadow") as r:
        out = (await r.client.post("/filter", json=body)).json()
        assert out["NodeNames"] == ["node-0", LOADED, "node-2"] and out["FailedNodes"] == {}
