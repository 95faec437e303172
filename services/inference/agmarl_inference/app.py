"""inference: pending pods in, decisions out (to the JetStream decision log), decided on the process's
cluster view (graph-builder's graph replicated, plus this replica's assumed decisions) with the active
policy chosen by the adaptive-engine through the KV store."""

from __future__ import annotations

import asyncio
import time
import uuid

from prometheus_client import Counter, Gauge, Histogram

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.cluster.model import pod_from_dict
from agmarl_common.core.cluster.selectors import matches_label_selector
from agmarl_common.kube.convert import parse_label_selector
from agmarl_common.core.policies.base import brief
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import catalog
from agmarl_common.runtime.heap import settle
from agmarl_common.runtime.metrics import Children
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_common.runtime.settings import load_settings
from agmarl_inference import catchup
from agmarl_inference.batch import start_batch_mode
from agmarl_inference.decide import decide, tie_order
from agmarl_inference.models import ModelRegistry
from agmarl_inference.http import setup_extender, start_extender
from agmarl_inference.replica import GraphReplica
from agmarl_inference.settings import InferenceSettings

SERVICE = "inference"
STARTUP_SELECTION_WAIT_S = 5.0  # a pending pod at start-up waits at most this long for the KV selection
STARTUP_VIEW_WAIT_S = 10.0  # ... and this long for the first full graph (else the collector announces it again)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
MAX_UNACKED = 64  # decisions published to JetStream and not yet acknowledged; one more waits for the oldest
FLUSH_WAIT_S = 5.0  # at shutdown, how long the decisions still unacknowledged are waited for
# the catch-up waits this long after listening: the events of the bindings made just before have landed in EVENTS
CATCHUP_DELAY_S = 3.0
PREPARE_YIELDS = 3  # event-loop turns the policy's ``prepare`` waits after a decision: its publish goes out first


class InferenceApp:
    def __init__(self, rt: ServiceRuntime, settings: InferenceSettings):
        self.rt = rt
        self.settings = settings
        self.default = get_policy(settings.baseline_policy)
        self.policy = self.default
        self.model_version = ""
        self.mode = settings.rollout_mode
        self.name = uuid.uuid4().hex[:12]  # this replica's name in Decision.origin
        self.seq = 0  # its decision counter (Decision.origin_seq)
        self.canary: tuple[object, str] | None = None  # (policy, version) tried only on opted-in pods
        self.canary_selector = parse_label_selector(settings.canary_label_selector) \
            if settings.canary_label_selector else None
        self.replica = GraphReplica(rt, settings.cluster, settings.assume_ttl_seconds)
        self.view = self.replica.view  # the one cluster view: this loop, the extender and the batch scheduler
        # AGMARL_BRIEF_WORKLOAD: the workload every policy is told (FGD's target workload), as the harnesses do
        self.brief_pods = catalog.openb_pods(settings.brief_workload) if settings.brief_workload else None
        self._rank_key: object = None
        self._rank = None
        # decisions published and waiting for their JetStream acknowledgement: the loop decides the next pod
        # meanwhile (publishes go out in decision order on the one connection, so the stream keeps that order)
        self._unacked: set[asyncio.Task] = set()
        # set when the view changed: ``prepare_loop`` brings the active policy's per-node caches up to it
        # between pods, so that the next pod's decision does not start with that work
        self.view_changed = asyncio.Event()
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
        # the loop's per-decision counters: each label combination's child looked up once
        self._decided, self._attempted = Children(self.decisions), Children(self.attempts)
        self._set_active_gauge()

    def _set_active_gauge(self) -> None:
        self.active.clear()
        self.active.labels(policy=self.policy.name, model_version=self.model_version or "none", mode=self.mode).set(1)

    def select(self, sel: m.PolicySelection) -> None:
        if self.settings.pinned_policy and sel.policy != self.settings.pinned_policy:
            self.rt.log.info("policy selection %r ignored: the policy is pinned to %s (AGMARL_PINNED_POLICY)",
                             sel.policy, self.settings.pinned_policy)
            return
        if self.models.claim(sel):  # model:<ref>: the registry loads it off the loop, then apply_selection
            return
        try:
            policy = get_policy(sel.policy)
        except (KeyError, ValueError) as exc:
            self.rt.log.warning("policy selection %r rejected: %s; keeping %s", sel.policy, exc, self.policy.name)
            return
        self.apply_selection(policy, sel.model_version, sel)

    def apply_selection(self, policy, version: str, sel: m.PolicySelection) -> None:
        # the objective the services serve: a model selection is built with it, a registry name that wraps a
        # model (``cpu-first:model:default``) is told it here, and the wrapped model's version is logged
        brief(policy, objective=self.settings.objective)
        version = version or str(getattr(policy, "version", "") or "")
        # the rollout mode is owned by the KV key ``rollout`` (set_mode), not by policy selections;
        # a selection in mode "canary" (safe exploration) only applies to opted-in pods
        if sel.mode == "canary":
            self.canary = (policy, version)
            self.rt.log.info("canary policy %s (version %s) for opted-in pods only: %s", policy.name,
                             version or "-", sel.reason)
            return
        self.canary = None
        if self.brief_pods is not None:  # a trace replay: the policy knows the workload, as in the simulator
            brief(policy, self.brief_pods)
        self.policy, self.model_version = policy, version
        if self.settings.pinned_policy:
            self.selection_loaded.set()  # the pinned policy serves from now on
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

    def tie_rank(self, state):
        """Per-node tie order of the current node set (cached: nodes change rarely)."""
        if self._rank_key is not state.nodes:
            self._rank_key, self._rank = state.nodes, tie_order(state)
        return self._rank

    async def _ready(self) -> bool:
        """Wait (at start-up only) for the KV selection and the first full graph."""
        if not self.selection_loaded.is_set():
            try:
                await asyncio.wait_for(self.selection_loaded.wait(), STARTUP_SELECTION_WAIT_S)
            except asyncio.TimeoutError:
                pass  # decide on the current policy rather than stall scheduling
        if not self.view.warm:
            self.replica.request_sync("cold")
            try:
                await asyncio.wait_for(self.replica.ready.wait(), STARTUP_VIEW_WAIT_S)
            except asyncio.TimeoutError:
                return False
        return self.view.warm

    async def on_pending(self, msg: m.PendingPod, ctx: HandlerContext) -> None:
        if msg.cluster != self.settings.cluster:
            return
        pod = pod_from_dict(msg.pod)
        if self.settings.batch_scheduler_name and pod.scheduler_name == self.settings.batch_scheduler_name:
            return  # batch mode places these pods jointly
        if not await self._ready():
            self.decisions.labels(policy=self.policy.name, mode=self.mode, source="loop", result="no_view").inc()
            self.rt.log.warning("no cluster view yet: pod %s left for the next announcement", pod.key)
            return
        if self.view.is_assumed(pod.key) or self.view.node_of(pod.key):
            return  # decided already (its binding is on the way) or bound: an announcement raced the bind
        state = self.view.state
        policy, version = self.policy_for(pod)
        choice = decide(pod, state, policy, self.default, self.mode, self.settings.hybrid_model_weight,
                        self.settings.explain_model, self.tie_rank(state))
        decided_at = time.time()
        if choice.node and self.mode != "shadow":
            self.view.assume(pod, choice.node, choice.gpus, decided_at)
        self.seq += 1
        result = "scheduled" if choice.node else "unschedulable"
        span = ctx.span
        span.set_attributes({"agmarl.pod": pod.key, "agmarl.node": choice.node, "agmarl.policy": policy.name,
                             "agmarl.view_version": self.view.seq})
        trace_id = ctx.trace_id
        decision = m.Decision(
            decision_id=uuid.uuid4().hex, cluster=msg.cluster, namespace=pod.namespace, pod_key=pod.key,
            node=choice.node, gpus=list(choice.gpus), policy=policy.name, model_version=version,
            mode=self.mode, score=choice.score, scores=choice.scores, model_scores=choice.model_scores,
            default_scores=choice.default_scores, explanation=choice.explanation, trace_id=trace_id,
            seen_at=msg.seen_at, decided_at=decided_at, source="loop", origin=self.name, origin_seq=self.seq)
        if len(self._unacked) >= MAX_UNACKED:  # JetStream slow or away: wait rather than pile up publishes
            await asyncio.wait(self._unacked, return_when=asyncio.FIRST_COMPLETED)
        # the publish starts now, in the handler's span (its trace context goes in the headers); the ack is
        # awaited by the task, not by the loop
        task = asyncio.get_running_loop().create_task(self._publish(ctx, decision, pod, policy.name, result))
        self._unacked.add(task)
        task.add_done_callback(self._unacked.discard)
        self.view_changed.set()
        self.latency.observe(max(0.0, decided_at - msg.seen_at))
        # one turn of the loop for the publish task to hand the decision to the connection: its flusher then
        # writes it before this subscription takes its next pod. Without it, pods read off the socket together
        # (after any stall) were decided back to back while each decision waited in the client's buffer for
        # the next decision to end
        await asyncio.sleep(0)

    async def on_graph(self, msg: m.GraphUpdate, ctx: HandlerContext) -> None:
        before = self.view.state
        await self.replica.on_update(msg, ctx)
        if self.view.state is not before:  # not the bind of a decision assumed as it was bound
            self.view_changed.set()

    async def prepare_loop(self) -> None:
        """After each change of the view (a decision assumed, a graph update), once the loop has sent what
        the change published: the active policy's ``prepare`` (e.g. the learned policy's node features, node
        embeddings and actor tables), the work of a cluster change done once between pods instead of at the
        start of the next pod's decision; then, unless a pod or an update waits in the client's queues, its ``warm``
        (work ahead of need: the pair rows of the pod shapes seen most). Decisions are the same; both are
        optional."""
        done: tuple[object, object] = (None, None)  # (policy, state) last prepared: states are immutable
        while True:
            await self.view_changed.wait()
            self.view_changed.clear()
            for _ in range(PREPARE_YIELDS):
                await asyncio.sleep(0)
            policy, state = self.policy, self.view.state
            prepare = getattr(policy, "prepare", None)
            # a graph update that only confirms an assumed decision leaves the view's state as it was: no
            # second pass over the same state (its caches would find nothing changed, at ~0.1 ms a pod)
            if not callable(prepare) or state is None or (policy is done[0] and state is done[1]):
                continue
            done = (policy, state)
            try:
                prepare(state)
            except Exception:  # noqa: BLE001 - an optimisation: the next decision does the work itself
                self.rt.log.exception("policy %s: prepare failed", policy.name)
                continue
            # work ahead of need (``warm``: rows of the pod shapes likely next), right after ``prepare`` unless
            # messages wait in the client's queues (a pod, an update): then they go first and the next decision
            # computes its own rows. Yielding before ``warm`` to look for more was measured slower live
            warm = getattr(policy, "warm", None)
            if callable(warm) and not self.rt.backlog():
                try:
                    warm(state)
                except Exception:  # noqa: BLE001 - as prepare
                    self.rt.log.exception("policy %s: warm failed", policy.name)

    async def settle_when_warm(self) -> None:
        """Once the first full cluster view and the selected policy are in: out of full collections too (the
        view holds every node and bound pod: each full collection scanning them stalled the loop ~10 ms)."""
        await self.replica.ready.wait()
        await self.selection_loaded.wait()
        took = settle()
        self.rt.log.info("heap settled after the first view (%.0f ms)", 1000 * took)

    # cf. batch.DecisionOutbox, which resends (its pods are bound already); a loop decision is the bind order: not resent
    async def _publish(self, ctx: HandlerContext, decision: m.Decision, pod, policy: str, result: str) -> None:
        """Publish one decision to the DECISIONS stream and wait for its acknowledgement. A decision JetStream
        did not acknowledge is counted (``result="unpublished"``) and its assumption forgotten, so that the
        pod's next announcement is decided again (a copy that did reach the stream is refused as stale by the
        binder: the pod is no longer pending)."""
        try:
            await ctx.publish(subjects.decision(decision.cluster, decision.namespace), decision, js=True,
                              msg_id=decision.decision_id)
        except Exception as exc:  # noqa: BLE001 - NATS away, a timeout: the pod is announced again
            self.decisions.labels(policy=policy, mode=decision.mode, source="loop", result="unpublished").inc()
            self.rt.log.warning("decision %s for pod %s not acknowledged by JetStream (%s: %s); its assumption "
                                "is forgotten", decision.decision_id, pod.key, type(exc).__name__, exc)
            if decision.node and self.view.is_assumed(pod.key):
                self.view.forget(pod.key, decision.node)
            return
        self._decided(policy, decision.mode, "loop", result).inc()
        self._attempted(result, "agmarl").inc()

    async def flush_decisions(self, timeout: float = FLUSH_WAIT_S) -> None:
        """Wait (at shutdown) for the decisions still waiting for their acknowledgement."""
        if self._unacked:
            await asyncio.wait(list(self._unacked), timeout=timeout)


async def load_active_policy(rt: ServiceRuntime, app: InferenceApp) -> None:
    """Read the adaptive-engine's current selection from the KV store (absent -> keep the baseline)."""
    raw = await rt.bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
    if raw:
        app.select(m.decode(m.PolicySelection, raw))


async def log_unassisted(rt: ServiceRuntime, app: InferenceApp, extender, settings: InferenceSettings,
                         listening_at: float) -> None:
    """The decision log's catch-up (``catchup``), once the state-collector's events of the bindings made just
    before this process listened have landed (``CATCHUP_DELAY_S``); a NATS error is logged, never fatal."""
    await asyncio.sleep(CATCHUP_DELAY_S)

    async def publish(decision: m.Decision) -> None:
        await rt.publish(subjects.decision(decision.cluster, decision.namespace), decision, js=True,
                         msg_id=decision.decision_id)
        app.decisions.labels(policy="", mode=decision.mode, source=m.UNASSISTED, result="bound").inc()

    try:
        done = await catchup.catch_up(rt.bus, publish, settings.cluster, settings.extender_scheduler_names,
                                      settings.unlogged_lookback_seconds, listening_at, app.mode,
                                      known=app.view.schedulers, seen=lambda: extender.service.seen or set())
    except Exception as exc:  # noqa: BLE001 - the log stays without those entries; said so
        rt.log.warning("decision-log catch-up failed: %s: %s", type(exc).__name__, exc)
        return
    finally:
        extender.service.seen = None  # done: the extender stops recording the pods it is asked about
    rt.log.info("decision-log catch-up: %d pods bound by kube-scheduler without a decision of the services logged "
                "as unassisted (the last %.0f s: %d events and %d entries read back in %.2f s)", done.logged,
                settings.unlogged_lookback_seconds, done.events, done.entries, done.seconds)


async def main() -> int:
    settings = load_settings(InferenceSettings)
    rt = ServiceRuntime(SERVICE, settings)
    app = InferenceApp(rt, settings)
    rt.handle(subjects.pending(settings.cluster), m.PendingPod, queue=settings.pending_queue_group)(app.on_pending)
    rt.handle(subjects.graph(settings.cluster), m.GraphUpdate)(app.on_graph)
    rt.handle(subjects.policy_selection(), m.PolicySelection)(app.on_policy)
    rt.handle(subjects.model_published(), m.ModelPublished)(app.on_model_published)
    rt.health_details = lambda: {"policy": app.policy.name, "model_version": app.model_version,
                                 **app.models.details(), **app.replica.details()}
    extender = setup_extender(rt, app, settings, app.view, decisions=app.decisions)
    app.replica.bound_listeners.append(extender.service.observed)  # held extender decisions learn their binding
    if settings.batch_scheduler_name:
        start_batch_mode(rt, settings, policy=lambda: app.policy, view=app.view)
    rt.on_stop(app.flush_decisions)
    app.selection_loaded.clear()  # graph requests that arrive from now on wait for the KV selection
    await rt.start()
    try:
        await rt.bus.ensure_streams()
        try:
            await load_active_policy(rt, app)
        except Exception as exc:  # noqa: BLE001 - no KV yet is normal at first start
            rt.log.info("no active policy in KV yet (%s); using %s", exc, app.policy.name)
        if settings.pinned_policy:
            app.select(m.PolicySelection(policy=settings.pinned_policy, reason="pinned (AGMARL_PINNED_POLICY)",
                                         time=time.time()))
    finally:
        if not settings.pinned_policy:
            app.selection_loaded.set()
    app.replica.request_sync("start")
    rt.spawn(app.replica.expire_loop(), name="assumed-expiry")
    rt.spawn(app.prepare_loop(), name="policy-prepare")
    await app.models.start(settings.initial_policy)
    if await start_extender(rt, extender, settings):
        rt.spawn(log_unassisted(rt, app, extender, settings, time.time()), name="decision-log catch-up")
    # Everything that exists now (modules, FastAPI, pydantic schemas, OTel, NATS) lives as long as the
    # process: out of full collections, a gen-2 pause scans only newer objects (40-120 ms -> a few ms); the
    # cluster view and the policy's model follow once they are in (settle_when_warm)
    settle()
    rt.spawn(app.settle_when_warm(), name="heap-settle")
    return await rt.run_until_stopped()
