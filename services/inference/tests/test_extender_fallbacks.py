"""The extender never fails scheduling: malformed, oversized and invalid bodies get 400 / 413 / 422 (counted), a
slow or failing model and NATS down answer default scores within the time budget.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np

from agmarl_common.runtime.metrics import sample
from agmarl_common.runtime.natsserver import NatsServer
from agmarl_common.core.policies.base import PolicyBase
from agmarl_common.core.policies.registry import get_policy
from agmarl_testing.extender import LOADED, Running, pod_json, prioritize, running, until


# --- bad bodies --------------------------------------------------------------------------------------

async def test_malformed_and_oversized_bodies(nats_url):
    async with running(nats_url, max_body_bytes=4096, extender_max_nodes=5) as r:
        cases = [
            (b"{not json", 400, "not JSON"),
            (b"[1, 2]", 422, "not a ExtenderArgs"),
            (b'{"NodeNames": ["node-0"]}', 422, "Pod"),
            (json.dumps({"Pod": pod_json(cpu="lots"), "NodeNames": ["node-0"]}).encode(), 422, "quantity"),
            (json.dumps({"Pod": {"metadata": {}}, "NodeNames": ["node-0"]}).encode(), 422, "metadata.name"),
            (json.dumps({"Pod": pod_json(), "NodeNames": ["n" * 5000]}).encode(), 413, "exceeds"),
            (b'{"Pod": {}, "NodeNames": ["\\ud800"]}', 400, "not JSON"),  # a lone surrogate
            (b"[" * 1000 + b"]" * 1000, 400, "recursion limit"),
            (b'{"Pod": {}, "NodeNames": ["a", "b", "c", "d", "e", "f"]}', 413, "5 per request"),
        ]
        for body, status, text in cases:
            for verb in ("filter", "prioritize"):
                resp = await r.client.post(f"/{verb}", content=body, headers={"Content-Type": "application/json"})
                assert resp.status_code == status, (body[:40], verb, resp.text)
                assert text in resp.json()["detail"]

        async def chunks():  # no Content-Length: the limit applies while reading
            for _ in range(10):
                yield b" " * 1000
        resp = await r.client.post("/filter", content=chunks())
        assert resp.status_code == 413
        bad = await r.client.post("/bind", json={"PodName": "x"})
        assert bad.status_code == 422
        reg = r.rt.registry
        assert sample(reg, "agmarl_extender_rejected_requests_total", {"verb": "filter", "reason": "oversized"}) == 2
        assert sample(reg, "agmarl_extender_rejected_requests_total", {"verb": "prioritize", "reason": "malformed"}) == 2
        assert sample(reg, "agmarl_extender_rejected_requests_total", {"verb": "prioritize", "reason": "encoding"}) == 1
        assert sample(reg, "agmarl_extender_rejected_requests_total", {"verb": "prioritize", "reason": "schema"}) == 2
        assert sample(reg, "agmarl_extender_rejected_requests_total", {"verb": "filter", "reason": "too_many_nodes"}) == 1
        assert sample(reg, "agmarl_extender_rejected_requests_total", {"verb": "filter", "reason": "invalid"}) == 2
        # lower-case keys are read as Go's encoding/json reads them
        ok = await r.client.post("/filter", json={"pod": pod_json(), "nodenames": ["node-0"]})
        assert ok.status_code == 200 and ok.json()["NodeNames"] == ["node-0"]


# --- time budget and fallbacks ---------------------------------------------------------------------------

class SlowPolicy(PolicyBase):
    """A model that takes 0.4 s per call (prefers the last candidate)."""

    name = "slow-model"

    def score(self, pod, state, candidates):
        time.sleep(0.4)
        return np.arange(len(candidates), dtype=float)


class BrokenPolicy(PolicyBase):
    name = "broken-model"

    def score(self, pod, state, candidates):
        raise RuntimeError("model exploded")


async def _default_answer(r: Running) -> dict[str, int]:
    r.app.policy = r.app.default
    return await prioritize(r)


async def test_slow_or_failing_model_answers_default_scores_within_budget(nats_url):
    async with running(nats_url, extender_budget_ms=100) as r:
        expected = await _default_answer(r)
        assert max(expected, key=expected.get) != LOADED  # default scoring spreads
        r.app.policy = SlowPolicy()
        started = time.perf_counter()
        first = await prioritize(r)
        elapsed = time.perf_counter() - started
        second = await prioritize(r)  # the slow call still runs: this one does not queue behind it
        assert first == second == expected
        assert elapsed < 0.3, f"answered after {elapsed:.3f}s (budget 0.1 s, model 0.4 s)"
        assert r.fallbacks("model_timeout") == 1 and r.fallbacks("model_busy") == 1
        # the slow call ends: the model's one thread runs this no-op after it (and after its slot is released)
        await asyncio.wrap_future(r.ext.service._model_pool.submit(lambda: None))
        r.app.policy = BrokenPolicy()
        assert await prioritize(r) == expected and r.fallbacks("model_error") == 1
        assert sample(r.rt.registry, "agmarl_decisions_total", {"policy": "broken-model", "mode": "full",
                                                                "source": "extender", "result": "fallback"}) == 1


class NotingPolicy(PolicyBase):
    """A model that notes the thread it scores and explains on (prefers the last candidate); ``delay`` a call."""

    def __init__(self, name: str, delay: float = 0.0):
        self.name, self.delay = name, delay
        self.scored: list[int] = []
        self.explained: list[int] = []

    def score(self, pod, state, candidates):
        time.sleep(self.delay)
        self.scored.append(threading.get_ident())
        return np.arange(len(candidates), dtype=float)

    def explain(self, pod, state, candidates, top=5):
        self.explained.append(threading.get_ident())
        return {"policy": self.name, "chosen": state.nodes[int(candidates[-1])].name}


async def test_a_fast_model_scores_small_requests_on_the_event_loop_a_slow_one_on_its_thread(nats_url):
    """The first scoring of a policy runs on the model's thread (its time unknown); once one took at most
    INLINE_MODEL_MS, the next requests of at most INLINE_STATE_NODES nodes are scored, and explained, on the event
    loop (no thread hop), the explanation in the held entry; a slower model stays on its thread."""
    async with running(nats_url, extender_budget_ms=500) as r:
        loop_thread, service = threading.get_ident(), r.ext.service
        fast = NotingPolicy("fast-model")
        r.app.policy = fast
        for k in range(3):
            await prioritize(r, pod=pod_json(name=f"f{k}"))
        await asyncio.wrap_future(service._model_pool.submit(lambda: None))  # the first explanation is done
        assert fast.scored[0] != loop_thread and fast.scored[1:] == [loop_thread, loop_thread]
        assert fast.explained[0] != loop_thread and fast.explained[1:] == [loop_thread, loop_thread]
        entry = service.pending["default/f2"].build("node-0")
        assert entry.explanation["model"] == {"policy": "fast-model", "chosen": entry.node}
        assert service.pending["default/f2"].cheap  # explained already: built on the event loop
        slow = NotingPolicy("slow-model", delay=0.02)  # 20 ms > INLINE_MODEL_MS
        r.app.policy = slow
        for k in range(3):
            await prioritize(r, pod=pod_json(name=f"s{k}"))
        assert len(slow.scored) == 3 and loop_thread not in slow.scored
        assert r.fallbacks("model_timeout") == 0 and r.fallbacks("model_busy") == 0


async def test_nats_down_answers_default_scores(tmp_path):
    with NatsServer(store_dir=tmp_path / "js") as server:
        async with running(server.url) as r:
            expected = await _default_answer(r)
            r.app.policy = get_policy("most-allocated")
            model = await prioritize(r)
            assert max(model, key=model.get) == LOADED and model != expected
            server.stop()
            r.nats_stopped = True
            await until(lambda: not r.rt.bus.is_connected, "the runtime saw NATS go")
            started = time.perf_counter()
            assert await prioritize(r) == expected
            assert time.perf_counter() - started < 0.3
            assert r.fallbacks("nats_down") == 1
            r.ext.service.sweep(time.time() + 3600)  # the binding cannot be observed without NATS: given up
            # the decision log entry was dropped and counted, not queued forever
            await until(lambda: sample(r.rt.registry, "agmarl_extender_decisions_dropped_total",
                                        {"reason": "nats_down"}) >= 1, "the drop was counted")
