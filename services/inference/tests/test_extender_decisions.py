"""The extender's decision log (each answer a Decision carrying the request's trace), the
explanation helpers, and bind through the official kubernetes client against a stand-in API endpoint
(no kube-apiserver can run here).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import MSG_ID_HEADER
from agmarl_inference.extender_scoring import Scored, blend_weights, explain, returned_kind, to_extender_scores
from agmarl_inference.http import load_binder
from agmarl_testing.extender import SAMPLES, observe_binding, pod_json, prioritize, running, top, until


# --- decision log and trace ------------------------------------------------------------------------

async def test_decision_log_entry_carries_the_request_trace(nats_url):
    async with running(nats_url, rollout_mode="hybrid") as r:
        sub = await r.bus.subscribe(subjects.decision_wildcard(r.cluster))
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        scores = await prioritize(r, headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
        await observe_binding(r, pod_json(), top(scores))
        msg = await sub.next_msg(timeout=3)
        decision = m.decode(m.Decision, msg.data)
        assert decision.trace_id == trace_id and msg.headers["traceparent"].split("-")[1] == trace_id
        assert msg.headers[MSG_ID_HEADER] == decision.decision_id
        assert decision.source == "extender" and decision.pod_key == "default/p" and decision.mode == "hybrid"
        assert set(decision.scores) == set(decision.model_scores) == set(decision.default_scores) == set(scores)
        ex = decision.explanation
        assert ex["blend"] == {"model": 0.7, "default": pytest.approx(0.3)}
        assert ex["top"][0]["node"] == ex["extender_choice"] and "default.NodeResourcesFit" in ex["top"][0]["terms"]
        assert decision.bound_node == decision.node == top(scores) and ex["binding"] == "watch"
        # the drivers are an exact decomposition of the winner's margin over the runner-up
        assert sum(d["delta"] for d in ex["drivers"]) == pytest.approx(ex["margin"], abs=0.01)
        # no traceparent, another pod: the request starts a new trace
        other_scores = await prioritize(r, pod_json("q"))
        await observe_binding(r, pod_json("q"), top(other_scores))
        other = m.decode(m.Decision, (await sub.next_msg(timeout=3)).data)
        assert len(other.trace_id) == 32 and other.trace_id != trace_id
        # the entry is in the JetStream decision log
        info = await r.bus.js.stream_info(subjects.DECISIONS.name, subjects_filter=subjects.decision_wildcard(r.cluster))
        assert info.state.messages >= 2


async def test_the_model_explains_a_decision_on_the_state_it_scored_before_the_binding_is_known(nats_url):
    # the learned model's explanation is computed right after its scores, on the request's own state (explained
    # when the binding arrived, it ran on an older state than the next request's and recomputed the caches)
    async with running(nats_url, rollout_mode="hybrid") as r:
        from agmarl_common.serving.modelstore import local_dir
        from agmarl_common.serving.onnx_model import OnnxModelPolicy

        policy = OnnxModelPolicy.from_dir(local_dir("default"))
        calls: list[tuple[str, int]] = []
        score, explain_fn = policy.score, policy.explain

        def spy_score(pod, state, cand):
            calls.append(("score", id(state)))
            return score(pod, state, cand)

        def spy_explain(pod, state, cand, top=3):
            calls.append(("explain", id(state)))
            return explain_fn(pod, state, cand, top=top)

        policy.score, policy.explain = spy_score, spy_explain
        r.app.policy = policy
        sub = await r.bus.subscribe(subjects.decision_wildcard(r.cluster))
        scores = await prioritize(r, pod_json("e"))
        await until(lambda: len(calls) == 2, "the explanation was computed")
        assert [c[0] for c in calls] == ["score", "explain"] and calls[0][1] == calls[1][1]  # same state object
        await observe_binding(r, pod_json("e"), top(scores))
        decision = m.decode(m.Decision, (await sub.next_msg(timeout=5)).data)
        model = decision.explanation["model"]
        assert "error" not in model and model, model
        assert decision.bound_node == top(scores) and len(calls) == 2  # nothing recomputed for the entry


def test_explain_and_score_helpers():
    default = Scored(np.array([100.0, 0.0, 50.0]), {"A": np.array([60.0, 0.0, 30.0]), "B": np.array([40.0, 0.0, 20.0])})
    model = Scored(np.array([0.0, 100.0, 40.0]), {"m": np.array([0.0, 100.0, 40.0])})
    ex = explain(["a", "b", "c"], model, default, (0.7, 0.3), [0, 10, 4])
    assert [t["node"] for t in ex["top"]] == ["b", "c", "a"]
    assert ex["margin"] == pytest.approx(70 - 43)
    assert {d["term"]: d["delta"] for d in ex["drivers"]} == pytest.approx(
        {"model.m": 0.7 * 60, "default.A": 0.3 * -30, "default.B": 0.3 * -20})
    assert to_extender_scores(np.array([0, 4.9, 5, 94.9, 95, 100, 130])) == [0, 0, 1, 9, 10, 10, 10]
    assert blend_weights("hybrid", True, 0.7) == (0.7, pytest.approx(0.3))
    assert blend_weights("canary", False, 0.7) == (0.0, 1.0) and blend_weights("full", True, 0.7) == (1.0, 0.0)
    assert returned_kind("shadow", True, "") == "neutral" and returned_kind("full", True, "nats_down") == "default"
    assert returned_kind("canary", False, "") == "neutral" and returned_kind("canary", True, "") == "model"


# --- bind ---------------------------------------------------------------------------------------------

class _ApiStub(BaseHTTPRequestHandler):
    """Stands in for kube-apiserver's pods/binding endpoint (no API server can run here)."""

    seen: list = []
    status = 201

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, body))
        payload = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Success" if self.status < 300 else "Failure",
                              "message": "conflict" if self.status >= 300 else ""}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


async def test_bind_creates_a_binding_through_the_kubernetes_client(nats_url, tmp_path):
    assert load_binder(environ={}) is None  # no setting, no $KUBECONFIG, not in a pod, no ~/.kube/config
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiStub)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "t",
            "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "t0k"}}]}))
        binder = load_binder(environ={"KUBECONFIG": str(kubeconfig)})
        assert binder is not None
        async with running(nats_url, binder=binder) as r:
            args = json.loads((SAMPLES / "bind-bind-1-request.wire.json").read_bytes())
            resp = await r.client.post("/ext/bind", json=args)
            assert resp.status_code == 200 and resp.json() == {"Error": ""}
            path, body = _ApiStub.seen[-1]
            assert path == f"/api/v1/namespaces/default/pods/{args['PodName']}/binding"
            assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": args["Node"]}
            assert body["metadata"]["uid"] == args["PodUID"]
            _ApiStub.status = 409
            failed = await r.client.post("/ext/bind", json=args)
            assert failed.status_code == 200 and "409" in failed.json()["Error"]
    finally:
        _ApiStub.status = 201
        server.shutdown()
        server.server_close()
