"""Batch mode, the I/O shell: the second scheduler (``schedulerName: agmarl-batch-scheduler``) places its
pending pods a batch at a time and creates their Bindings with the official ``kubernetes`` client.

Inputs from the bus: ``PendingPod`` (published by the state-collector for pods naming the batch
scheduler) and ``ClusterSnapshot`` (the state decisions start from). A batch closes after
``window_s`` or ``max_pods`` pods; ``batchcore.decide_batch`` places it jointly; every placement is
bound through ``pods/{name}/binding``. Decisions start from the process's ``ClusterView`` (the one every
decider shares); bound placements stay assumed in it until the collector reports them (kube-scheduler's
assume cache), so the next batch, the loop and the extender cannot over-commit.

Failures never lose a pod (``batchcore.Ledger``): an API error or timeout is retried on the same
node with exponential backoff up to ``bind_attempts`` times, then the placement is released and the
pod queued again for a fresh decision; a 409 Conflict releases at once; 404 marks it gone. A pod
with no feasible node stays pending (``unschedulable`` with kube-scheduler's reason) and is tried
again after ``retry_s``. A ``Decision`` (source "batch") is published for each bound pod, each
release and each new unschedulable reason.

Hooked into the inference app with ``start_batch_mode(rt, settings)`` only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import Counter, Gauge

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.core.cluster.model import ClusterState, pod_from_dict, state_from_dict
from agmarl_common.core.cluster.view import ClusterView
from agmarl_common.core.cluster.specs import AGMARL_BATCH_SCHEDULER
from agmarl_common.kube.client import load_api_client
from agmarl_common.core.policies.base import Policy
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_inference.batchcore import Ledger, Placement, decide_batch


@dataclass(frozen=True)
class BatchConfig:
    scheduler_name: str = AGMARL_BATCH_SCHEDULER
    window_s: float = 0.2  # a batch closes this long after its first pod ...
    max_pods: int = 64  # ... or when it has this many
    bind_attempts: int = 3  # tries per placement before it is released
    bind_backoff_s: float = 0.2  # wait before retry k: bind_backoff_s * 2**(k-1)
    bind_timeout_s: float = 5.0  # per Binding request
    retry_s: float = 2.0  # released / unschedulable pods wait this long before the next batch
    assume_ttl_s: float = 30.0  # forget an assumed binding the snapshots never confirmed
    kubeconfig: str = ""  # empty = $KUBECONFIG, else in-cluster, else ~/.kube/config (agmarl_common.kube.client)
    kube_context: str = ""  # empty = the kubeconfig's current context
    mode: str = "full"

    @classmethod
    def from_settings(cls, settings: Any) -> "BatchConfig":
        """``batch_<field>`` settings (and ``batch_scheduler_name``, ``kubeconfig``, ``kube_context``, ``rollout_mode``)
        where the settings object has them; defaults otherwise."""
        data = settings.model_dump()
        out: dict[str, Any] = {}
        for f in fields(cls):
            for name in (f"batch_{f.name}", f.name):
                if data.get(name) not in (None, ""):
                    out[f.name] = data[name]
                    break
        if data.get("rollout_mode"):
            out["mode"] = data["rollout_mode"]
        return cls(**out)


def create_binding(api: client.CoreV1Api, namespace: str, name: str, node: str, timeout: float) -> None:
    """POST pods/{name}/binding; raises ApiException on a non-2xx answer. The raw response is
    read rather than deserialized: the API answers a ``Status``, and this client's ``V1Binding``
    deserialization then fails ("target" missing, the old ``ValueError: Invalid value for
    `target```) although the pod was bound -- that error is treated as success if it appears."""
    body = client.V1Binding(api_version="v1", kind="Binding",
                            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
                            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node))
    try:
        resp = api.create_namespaced_pod_binding(name=name, namespace=namespace, body=body,
                                                 _preload_content=False, _request_timeout=timeout)
        resp.read()
        resp.release_conn()
    except ApiException:
        raise
    except ValueError as exc:
        if "target" not in str(exc):
            raise


class BatchBinder:
    def __init__(self, rt: ServiceRuntime, cfg: BatchConfig, cluster: str, api: client.CoreV1Api,
                 policy: Callable[[], Policy], clock: Callable[[], float] = time.time, view: ClusterView | None = None):
        self.rt, self.cfg, self.cluster, self.api, self.policy, self.clock = rt, cfg, cluster, api, policy, clock
        self.ledger = Ledger()
        # the shared cluster view (inference's replica); alone (tests) the binder keeps its own from snapshots
        self.own_view = view is None
        self.view = view if view is not None else ClusterView(assume_ttl=cfg.assume_ttl_s)
        self.snapshot_time = 0.0
        self.contexts: dict[str, otel_context.Context] = {}  # pod key -> trace of its PendingPod
        self.wake = asyncio.Event()
        self.inflight: set[asyncio.Task] = set()
        self.batches = 0
        self._published_reason: dict[str, str] = {}
        reg = rt.registry
        self.results = Counter("agmarl_batch_bindings_total", "Batch binder outcomes", ["result"], registry=reg)
        self.ledger_gauge = Gauge("agmarl_batch_ledger_pods", "Pods in the batch ledger by status", ["status"],
                                  registry=reg)

    # --- inputs ---------------------------------------------------------------------------------

    async def on_pending(self, msg: m.PendingPod, ctx: HandlerContext) -> None:
        if msg.cluster != self.cluster:
            return
        pod = pod_from_dict(msg.pod)
        if pod.scheduler_name != self.cfg.scheduler_name or pod.node_name:
            return
        if self.ledger.offer(pod, msg.seen_at):
            self.contexts[pod.key] = trace.set_span_in_context(ctx.span)
            self.wake.set()

    async def on_snapshot(self, msg: m.ClusterSnapshot, ctx: HandlerContext) -> None:
        if msg.cluster != self.cluster:
            return
        if self.own_view:
            self.view.apply_snapshot(msg.epoch, msg.seq, state_from_dict(msg.state))
        self.snapshot_time = msg.time
        self.reconcile({p.get("namespace", "default") + "/" + p["name"] for p in msg.pending}, msg.time)
        self.wake.set()

    def reconcile(self, pending: set[str], at: float) -> None:
        """Snapshot at collector time ``at``: queued pods announced before ``at`` that it neither lists
        pending nor bound are gone (the view confirms or expires assumed bindings itself)."""
        if self.state is None:
            return
        bound = self.view.where
        if self.own_view:
            self.view.expire(self.clock())
        for key in self.ledger.with_status("queued") + self.ledger.with_status("unschedulable"):
            e = self.ledger.entries[key]
            if e.seen_at <= at and key not in pending:
                self.ledger.gone(key, "bound elsewhere" if key in bound else "no longer pending")
                self.contexts.pop(key, None)

    @property
    def state(self) -> ClusterState | None:
        return self.view.state

    def decision_state(self) -> ClusterState:
        """The cluster view: observed bindings plus the ones assumed since (this binder's and others')."""
        assert self.state is not None
        return self.state

    # --- the loop -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Forever: wait for due pods, let the window fill, decide the batch, start its bindings."""
        while True:
            if self.state is not None and self.ledger.due(self.clock(), 1):
                await self._fill_window()
                await self.run_batch()
                continue
            await self._idle()

    async def _fill_window(self) -> None:
        """Let the batch fill: until ``window_s`` passed or ``max_pods`` pods are due."""
        deadline = time.monotonic() + self.cfg.window_s
        while len(self.ledger.due(self.clock(), self.cfg.max_pods)) < self.cfg.max_pods:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=left)
            except TimeoutError:
                return

    async def _idle(self) -> None:
        """Nothing due: wait for new input, or until the earliest waiting pod is due."""
        waits = [e.not_before for e in self.ledger.entries.values() if e.status in ("queued", "unschedulable")]
        timeout = max(0.01, min(waits) - self.clock()) if waits and self.state is not None else None
        self.wake.clear()
        try:
            await asyncio.wait_for(self.wake.wait(), timeout=timeout)
        except TimeoutError:
            pass

    async def run_batch(self) -> list[Placement]:
        """Decide every due pod (up to ``max_pods``) jointly and start their bindings."""
        now = self.clock()
        pods = self.ledger.due(now, self.cfg.max_pods)
        if not pods or self.state is None:
            return []
        self.batches += 1
        batch_id = f"{self.batches}-{int(now * 1000)}"
        policy = self.policy()
        placements, _ = decide_batch(pods, self.decision_state(), policy)
        for pl in placements:
            key = pl.pod.key
            if not pl.node:
                self.ledger.unschedulable(key, pl.reason, now + self.cfg.retry_s)
                self.results.labels(result="unschedulable").inc()
                if self._published_reason.get(key) != pl.reason:
                    self._published_reason[key] = pl.reason
                    await self._publish(pl, policy, batch_id, len(placements), 0, pl.reason)
                continue
            self.ledger.binding(key, pl.node)
            self.view.assume(pl.pod, pl.node, tuple(pl.gpus), now)
            task = asyncio.get_running_loop().create_task(self._bind(pl, policy, batch_id, len(placements)))
            self.inflight.add(task)
            task.add_done_callback(self.inflight.discard)
        self._update_gauge()
        return placements

    async def _bind(self, pl: Placement, policy: Policy, batch_id: str, size: int) -> None:
        key, ns, name = pl.pod.key, pl.pod.namespace, pl.pod.name
        try:
            while True:
                try:
                    await asyncio.to_thread(create_binding, self.api, ns, name, pl.node, self.cfg.bind_timeout_s)
                except ApiException as exc:
                    why = f"HTTP {exc.status} {exc.reason}".strip()
                    if exc.status == 404:
                        self._give_up(key, "gone", why)
                        return
                    if exc.status == 409:  # conflict: someone else bound it, or it changed: decide afresh
                        self._give_up(key, "release", f"conflict: {why}")
                        await self._publish(pl, policy, batch_id, size, 1, f"binding conflict: {why}", released=True)
                        return
                except Exception as exc:  # noqa: BLE001 - timeouts and connection errors come in many types
                    why = f"{type(exc).__name__}: {exc}"
                else:
                    await self._bound(pl, policy, batch_id, size)
                    return
                attempts = self.ledger.attempt_failed(key, why)
                if attempts >= self.cfg.bind_attempts:
                    reason = f"binding failed {attempts} times (last: {why})"
                    self._give_up(key, "release", reason)
                    await self._publish(pl, policy, batch_id, size, attempts, reason, released=True)
                    return
                await asyncio.sleep(self.cfg.bind_backoff_s * 2 ** (attempts - 1))
        except asyncio.CancelledError:
            if self.ledger.entries[key].status == "binding":
                self._give_up(key, "release", "binder stopped")
            raise

    async def _bound(self, pl: Placement, policy: Policy, batch_id: str, size: int) -> None:
        """The Binding was accepted: the pod is bound whatever happens next. A Decision that cannot be
        published (JetStream slow or down) is logged and counted, never taken for a failed binding (that
        retried a Binding the API had accepted, got 409 and released a bound pod)."""
        key = pl.pod.key
        self.ledger.bound(key)
        self.results.labels(result="bound").inc()
        try:
            await self._publish(pl, policy, batch_id, size, self.ledger.entries[key].attempts + 1, "")
        except Exception as exc:  # noqa: BLE001 - NATS timeouts and disconnects come in many types
            self.results.labels(result="decision_unpublished").inc()
            self.rt.log.warning("pod %s bound to %s, its decision not published: %s: %s", key, pl.node,
                                type(exc).__name__, exc)
        self._published_reason.pop(key, None)
        self.contexts.pop(key, None)

    def _give_up(self, key: str, how: str, reason: str) -> None:
        self.view.forget(key)
        if how == "gone":
            self.ledger.gone(key, reason)
            self.results.labels(result="gone").inc()
        else:
            self.ledger.release(key, reason, self.clock() + self.cfg.retry_s)
            self.results.labels(result="released").inc()
            self.wake.set()
        self._update_gauge()

    def _update_gauge(self) -> None:
        for status, n in self.ledger.counts().items():
            self.ledger_gauge.labels(status=status).set(n)

    async def _publish(self, pl: Placement, policy: Policy, batch_id: str, size: int, attempts: int, reason: str,
                       released: bool = False) -> None:
        pod = pl.pod
        node = "" if released else pl.node
        e = self.ledger.entries[pod.key]
        token = otel_context.attach(self.contexts.get(pod.key, otel_context.get_current()))
        try:
            with self.rt.tracer.start_as_current_span("inference batch_decision") as span:
                span.set_attribute("agmarl.pod", pod.key)
                span.set_attribute("agmarl.node", node)
                span.set_attribute("agmarl.batch", batch_id)
                sc = span.get_span_context()
                decision = m.Decision(
                    decision_id=m.new_id(), cluster=self.cluster, namespace=pod.namespace, pod_key=pod.key,
                    node=node, gpus=list(pl.gpus) if node else [], policy=policy.name, mode=self.cfg.mode,
                    score=pl.score if node else 0.0, scores=pl.scores,
                    explanation={"batch_id": batch_id, "batch_size": size, "order": pl.order, "rank": pl.rank,
                                 "proposed_node": pl.node, "bind_attempts": attempts, "releases": e.releases,
                                 "reason": reason or pl.reason},
                    trace_id=format(sc.trace_id, "032x") if sc.is_valid else "", seen_at=e.seen_at,
                    decided_at=self.clock(), source="batch")
                await self.rt.publish(subjects.decision(self.cluster, pod.namespace), decision, js=True,
                                      msg_id=decision.decision_id)
        finally:
            otel_context.detach(token)

    async def stop(self) -> None:
        """Cancel bindings in flight; their pods go back to the queue (never lost)."""
        for task in list(self.inflight):
            task.cancel()
        if self.inflight:
            await asyncio.wait(list(self.inflight), timeout=5.0)


def start_batch_mode(rt: ServiceRuntime, settings: Any, policy: Callable[[], Policy] | None = None,
                     api_client: client.ApiClient | None = None, cfg: BatchConfig | None = None,
                     view: ClusterView | None = None) -> BatchBinder:
    """Subscribe the batch binder to pending pods and snapshots and start its loop (call in main()
    after building the runtime, before or after ``rt.start()``). ``policy`` returns the policy to
    score with (e.g. ``lambda: app.policy``); default: ``settings.baseline_policy``."""
    cfg = cfg or BatchConfig.from_settings(settings)
    if policy is None:
        fixed = get_policy(settings.baseline_policy)
        policy = lambda: fixed  # noqa: E731
    api = client.CoreV1Api(api_client or load_api_client(cfg.kubeconfig, cfg.kube_context))
    binder = BatchBinder(rt, cfg, settings.cluster, api, policy, view=view)
    rt.handle(subjects.pending(settings.cluster), m.PendingPod, queue="inference-batch")(binder.on_pending)
    rt.handle(subjects.snapshot(settings.cluster), m.ClusterSnapshot)(binder.on_snapshot)
    rt.spawn(binder.run(), name="batch-binder")
    return binder
