"""inference: graph requests in, decisions out (to the JetStream decision log), with the active
policy chosen by the adaptive-engine through the KV store."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid

from prometheus_client import Counter, Gauge, Histogram

from agmarl_common import messages as m
from agmarl_common import subjects
from agmarl_common.cluster.model import pod_from_dict
from agmarl_common.cluster.selectors import matches_label_selector
from agmarl_common.graph import state_from_features
from agmarl_common.kubeconvert import parse_label_selector
from agmarl_common.policies.registry import get_policy
from agmarl_common.service import HandlerContext, ServiceRuntime
from agmarl_common.settings import load_settings
from agmarl_inference.batch import start_batch_mode
from agmarl_inference.decide import decide
from agmarl_inference.models import ModelRegistry
from agmarl_inference.overlay import InFlight
from agmarl_inference.http import setup_extender, start_extender
from agmarl_inference.settings import InferenceSettings

SERVICE = "inference"
STARTUP_SELECTION_WAIT_S = 5.0  # a graph request at start-up waits at most this long for the KV selection
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class InferenceApp:
    def __init__(self, rt: ServiceRuntime, settings: InferenceSettings):
        self.rt = rt
        self.settings = settings
        self.default = get_policy(settings.baseline_policy)
        self.policy = self.default
        self.model_version = ""
        self.mode = settings.rollout_mode
        self.replica = uuid.uuid4().hex[:12]  # this replica's name in Decision.origin
        self.canary: tuple[object, str] | None = None  # (policy, version) tried only on opted-in pods
        self.canary_selector = parse_label_selector(settings.canary_label_selector) \
            if settings.canary_label_selector else None
        self.in_flight = InFlight()
        # cleared by main() until the KV selection was read, so that no pod is decided on the start-up policy
        self.selection_loaded = asyncio.Event()
        self.selection_loaded.set()
        # learned models: model_published fetches and caches a version; a model:<ref> selection loads it off
        # the loop (or takes it from the cache) and swaps it in via apply_selection
        self.models = ModelRegistry(rt, self.apply_selection)
        reg = rt.registry
        self.decisions = Counter("agmarl_decisions_total", "Scheduling decisions",
                                 ["policy", "mode", "source", "result"], registry=reg)
        self.attempts = Counter("scheduler_schedule_attempts_total", "Scheduling attempts, kube-scheduler naming",
                                ["result", "profile"], registry=reg)
        self.latency = Histogram("agmarl_decision_latency_seconds", "Pending pod seen -> decision published",
                                 buckets=LATENCY_BUCKETS, registry=reg)
        self.active = Gauge("agmarl_active_policy_info", "Active policy (value 1)",
                            ["policy", "model_version", "mode"], registry=reg)
        self._set_active_gauge()

    def _set_active_gauge(self) -> None:
        self.active.clear()
        self.active.labels(policy=self.policy.name, model_version=self.model_version or "none", mode=self.mode).set(1)

    def select(self, sel: m.PolicySelection) -> None:
        if self.models.claim(sel):  # model:<ref>: the registry loads it off the loop, then apply_selection
            return
        try:
            policy = get_policy(sel.policy)
        except (KeyError, ValueError) as exc:
            self.rt.log.warning("policy selection %r rejected: %s; keeping %s", sel.policy, exc, self.policy.name)
            return
        self.apply_selection(policy, sel.model_version, sel)

    def apply_selection(self, policy, version: str, sel: m.PolicySelection) -> None:
        # the rollout mode is owned by the KV key ``rollout`` (set_mode), not by policy selections;
        # a selection in mode "canary" (safe exploration) only applies to opted-in pods
        if sel.mode == "canary":
            self.canary = (policy, version)
            self.rt.log.info("canary policy %s (version %s) for opted-in pods only: %s", policy.name,
                             version or "-", sel.reason)
            return
        self.canary = None
        self.policy, self.model_version = policy, version
        self.rt.log.info("active policy now %s (version %s, mode %s): %s", policy.name, version or "-",
                         self.mode, sel.reason)
        self._set_active_gauge()

    def set_mode(self, mode: str, reason: str) -> None:
        """Rollout mode switched at run time (KV ``agmarl_config/rollout``): the loop and the extender."""
        self.rt.log.info("rollout mode now %s (was %s): %s", mode, self.mode, reason)
        self.mode = mode
        self._set_active_gauge()

    def opted_in(self, pod) -> bool:
        """Canary scope: the pod's namespace is listed, or its labels match the canary selector."""
        if pod.namespace in self.settings.canary_namespaces:
            return True
        return self.canary_selector is not None and matches_label_selector(self.canary_selector, pod.labels)

    def policy_for(self, pod) -> tuple[object, str]:
        if self.canary is not None and self.opted_in(pod):
            return self.canary
        return self.policy, self.model_version

    async def on_policy(self, msg: m.PolicySelection, ctx: HandlerContext) -> None:
        self.select(msg)

    async def on_model_published(self, msg: m.ModelPublished, ctx: HandlerContext) -> None:
        await self.models.on_published(msg)  # cached only: the active policy follows the selection

    async def on_graph(self, msg: m.GraphRequest, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster:
            return
        pod = pod_from_dict(msg.pod)
        if self.settings.batch_scheduler_name and pod.scheduler_name == self.settings.batch_scheduler_name:
            return  # batch mode places these pods jointly
        if not self.selection_loaded.is_set():
            try:
                await asyncio.wait_for(self.selection_loaded.wait(), STARTUP_SELECTION_WAIT_S)
            except asyncio.TimeoutError:
                pass  # decide on the current policy rather than stall scheduling
        now = time.time()
        # this replica's decisions the graph does not show yet take their resources first
        state = self.in_flight.apply(state_from_features(msg.features), msg.decisions_seen.get(self.replica, 0), now)
        policy, version = self.policy_for(pod)
        choice = decide(pod, state, policy, self.default, self.mode, self.settings.hybrid_model_weight,
                        msg.filtered_out, self.settings.explain_model)
        decided_at = time.time()
        seq = self.in_flight.record(pod, choice.node, choice.gpus, decided_at)
        result = "scheduled" if choice.node else "unschedulable"
        span = ctx.span
        span.set_attribute("agmarl.pod", pod.key)
        span.set_attribute("agmarl.node", choice.node)
        span.set_attribute("agmarl.policy", policy.name)
        trace_id = format(span.get_span_context().trace_id, "032x") if span.get_span_context().is_valid else ""
        decision = m.Decision(
            decision_id=uuid.uuid4().hex, cluster=msg.cluster, namespace=pod.namespace, pod_key=pod.key,
            node=choice.node, gpus=list(choice.gpus), policy=policy.name, model_version=version,
            mode=self.mode, score=choice.score, scores=choice.scores, model_scores=choice.model_scores,
            default_scores=choice.default_scores, explanation=choice.explanation, trace_id=trace_id,
            seen_at=msg.seen_at, decided_at=decided_at, source="loop", origin=self.replica, origin_seq=seq)
        await ctx.publish(subjects.decision(msg.cluster, pod.namespace), decision, js=True,
                          msg_id=decision.decision_id)
        self.decisions.labels(policy=policy.name, mode=self.mode, source="loop", result=result).inc()
        self.attempts.labels(result=result, profile="agmarl").inc()
        self.latency.observe(max(0.0, decided_at - msg.seen_at))


async def load_active_policy(rt: ServiceRuntime, app: InferenceApp) -> None:
    """Read the adaptive-engine's current selection from the KV store (absent -> keep the baseline)."""
    raw = await rt.bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
    if raw:
        app.select(m.decode(m.PolicySelection, raw))


async def main() -> int:
    settings = load_settings(InferenceSettings)
    rt = ServiceRuntime(SERVICE, settings)
    app = InferenceApp(rt, settings)
    rt.handle(subjects.graph(settings.cluster), m.GraphRequest, queue=settings.queue_group)(app.on_graph)
    rt.handle(subjects.policy_selection(), m.PolicySelection)(app.on_policy)
    rt.handle(subjects.model_published(), m.ModelPublished)(app.on_model_published)
    rt.health_details = lambda: {"policy": app.policy.name, "model_version": app.model_version,
                                 **app.models.details()}
    extender = setup_extender(rt, app, settings, decisions=app.decisions)
    if settings.batch_scheduler_name:
        start_batch_mode(rt, settings, policy=lambda: app.policy)
    app.selection_loaded.clear()  # graph requests that arrive from now on wait for the KV selection
    await rt.start()
    try:
        await rt.bus.ensure_streams()
        try:
            await load_active_policy(rt, app)
        except Exception as exc:  # noqa: BLE001 - no KV yet is normal at first start
            rt.log.info("no active policy in KV yet (%s); using %s", exc, app.policy.name)
    finally:
        app.selection_loaded.set()
    await app.models.start()
    await start_extender(rt, extender, settings)
    # Everything that exists now (modules, FastAPI, pydantic schemas, OTel, NATS) lives as long as the
    # process: out of full collections, a gen-2 pause scans only newer objects (40-120 ms -> a few ms).
    gc.collect()
    gc.freeze()
    return await rt.run_until_stopped()
