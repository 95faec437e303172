"""Batch mode, the I/O shell: the second scheduler (``schedulerName: agmarl-batch-scheduler``) places its
pending pods a batch at a time and creates their Bindings with the official ``kubernetes`` client, in a
process of its own (``bindworker``: the Bindings' HTTP takes about as much CPU as deciding, and this process
decides on one GIL).

Inputs from the bus: ``PendingPod`` (published by the state-collector for pods naming the batch
scheduler) and ``ClusterSnapshot`` (the state decisions start from). A batch closes after
``window_s`` or ``max_pods`` pods; ``batchcore.decide_batch`` places it jointly; every placement is
bound through ``pods/{name}/binding`` (names Kubernetes would refuse are marked gone first, without a
request). Decisions start from the process's ``ClusterView`` (the one every
decider shares); bound placements stay assumed in it until the collector reports them (kube-scheduler's
assume cache), so the next batch, the loop and the extender cannot over-commit.

Failures never lose a pod (``batchcore.Ledger``): an API error or timeout is retried on the same
node with exponential backoff up to ``bind_attempts`` times, then the placement is released and the
pod queued again for a fresh decision; a 409 Conflict releases at once; 404 marks it gone. A pod
with no feasible node stays pending (``unschedulable`` with kube-scheduler's reason) and is tried
again after ``retry_s``. A ``Decision`` (source "batch") is published for each bound pod, each
release and each new unschedulable reason, pipelined (``DecisionOutbox``: sent at once, every PubAck
confirmed, a lost or refused one sent again with the same ``Nats-Msg-Id``, then counted).

Hooked into the inference app with ``start_batch_mode(rt, settings)`` only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import Counter, Gauge

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import trace_headers
from agmarl_common.core.cluster.model import ClusterState, pod_from_dict, state_from_dict
from agmarl_common.core.cluster.view import ClusterView
from agmarl_common.core.cluster.specs import AGMARL_BATCH_SCHEDULER
from agmarl_common.kube.client import load_api_client
from agmarl_common.kube.names import InvalidName, check_name
from agmarl_common.core.policies.base import Policy
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_inference.batchcore import Ledger, Placement, decide_batch
from agmarl_inference.bindworker import BindWorker, Hello


@dataclass(frozen=True)
class BatchConfig:
    scheduler_name: str = AGMARL_BATCH_SCHEDULER
    window_s: float = 0.2  # a batch closes this long after its first pod ...
    # ... or when it has this many: only a backlog fills it (at under max_pods / window_s pods a second the
    # window closes first). Larger batches decide more pods a second (identical pods scored once, one graph
    # per batch; docs/performance.md "Batch mode"), at the cost of a longer hold of the event loop per batch
    # (~150 ms for 256 pods on 1,523 nodes with the learned policy)
    max_pods: int = 256
    bind_attempts: int = 3  # tries per placement before it is released
    bind_backoff_s: float = 0.2  # wait before retry k: bind_backoff_s * 2**(k-1)
    bind_timeout_s: float = 5.0  # per Binding request
    bind_threads: int = 8  # Bindings in flight at once in the bind worker process
    retry_s: float = 2.0  # released / unschedulable pods wait this long before the next batch
    publish_attempts: int = 3  # sends of a Decision (same Nats-Msg-Id) before it is counted unpublished
    publish_timeout_s: float = 5.0  # a Decision's PubAck is awaited this long, then it is sent again
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


@dataclass
class Outgoing:
    """One Decision on its way into the DECISIONS stream."""
    subject: str
    payload: bytes
    headers: dict[str, str]  # trace context of its span, kind, Nats-Msg-Id (the decision id)
    pod_key: str
    decision_id: str
    sends: int = 0


# cf. app.InferenceApp._publish, which gives up (assumption forgotten, pod decided again); these record Bindings made
class DecisionOutbox:
    """The binder's Decisions on JetStream, pipelined: each is sent as soon as it is made
    (``publish_async``, no wait for the previous one's PubAck) and every PubAck is confirmed here. One
    refused, not acked within ``timeout`` s or not sent is sent again with the same ``Nats-Msg-Id``
    (JetStream stores it once) after ``backoff * 2**(k-1)`` s, up to ``attempts`` sends; then it is
    logged and counted ``decision_unpublished``. Only an acked Decision counts ``decision_published``."""

    def __init__(self, rt: ServiceRuntime, results: Counter, attempts: int, timeout: float, backoff: float):
        self.rt, self.results, self.attempts, self.timeout, self.backoff = rt, results, attempts, timeout, backoff
        self.pending: dict[asyncio.Future, tuple[Outgoing, float]] = {}  # sent, PubAck not in yet -> deadline
        self.resends: set[asyncio.Task] = set()  # waiting for their backoff
        self._sweeper: asyncio.Task | None = None

    async def send(self, out: Outgoing) -> None:
        """Send ``out`` (returns once it is on the connection; the PubAck is confirmed in the background)."""
        out.sends += 1
        try:
            # no wait_stall: past 4,000 unacked sends this waits for a slot (the sweeper frees overdue ones)
            ack = await self.rt.bus.js.publish_async(out.subject, out.payload, headers=out.headers)
        except Exception as exc:  # noqa: BLE001 - disconnected, too many unacked, ...: sent again or counted
            self._failed(out, exc)
            return
        loop = asyncio.get_running_loop()
        self.pending[ack] = (out, loop.time() + self.timeout)
        ack.add_done_callback(partial(self._settle, out))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = loop.create_task(self._sweep(), name="batch-decision-acks")

    def _settle(self, out: Outgoing, ack: asyncio.Future) -> None:
        self.pending.pop(ack, None)
        exc = TimeoutError(f"no PubAck within {self.timeout}s") if ack.cancelled() else ack.exception()
        if exc is not None:
            self._failed(out, exc)
            return
        self.results.labels(result="decision_published").inc()
        self.rt.metrics.on_published(out.subject)

    def _failed(self, out: Outgoing, exc: BaseException) -> None:
        if out.sends < self.attempts:
            task = asyncio.get_running_loop().create_task(self._resend(out))
            self.resends.add(task)
            task.add_done_callback(self.resends.discard)
            return
        self.results.labels(result="decision_unpublished").inc()
        self.rt.log.warning("decision %s for pod %s not published after %d sends: %s: %s", out.decision_id,
                            out.pod_key, out.sends, type(exc).__name__, exc)

    async def _resend(self, out: Outgoing) -> None:
        await asyncio.sleep(self.backoff * 2 ** (out.sends - 1))
        await self.send(out)

    async def _sweep(self) -> None:
        """Cancel the sends whose PubAck is overdue (``_settle`` then sends them again). ``pending`` is in
        send order, so its first entry has the earliest deadline."""
        loop = asyncio.get_running_loop()
        while self.pending:
            ack, (_, deadline) = next(iter(self.pending.items()))
            if deadline > loop.time():
                await asyncio.sleep(deadline - loop.time())
                continue
            ack.cancel()
            self.pending.pop(ack, None)

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every Decision sent so far is acked or counted unpublished."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (self.pending or self.resends) and (left := deadline - loop.time()) > 0:
            await asyncio.wait([*self.pending, *self.resends], timeout=left)

    def close(self) -> None:
        for task in [*self.resends, self._sweeper]:
            if task is not None:
                task.cancel()


class BatchBinder:
    def __init__(self, rt: ServiceRuntime, cfg: BatchConfig, cluster: str, hello: Hello,
                 policy: Callable[[], Policy], clock: Callable[[], float] = time.time, view: ClusterView | None = None):
        self.rt, self.cfg, self.cluster, self.policy, self.clock = rt, cfg, cluster, policy, clock
        self.ledger = Ledger()
        # the shared cluster view (inference's replica); alone (tests) the binder keeps its own from snapshots
        self.own_view = view is None
        self.view = view if view is not None else ClusterView(assume_ttl=cfg.assume_ttl_s)
        self.snapshot_time = 0.0
        self.contexts: dict[str, otel_context.Context] = {}  # pod key -> trace of its PendingPod
        self.wake = asyncio.Event()
        self.inflight: set[asyncio.Task] = set()
        self.batches = 0
        self.loop_task: asyncio.Task | None = None  # run(), once start_batch_mode started it
        self._published_reason: dict[str, str] = {}
        reg = rt.registry
        self.results = Counter("agmarl_batch_bindings_total", "Batch binder outcomes", ["result"], registry=reg)
        self.ledger_gauge = Gauge("agmarl_batch_ledger_pods", "Pods in the batch ledger by status", ["status"],
                                  registry=reg)
        self.outbox = DecisionOutbox(rt, self.results, cfg.publish_attempts, cfg.publish_timeout_s,
                                     cfg.bind_backoff_s)
        self.worker_restarts = Counter("agmarl_batch_bind_worker_restarts_total",
                                       "Bind worker processes that ended unexpectedly and were started again",
                                       registry=reg)
        self.worker = BindWorker(hello, rt.log, on_restart=lambda code: self.worker_restarts.inc())

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
        """Start the bind worker (raises if it cannot start), then forever: wait for due pods, let the window
        fill, decide the batch, start its bindings."""
        await self.worker.start()
        while True:
            if self.state is not None and self.ledger.n_due(self.clock()):
                await self._fill_window()
                await self.run_batch()
                await asyncio.sleep(0)  # one turn of the loop: answers, Decisions and new pods get in
                continue
            await self._idle()

    async def _fill_window(self) -> None:
        """Let the batch fill: until ``window_s`` passed or ``max_pods`` pods are due."""
        deadline = time.monotonic() + self.cfg.window_s
        while self.ledger.n_due(self.clock()) < self.cfg.max_pods:
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
        due = self.ledger.next_due()
        timeout = max(0.01, due - self.clock()) if due is not None and self.state is not None else None
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
        before = self.decision_state()
        placements, after = decide_batch(pods, before, policy)
        # assumed at once, before any await: the view takes the arbiter's final state (no second bind per pod)
        placed = [(pl.pod, pl.node, tuple(pl.gpus)) for pl in placements if pl.node]
        if not self.view.assume_decided(before, after, placed, now):
            for pod, node, gpus in placed:
                self.view.assume(pod, node, gpus, now)
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
            if (bad := invalid_name(pl)) is not None:  # the API server would refuse it on every try
                self._give_up(key, "gone", bad)
                continue
            first = self.worker.submit(pl.pod.namespace, pl.pod.name, pl.node)
            task = asyncio.get_running_loop().create_task(self._bind(pl, policy, batch_id, len(placements), first))
            self.inflight.add(task)
            task.add_done_callback(self.inflight.discard)
        self.worker.flush()  # the batch's Bindings leave now, while the next batch is decided
        self._update_gauge()
        return placements

    async def _bind(self, pl: Placement, policy: Policy, batch_id: str, size: int, first: asyncio.Future) -> None:
        """Follow the Binding of ``pl`` (``first``: its first request, already asked of the bind worker) to its
        end: bound, retried, released or gone."""
        key, ns, name = pl.pod.key, pl.pod.namespace, pl.pod.name
        request: asyncio.Future | None = first
        try:
            while True:
                try:
                    if request is None:
                        request = self.worker.submit(ns, name, pl.node)
                    answer, request = request, None
                    BindWorker.check(await answer)  # posted by the bind worker process
                except ApiException as exc:
                    why = f"HTTP {exc.status} {exc.reason}".strip()
                    if exc.status == 404:
                        self._give_up(key, "gone", why)
                        return
                    if exc.status == 409:  # conflict: someone else bound it, or it changed: decide afresh
                        self._give_up(key, "release", f"conflict: {why}")
                        await self._publish(pl, policy, batch_id, size, 1, f"binding conflict: {why}", released=True)
                        return
                except Exception as exc:  # noqa: BLE001 - timeouts, connection errors, WorkerGone
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
        """The Binding was accepted: the pod is bound whatever happens next. Its Decision is handed to the
        outbox (sent again until acked, then counted); one that cannot be published (JetStream slow or
        down) is logged and counted, never taken for a failed binding (that retried a Binding the API had
        accepted, got 409 and released a bound pod)."""
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
        # the decision's span, a child of the pod's announcement, current while its headers are made (a plain
        # start_span and attach, as the runtime's handlers do: no generator-based context managers per pod)
        parent = self.contexts.get(pod.key, otel_context.get_current())
        span = self.rt.tracer.start_span("inference batch_decision", context=parent, attributes={
            "agmarl.pod": pod.key, "agmarl.node": node, "agmarl.batch": batch_id})
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
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
            out = Outgoing(subjects.decision(self.cluster, pod.namespace), m.encode(decision),
                           trace_headers(decision, None, decision.decision_id), pod.key, decision.decision_id)
        finally:
            otel_context.detach(token)
            span.end()
        await self.outbox.send(out)

    async def stop(self) -> None:
        """Stop deciding; let the Bindings in flight finish (at most ``bind_timeout_s``: their pods end bound or
        released as the API answers), cancel what is left (those pods go back to the queue: never lost), end
        the bind worker once it answered what it holds, then wait for the PubAcks of the Decisions already sent
        (at most ``publish_timeout_s``). Runs at the service's shutdown (``rt.on_stop``); calling it again does
        nothing more."""
        if self.loop_task is not None:
            self.loop_task.cancel()
        if self.inflight:
            await asyncio.wait(list(self.inflight), timeout=self.cfg.bind_timeout_s)
        for task in list(self.inflight):
            task.cancel()
        if self.inflight:
            await asyncio.wait(list(self.inflight), timeout=5.0)
        await self.worker.close(self.cfg.bind_timeout_s)
        await self.outbox.drain(self.cfg.publish_timeout_s)
        self.outbox.close()


def invalid_name(pl: Placement) -> str | None:
    """Why Kubernetes would refuse a Binding of ``pl`` (its namespace, pod or node name), or None."""
    try:
        check_name("namespace", pl.pod.namespace)
        check_name("pod", pl.pod.name)
        check_name("node", pl.node)
    except InvalidName as exc:
        return str(exc)
    return None


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
    # the bind worker posts the Bindings with this client's configuration, or loads the client itself from the
    # same source (loaded here first, so that missing credentials fail the service's start)
    configuration = api_client.configuration if api_client is not None else None
    if api_client is None:
        load_api_client(cfg.kubeconfig, cfg.kube_context).close()
    hello = Hello(configuration, cfg.kubeconfig, cfg.kube_context, cfg.bind_threads, cfg.bind_timeout_s)
    binder = BatchBinder(rt, cfg, settings.cluster, hello, policy, view=view)
    rt.handle(subjects.pending(settings.cluster), m.PendingPod, queue="inference-batch")(binder.on_pending)
    rt.handle(subjects.snapshot(settings.cluster), m.ClusterSnapshot)(binder.on_snapshot)
    binder.loop_task = rt.spawn(binder.run(), name="batch-binder")
    rt.on_stop(binder.stop)
    return binder
