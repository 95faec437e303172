"""The kube-scheduler HTTP extender: filter, prioritize, bind (and preempt passthrough).

The wire format is ``extender_wire`` (always HTTP 200 for a well-formed request), the pure decision
core (scores, blend, explanations, filter reasons) ``extender_scoring``, the cluster view
``extender_view``, the decision log ``extender_log``, the HTTP routes ``extender_routes``; this module
is the service between them.

Two cache modes: with ``nodeCacheCapable`` the request names nodes only (``NodeNames``) and the node
objects and their bound pods come from the process's ``ClusterView`` (graph-builder's graph plus assumed
decisions); otherwise the request carries a v1.NodeList and the view contributes only the pods bound to
those nodes.

Every answer is made within ``extender_budget_ms``: the state and default scores run on one thread
pool, the active policy on another; whatever is late or failing is replaced (default scores for a
slow/failed model or NATS down; the nodes passed through unchanged for a slow filter) and counted in
``agmarl_extender_fallbacks_total{reason}``. A filter that rejects every node becomes a Decision
(source "extender") in the decision log at once, published off the request path.

Between snapshots the extender accounts for its own choices, as kube-scheduler's cache does: each
prioritize *assumes* its chosen node in the shared ``ClusterView`` (the pod's resources are taken at
once, so the next pod sees them); the bind verb, when kube-scheduler's configuration enables it,
confirms the node kube-scheduler actually chose (moving the assumption); the binding the watch
observes (a ``bound`` change in graph-builder's updates) corrects it; an assumption never confirmed
expires (``assume_ttl``). The scored decision is held (``pending``, by pod) until the binding is
known and then published with ``bound_node`` (and ``node``) set to where the pod went, the
extender's own choice in ``explanation.extender_choice``; one never bound is published after
``assume_ttl`` without ``bound_node``. The verbs of one pod share one trace: the first verb's span
(by pod uid) is the parent of the later verbs' spans and of the decision's publish span.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry, Counter, Histogram

from agmarl_common.kube import convert as kc
from agmarl_common.runtime import messages as m
from agmarl_common.core.cluster.filters import feasible_mask
from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.cluster.selectors import matches_label_selector
from agmarl_common.core.cluster.view import ClusterView
from agmarl_common.core.policies.base import Policy, admission_reason, admitted
from agmarl_common.core.policies.kube import WeightedPluginsPolicy
from agmarl_common.runtime.telemetry import extract
from agmarl_inference.extender_log import DecisionPublisher
from agmarl_inference.extender_scoring import (
    Scored,
    blend_weights,
    explain,
    failed_reasons,
    failure,
    returned_kind,
    score_policy,
    to_extender_scores,
)
from agmarl_inference.extender_wire import (
    NEUTRAL_SCORE,
    BadRequest,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
    NodeList,
    Priorities,
    request_names,
)
from agmarl_inference.extender_view import RequestState, request_state
from agmarl_inference.settings import InferenceSettings

log = logging.getLogger("agmarl.inference.extender")

MODES = ("shadow", "recommend", "canary", "hybrid", "full")
UNKNOWN_NODE = "node unknown to the agmarl extender's cluster cache"
INLINE_STATE_NODES = 2_000  # requests naming at most this many nodes are judged on the event loop (below)
INLINE_MODEL_MS = 10.0  # a policy whose last scoring took at most this scores a small request on the event loop
LOGGED_SCORES = 128  # a decision logs the scores of its best nodes (and the chosen and bound ones) up to this
MAX_PENDING = 4_096  # scored decisions awaiting their binding (~30 s at kube-scheduler's rate with a slow
# watch); beyond this the oldest is published without its binding
MAX_TRACES = 10_000  # pod uid -> the context of its first verb's span
EXPLAIN_TIMEOUT_S = 10.0  # waiting for a decision's explanation when its entry is built (it was started long before)
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 5.0)


# ---------------------------------------------------------------------------------------------
# What the extender needs from the service

class PolicySource(Protocol):
    """The inference app: active policy, default scoring, model version and rollout mode."""

    policy: Policy
    default: Policy
    model_version: str
    mode: str

    def set_mode(self, mode: str, reason: str) -> None: ...


class Binder(Protocol):
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


@dataclass
class PendingDecision:
    """A decision waiting for its binding (published then, with ``bound_node``)."""

    pod: Pod
    node: str  # the extender's choice (assumed in the view); "" for a neutral answer
    build: Callable[[str], m.Decision]  # bound node -> the decision
    ctx: Any  # OpenTelemetry context of the pod's trace
    at: float  # time.time() of the answer
    cheap: bool = True  # no model explanation to compute: built on the event loop


def with_binding(decision: m.Decision, node: str, how: str) -> m.Decision:
    """The decision as logged once the binding is known (``how``: bind | watch | snapshot) or given up
    (``node`` "", ``how`` the reason): ``bound_node`` and ``node`` are where the pod went; the extender's
    own choice stays in ``explanation.extender_choice``."""
    decision.explanation["extender_choice"] = decision.node
    decision.explanation["binding"] = how
    if node:
        decision.bound_node = node
        decision.node = node
        decision.score = decision.scores.get(node, decision.score)
    return decision


# ---------------------------------------------------------------------------------------------
# The service

class CandidateNames(Sequence[str]):
    """The names of a decision's candidates (``cand``: indexes into ``state.nodes``), looked up when read: a log
    entry reads the names of its logged nodes only (at most ``LOGGED_SCORES``), not of every candidate."""

    def __init__(self, state: ClusterState, cand: np.ndarray):
        self.nodes, self.where, self.cand = state.nodes, state.index, cand

    def __len__(self) -> int:
        return len(self.cand)

    def __getitem__(self, k):  # noqa: ANN001, ANN204 - an int, or a slice (a list)
        if isinstance(k, slice):
            return [self.nodes[i].name for i in self.cand[k].tolist()]
        return self.nodes[int(self.cand[k])].name

    def _positions(self, name: object) -> np.ndarray:
        i = self.where.get(name) if isinstance(name, str) else None
        return np.flatnonzero(self.cand == i) if i is not None else np.zeros(0, np.int64)

    def index(self, name: object, start: int = 0, stop: int | None = None) -> int:
        hits = self._positions(name)
        hits = hits[(hits >= start) & (hits < (len(self) if stop is None else stop))]
        if not hits.size:
            raise ValueError(f"{name!r} is not a candidate")
        return int(hits[0])

    def __contains__(self, name: object) -> bool:
        return bool(self._positions(name).size)


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry, decisions: Counter | None = None):
        self.duration = Histogram("agmarl_extender_request_duration_seconds", "Extender request wall time",
                                  ["verb"], buckets=DURATION_BUCKETS, registry=registry)
        self.fallbacks = Counter("agmarl_extender_fallbacks", "Extender answers that fell back",
                                 ["reason"], registry=registry)
        self.rejected = Counter("agmarl_extender_rejected_requests", "Extender requests answered 400/413",
                                ["verb", "reason"], registry=registry)
        self.dropped = Counter("agmarl_extender_decisions_dropped", "Decision-log entries not published",
                               ["reason"], registry=registry)
        self.decisions = decisions or Counter("agmarl_decisions_total", "Scheduling decisions",
                                              ["policy", "mode", "source", "result"], registry=registry)


class ExtenderService:
    """Answers the extender verbs; owns the thread pools, the cache reference and the metrics."""

    def __init__(self, settings: InferenceSettings, source: PolicySource, cache: ClusterView,
                 metrics: ExtenderMetrics, tracer: trace.Tracer | None = None,
                 publisher: DecisionPublisher | None = None, connected: Callable[[], bool] = lambda: True,
                 binder: Binder | None = None):
        self.settings, self.source, self.cache, self.metrics = settings, source, cache, metrics
        self.tracer = tracer or trace.get_tracer("agmarl.inference.extender")
        self.publisher = publisher
        self.connected = connected
        self.binder = binder
        self.budget = settings.extender_budget_ms / 1000.0
        # the work must end a little before the budget: the answer still has to be written
        self.work_budget = self.budget - min(0.010, 0.2 * self.budget)
        self.canary_selector = kc.parse_label_selector(settings.canary_label_selector) \
            if settings.canary_label_selector else None
        self._state_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="extender-state")
        self._model_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="extender-model")
        self._model_slot = threading.Semaphore(1)  # one model computation at a time, never queued
        # (the policy, the milliseconds its last scoring took): a fast one scores small requests inline (``_model``)
        self._model_cost: tuple[Any, float] = (None, float("inf"))
        self._body_pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="extender-body")
        self.pending: OrderedDict[str, PendingDecision] = OrderedDict()  # pod key -> decision awaiting its binding
        self._traces: OrderedDict[str, Any] = OrderedDict()  # pod uid -> context of the pod's first verb span
        # pod keys this process was asked about, until the decision log's catch-up has run (catchup): None after
        self.seen: set[str] | None = set()

    def close(self) -> None:
        self._state_pool.shutdown(wait=False, cancel_futures=True)
        self._model_pool.shutdown(wait=False, cancel_futures=True)
        self._body_pool.shutdown(wait=False, cancel_futures=True)

    def offload(self, fn: Callable, *args: Any) -> asyncio.Future:
        """``fn(*args)`` off the event loop (large bodies parsed, large answers written)."""
        return asyncio.get_running_loop().run_in_executor(self._body_pool, fn, *args)

    # --- helpers ----------------------------------------------------------------------------------

    def opted_in(self, pod: Pod) -> bool:
        """Canary: the pod's namespace is listed or its labels match the canary selector."""
        if pod.namespace in self.settings.canary_namespaces:
            return True
        return self.canary_selector is not None and matches_label_selector(self.canary_selector, pod.labels)

    def fallback(self, reason: str) -> str:
        self.metrics.fallbacks.labels(reason=reason).inc()
        return reason

    async def _run(self, pool: concurrent.futures.Executor, deadline: float, fn: Callable, *args: Any,
                   inline: bool = False) -> Any:
        """``fn(*args)`` on ``pool`` within ``deadline``; ``inline``: on the event loop (a request of at most
        ``INLINE_STATE_NODES`` nodes takes a millisecond or two there, less than the thread hop and the
        GIL hand-offs it costs on a busy machine)."""
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise asyncio.TimeoutError
        if inline:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(pool, fn, *args), remaining)

    @contextlib.contextmanager
    def _span(self, verb: str, headers: Any, uid: str = "") -> Iterator[trace.Span]:
        """The verb's span: a child of the request's trace context when it carries one, else of the
        first span of the same pod (by uid), so one pod's filter, prioritize and bind form one trace."""
        carrier = dict(headers or {})
        parent = self._traces.get(uid) if uid and "traceparent" not in carrier else None
        with self.tracer.start_as_current_span(f"extender {verb}", context=parent or extract(carrier),
                                               kind=SpanKind.SERVER, attributes={"http.route": verb}) as span:
            if uid and parent is None:
                self._traces[uid] = trace.set_span_in_context(span)
                if len(self._traces) > MAX_TRACES:
                    self._traces.popitem(last=False)
            yield span

    def _pod(self, obj: dict[str, Any]) -> Pod:
        try:
            pod = kc.pod_from_k8s(obj)
        except kc.KubeConvertError as exc:
            raise BadRequest(f"Pod: {exc}") from None
        if self.seen is not None:
            self.seen.add(pod.key)
        return pod

    def _record(self, build: Callable[[], m.Decision], result: str, policy: str, mode: str,
                span: trace.Span) -> None:
        """Count the decision; the entry itself is built and published after the answer has gone."""
        self.metrics.decisions.labels(policy=policy, mode=mode, source="extender", result=result).inc()
        if self.publisher is None:
            self.metrics.dropped.labels(reason="no_publisher").inc()
        else:
            self.publisher.offer(build, trace.set_span_in_context(span), inline=True)

    # --- filter -------------------------------------------------------------------------------------

    def _filter_sync(self, pod: Pod, args: ExtenderArgs, policy: Policy | None = None
                     ) -> tuple[list[str], dict[str, str], dict[str, str]] | None:
        """(passed, failed, unresolvable) node names, or None when the cache is cold. ``policy``: the
        active policy when its choices apply to this pod; its admission (``admit``, e.g. the load cap)
        then fails the nodes that pass the hard filter but that it does not admit."""
        req = request_state(pod, args, self.cache)
        state = req.state
        if state is None:
            return None
        ok, failed, unresolvable = [], dict(req.unreadable), {}
        mask, idx = feasible_mask(pod, state), req.idx
        failing = [i for i in idx if i is not None and not mask[i]]
        reasons = failed_reasons(pod, state, failing) if failing else {}
        for name, i in zip(req.names, idx):
            if name in failed:
                continue
            if i is None:
                failed[name] = UNKNOWN_NODE
            elif mask[i]:
                ok.append(name)
            else:
                text, hard = failure(reasons[i])
                (unresolvable if hard else failed)[name] = text
        if policy is not None and callable(getattr(policy, "admit", None)) and ok:
            ok = self._admission(pod, state, policy, ok, failed)
        return ok, failed, unresolvable

    def _admission(self, pod: Pod, state: ClusterState, policy: Policy, ok: list[str], failed: dict[str, str]
                   ) -> list[str]:
        """The nodes of ``ok`` the policy admits; the others go to ``failed`` with the policy's reason.
        A failing admission passes every node on (counted as fallback ``admission_error``)."""
        idx = np.array([state.index[n] for n in ok], dtype=np.int64)
        try:
            allowed = np.asarray(policy.admit(pod, state, idx), dtype=bool)
        except Exception:  # noqa: BLE001 - never stall scheduling on a policy bug
            log.exception("admission of %s by %s failed", pod.key, policy.name)
            self.fallback("admission_error")
            return ok
        why = admission_reason(policy, pod)
        failed.update({n: why for n, a in zip(ok, allowed) if not a})
        return [n for n, a in zip(ok, allowed) if a]

    async def filter(self, args: ExtenderArgs, headers: Any = None, started: float | None = None
                     ) -> ExtenderFilterResult:
        """``started``: ``time.perf_counter()`` when the request arrived (its reading and parsing count)."""
        seen_at, deadline = time.time(), (time.perf_counter() if started is None else started) + self.work_budget
        pod = self._pod(args.Pod)
        src = self.source
        decides = returned_kind(src.mode, src.mode != "canary" or self.opted_in(pod), "") == "model"
        with self._span("filter", headers, pod.uid) as span:
            span.set_attribute("agmarl.pod", pod.key)
            fallback = ""
            try:
                result = await self._run(self._state_pool, deadline, self._filter_sync, pod, args,
                                         src.policy if decides else None, inline=_small(args))
                if result is None:
                    fallback = self.fallback("cache_cold")
                else:
                    ok, failed, unresolvable = result
            except asyncio.TimeoutError:
                fallback = self.fallback("filter_timeout")
            except Exception as exc:  # noqa: BLE001 - never fail a well-formed request
                span.record_exception(exc)
                fallback = self.fallback("filter_error")
            if fallback:  # kube-scheduler has filtered already: pass every node on
                ok, failed, unresolvable = request_names(args), {}, {}
            span.set_attribute("agmarl.fallback", fallback)
            span.set_attribute("agmarl.passed", len(ok))
            if not ok and (failed or unresolvable):
                reasons = {**failed, **unresolvable}
                src, decided_at = self.source, time.time()
                policy, version, mode = src.policy.name, src.model_version, src.mode
                self._record(lambda: self._bare(pod, span, seen_at, decided_at, policy, version, mode, {
                    "verb": "filter", "reason": "no feasible node", "filtered_out": len(reasons),
                    "filter_reasons": dict(list(reasons.items())[:10])}), "unschedulable", policy, mode, span)
        if args.Nodes is not None:
            keep = set(ok)
            items = [o for o in args.Nodes.items if (o.get("metadata") or {}).get("name") in keep]
            return ExtenderFilterResult(Nodes=NodeList(metadata=args.Nodes.metadata, items=items),
                                        FailedNodes=failed, FailedAndUnresolvableNodes=unresolvable)
        return ExtenderFilterResult(NodeNames=ok, FailedNodes=failed, FailedAndUnresolvableNodes=unresolvable)

    def _bare(self, pod: Pod, span: trace.Span, seen_at: float, decided_at: float, policy: str, version: str,
              mode: str, explanation: dict[str, Any]) -> m.Decision:
        """A decision without a chosen node (no scores)."""
        return m.Decision(
            decision_id=uuid.uuid4().hex, cluster=self.settings.cluster, namespace=pod.namespace, pod_key=pod.key,
            policy=policy, model_version=version, mode=mode, explanation={"mode": mode, **explanation},
            trace_id=_trace_id(span), seen_at=seen_at, decided_at=decided_at, source="extender")

    # --- prioritize -----------------------------------------------------------------------------------

    def _prepare(self, pod: Pod, args: ExtenderArgs, default: Policy, admit_by: Policy | None = None
                 ) -> tuple[RequestState, np.ndarray, Scored | None]:
        """State, feasible candidate indexes (in request order) and the default scores. ``admit_by``: the
        active policy when it decides this pod; the nodes it does not admit (e.g. its load cap) are no
        candidates and score 0 (without a filterVerb this is how the cap acts: the lowest score)."""
        req = request_state(pod, args, self.cache)
        if req.state is None:
            return req, np.zeros(0, np.int64), None
        known = req.index[req.index >= 0]
        cand = known[feasible_mask(pod, req.state)[known]] if known.size else known
        if admit_by is not None and cand.size:
            cand = admitted(admit_by, pod, req.state, cand)
        return req, cand, score_policy(default, pod, req.state, cand) if cand.size else None

    def _timed_score(self, policy: Policy, pod: Pod, state: ClusterState, cand: np.ndarray) -> Scored:
        """``score_policy``, its time kept as the policy's last cost (``_model_cost``)."""
        started = time.perf_counter()
        try:
            return score_policy(policy, pod, state, cand)
        finally:
            self._model_cost = (policy, (time.perf_counter() - started) * 1e3)

    def _fast(self, policy: Policy) -> bool:
        """The policy's last scoring took at most ``INLINE_MODEL_MS`` (unknown before its first: not fast)."""
        last, ms = self._model_cost
        return last is policy and ms <= INLINE_MODEL_MS

    async def _model(self, policy: Policy, default: Policy, pod: Pod, req: RequestState, cand: np.ndarray,
                     base: Scored, deadline: float, inline: bool = False) -> tuple[Scored | None, str, bool]:
        """(the active policy's scores or None, the fallback reason, whether they were computed on the event
        loop). ``inline`` (a small request): a sum of kube-scheduler's plugins (kube-default, kube-resources)
        scores on the event loop, as the default scores do, and so does any other policy (the learned model)
        whose last scoring took at most ``INLINE_MODEL_MS``: on its own thread (and its explanation after it
        there) it cost ~1.3 ms more of CPU a pod at 1,523 nodes, the hops and the cluster's rows read again on the
        other core (``benchmarks/extender_cpu.py``). Otherwise, and always first, on its own thread within the
        deadline: a slow model (measured there) never holds the event loop, and its answer falls back to the
        default scores at the deadline."""
        if policy is default or policy.name == default.name:
            return base, "", True
        if inline and isinstance(policy, WeightedPluginsPolicy):  # kube-scheduler's plugins, as the defaults
            try:
                return score_policy(policy, pod, req.state, cand), "", True
            except Exception:  # noqa: BLE001
                return None, self.fallback("model_error"), True
        if not self._model_slot.acquire(blocking=False):  # a slow model still runs: do not queue behind it
            return None, self.fallback("model_busy"), False
        if inline and self._fast(policy):
            try:
                return self._timed_score(policy, pod, req.state, cand), "", True
            except Exception:  # noqa: BLE001
                return None, self.fallback("model_error"), True
            finally:
                self._model_slot.release()
        try:
            fut = self._model_pool.submit(self._timed_score, policy, pod, req.state, cand)
        except RuntimeError:  # pool shut down
            self._model_slot.release()
            return None, self.fallback("model_error"), False
        fut.add_done_callback(lambda _: self._model_slot.release())  # finished or cancelled before it ran
        remaining = deadline - time.perf_counter()
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), max(remaining, 0.0)), "", False
        except asyncio.TimeoutError:
            return None, self.fallback("model_timeout"), False
        except Exception:  # noqa: BLE001
            return None, self.fallback("model_error"), False

    async def prioritize(self, args: ExtenderArgs, headers: Any = None, started: float | None = None
                         ) -> Priorities:
        """A score 0..10 for every node of the request, in its order (unknown/infeasible ones score 0);
        ``started`` as for ``filter``."""
        seen_at, deadline = time.time(), (time.perf_counter() if started is None else started) + self.work_budget
        pod = self._pod(args.Pod)
        src = self.source
        policy, default, mode, version = src.policy, src.default, src.mode, src.model_version
        opted = mode != "canary" or self.opted_in(pod)
        with self._span("prioritize", headers, pod.uid) as span:
            span.set_attribute("agmarl.pod", pod.key)
            span.set_attribute("agmarl.mode", mode)
            fallback, req, cand, base, model, on_loop = "", None, np.zeros(0, np.int64), None, None, False
            try:
                decides = returned_kind(mode, opted, "") == "model"
                req, cand, base = await self._run(self._state_pool, deadline, self._prepare, pod, args, default,
                                                  policy if decides else None, inline=_small(args))
                if req.state is None:
                    fallback = self.fallback("cache_cold")
                elif base is not None:
                    if not self.connected():
                        fallback = self.fallback("nats_down")
                    else:
                        model, fallback, on_loop = await self._model(policy, default, pod, req, cand, base,
                                                                     deadline, _small(args))
            except asyncio.TimeoutError:
                fallback = self.fallback("state_timeout")
            except Exception as exc:  # noqa: BLE001 - never fail a well-formed request
                span.record_exception(exc)
                fallback = self.fallback("state_error")
            names = req.names if req is not None else request_names(args)
            kind = returned_kind(mode, opted, fallback) if base is not None else "neutral"
            answer = Priorities.neutral(names)
            decided_at = time.time()
            if base is not None:
                chosen = (model if kind == "model" else base).norm
                cand_names = CandidateNames(req.state, cand)
                returned = to_extender_scores(chosen) if kind != "neutral" else [NEUTRAL_SCORE] * len(cand)
                if kind != "neutral":  # by node: a request naming a node twice gives it its score twice
                    by_node = np.full(len(req.state.nodes) + 1, NEUTRAL_SCORE, np.int64)  # the last: unknown (-1)
                    by_node[cand] = returned
                    answer = Priorities(names, by_node[req.index])
                # held until the binding is known; a policy that explains itself does so now, on this state
                explained = self._explain_soon(policy, pod, req, cand, on_loop) if model is not None else None
                build = lambda bound: self._with_model_explanation(  # noqa: E731
                    self._scored(pod, cand_names, model, base, mode, opted, returned, kind, fallback, policy.name,
                                 version, span, seen_at, decided_at, bound), explained)
                weights = blend_weights(mode, opted, self.settings.hybrid_model_weight)
                blended = base.norm if model is None else weights[1] * base.norm + weights[0] * model.norm
                self.metrics.decisions.labels(policy=policy.name, mode=mode, source="extender",
                                              result="fallback" if fallback else "scored").inc()
                self._hold(pod, req.state, int(cand[int(np.argmax(blended))]), build, span,
                           explained is None or explained.done())
            else:  # nothing to score: cache cold, a failure, or no candidate passes the hard filter here. The
                # answer is neutral and kube-scheduler still binds by its own scores: the entry waits for that
                # binding like a scored one (else the log would call unschedulable a pod that was bound)
                why = {"verb": "prioritize", "returned": kind, "fallback": fallback, "candidates": 0,
                       "reason": fallback or "no candidate passes the hard filter in the extender's view"}
                build = lambda bound: self._bare(pod, span, seen_at, decided_at, policy.name, version,  # noqa: E731
                                                 mode, why)
                self.metrics.decisions.labels(policy=policy.name, mode=mode, source="extender",
                                              result="fallback" if fallback else "unschedulable").inc()
                self._hold(pod, None, None, build, span)
            span.set_attribute("agmarl.fallback", fallback)
            span.set_attribute("agmarl.returned", kind)
        return answer

    # --- assumed choices and their bindings ---------------------------------------------------------

    def _hold(self, pod: Pod, state: ClusterState | None, i: int | None, build: Callable[[str], m.Decision],
              span: trace.Span, cheap: bool = True) -> None:
        """Assume the chosen node ``i`` in the view (on the event loop: the view's one owner) and hold the
        decision until its binding is known. ``state`` None: nothing was chosen (a neutral answer), nothing is
        assumed; the decision still waits for the binding kube-scheduler makes by its own scores."""
        view = self.cache
        view.forget(pod.key)  # a retry: the earlier assumption (if any) is replaced
        now = time.time()
        node = ""
        if state is not None and i is not None:
            node = state.nodes[i].name
            gpus = self.source.default.choose_gpus(pod, state, i)
            if gpus is not None:
                view.assume(pod, node, gpus, now)
        self.pending.pop(pod.key, None)  # a retry supersedes the earlier answer (never bound)
        self.pending[pod.key] = PendingDecision(pod, node, build, trace.set_span_in_context(span), now, cheap)
        if len(self.pending) > MAX_PENDING:
            _, oldest = self.pending.popitem(last=False)
            self._publish(oldest, "", "overflow")

    def _publish(self, p: PendingDecision, node: str, how: str) -> None:
        if self.publisher is None:
            self.metrics.dropped.labels(reason="no_publisher").inc()
            return
        build = p.build
        self.publisher.offer(lambda: with_binding(build(node), node, how), p.ctx, inline=p.cheap)

    def observed(self, bindings: Iterable[tuple[str, str]] | None) -> None:
        """Bindings the watch observed ((pod key, node), from graph-builder's ``bound`` changes), or None
        after a full state: the held decisions of pods the view now shows bound are published."""
        if not self.pending:
            return
        how = "watch"
        if bindings is None:
            view, how = self.cache, "snapshot"
            bindings = [(k, view.node_of(k)) for k in list(self.pending)
                        if k in view.where and not view.is_assumed(k)]
        for key, node in bindings:
            p = self.pending.pop(key, None)
            if p is not None:
                self._publish(p, node, how)

    def sweep(self, now: float) -> int:
        """Publish, without a binding, the held decisions older than ``assume_ttl_seconds``."""
        ttl, old = self.settings.assume_ttl_seconds, []
        for key, p in self.pending.items():  # oldest first
            if now - p.at <= ttl:
                break
            old.append(key)
        for key in old:
            self._publish(self.pending.pop(key), "", "not observed")
        return len(old)

    async def sweep_loop(self, period: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period)
            self.sweep(time.time())

    def _confirm(self, key: str, node: str) -> None:
        """The bind verb bound ``key`` to ``node``: the assumption moves there if the extender had
        assumed another node (kube-scheduler broke a tie or its own scores differed); the held
        decision is published with the binding."""
        view, p = self.cache, self.pending.pop(key, None)
        a = view.assumed.get(key)
        state = view.state
        if p is not None and a is not None and a.node != node and state is not None and node in state.index:
            view.forget(key)
            gpus = self.source.default.choose_gpus(p.pod, state, state.index[node])
            view.assume(p.pod, node, gpus or (), time.time())
        if p is not None:
            self._publish(p, node, "bind")

    def _explain_soon(self, policy: Any, pod: Pod, req: RequestState, cand: np.ndarray, on_loop: bool = False
                      ) -> concurrent.futures.Future | None:
        """A learned policy's top attention edges and feature contributions for this decision, computed right after
        its scores, on the same state: here, before the answer, when the scores were computed on the event loop
        (``on_loop``: it reads their pass, ~0.3 ms at 1,523 nodes; the hop to the model's thread cost more than that),
        else on the model's thread behind them (the answer has gone or goes now). Computed later, when the binding
        is known, it ran on a state older than the next requests': the policy's caches (node features, the
        encoder's embeddings) were recomputed twice a pod and the model's lock held from the requests (against a
        real kube-scheduler, 100 nodes: ~42 % of inference's thread time)."""
        explain_fn = getattr(policy, "explain", None)
        if not callable(explain_fn) or not getattr(self.settings, "explain_model", True):
            return None
        if on_loop:
            done: concurrent.futures.Future = concurrent.futures.Future()
            try:
                done.set_result(explain_fn(pod, req.state, cand, top=3))
            except Exception as exc:  # noqa: BLE001 - the entry says so (``_with_model_explanation``)
                done.set_exception(exc)
            return done
        try:
            return self._model_pool.submit(explain_fn, pod, req.state, cand, top=3)
        except RuntimeError:  # pool shut down
            return None

    @staticmethod
    def _with_model_explanation(decision: m.Decision, explained: concurrent.futures.Future | None) -> m.Decision:
        """The decision with the model's explanation (``_explain_soon``) once it is there."""
        if explained is not None:
            try:
                decision.explanation["model"] = explained.result(timeout=EXPLAIN_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - an explanation must never cost the decision log entry
                decision.explanation["model"] = {"error": type(exc).__name__}
        return decision

    def _scored(self, pod: Pod, names: Sequence[str], model: Scored | None, base: Scored, mode: str, opted: bool,
                returned: list[int], kind: str, fallback: str, policy: str, version: str, span: trace.Span,
                seen_at: float, decided_at: float, bound: str = "") -> m.Decision:
        """The decision-log entry; the scores of at most ``LOGGED_SCORES`` nodes (the best by the blend, the
        choices of model and default, the ``bound`` node) on large clusters."""
        weights = blend_weights(mode, opted, self.settings.hybrid_model_weight)
        blended = base.norm if model is None else weights[1] * base.norm + weights[0] * model.norm
        best = int(np.argmax(blended))
        explanation = explain(names, model, base, weights, returned)
        explanation.update({
            "verb": "prioritize", "mode": mode, "policy": policy, "default_policy": self.source.default.name,
            "returned": kind, "fallback": fallback, "candidates": len(names),
            "blend": {"model": weights[0], "default": weights[1]},
            "default_choice": names[int(np.argmax(base.norm))],
            "model_choice": names[int(np.argmax(model.norm))] if model is not None else "",
        })
        if mode == "canary":
            explanation["canary"] = opted
        if mode == "recommend" and model is not None:
            explanation["recommendation"] = explanation["model_choice"]

        keep = np.arange(len(names))
        if len(names) > LOGGED_SCORES:
            also = [best, int(np.argmax(base.norm))] + ([int(np.argmax(model.norm))] if model is not None else [])
            if bound in names:
                also.append(names.index(bound))
            keep = np.union1d(np.argpartition(-blended, LOGGED_SCORES - len(also))[:LOGGED_SCORES - len(also)], also)
            explanation["scores_logged"] = f"{keep.size} of {len(names)} (the best and the chosen)"
        kept = [names[i] for i in keep.tolist()]

        def rounded(a: np.ndarray) -> dict[str, float]:  # vectorised
            return dict(zip(kept, np.round(np.asarray(a, dtype=np.float64)[keep], 3).tolist()))
        return m.Decision(
            decision_id=uuid.uuid4().hex, cluster=self.settings.cluster, namespace=pod.namespace, pod_key=pod.key,
            node=names[best], policy=policy, model_version=version, mode=mode, score=round(float(blended[best]), 3),
            scores=rounded(blended), model_scores=rounded(model.norm) if model is not None else {},
            default_scores=rounded(base.norm), explanation=explanation, trace_id=_trace_id(span),
            seen_at=seen_at, decided_at=decided_at, source="extender")

    # --- bind, preempt ------------------------------------------------------------------------------

    async def bind(self, args: ExtenderBindingArgs, headers: Any = None) -> ExtenderBindingResult:
        key = f"{args.PodNamespace}/{args.PodName}"
        with self._span("bind", headers, args.PodUID) as span:
            span.set_attribute("agmarl.pod", f"{args.PodNamespace}/{args.PodName}")
            span.set_attribute("agmarl.node", args.Node)
            if self.binder is None:
                return ExtenderBindingResult(Error="no Kubernetes API configured")
            try:
                await asyncio.wait_for(asyncio.to_thread(self.binder.bind, args.PodNamespace, args.PodName,
                                                         args.PodUID, args.Node), BIND_TIMEOUT_S)
            except asyncio.TimeoutError:
                self.cache.forget(key)
                return ExtenderBindingResult(Error=f"binding timed out after {BIND_TIMEOUT_S:.0f}s")
            except Exception as exc:  # noqa: BLE001 - the error goes back to kube-scheduler
                span.record_exception(exc)
                self.cache.forget(key)  # kube-scheduler forgets the pod and retries it: so does the view
                return ExtenderBindingResult(Error=f"binding failed: {type(exc).__name__}: {_short(exc)}")
            self._confirm(key, args.Node)
        return ExtenderBindingResult()

    async def preempt(self, args: ExtenderPreemptionArgs, headers: Any = None) -> ExtenderPreemptionResult:
        """Passthrough: the extender adds no victims and vetoes no candidate node (a node given without
        victims, ``null``, which kube-scheduler never sends, is left out rather than answered null)."""
        if args.NodeNameToMetaVictims is not None:
            return ExtenderPreemptionResult(NodeNameToMetaVictims={
                node: v for node, v in args.NodeNameToMetaVictims.items() if v is not None})
        out = {}
        for node, victims in (args.NodeNameToVictims or {}).items():
            if victims is None:
                continue
            pods = [MetaPod(UID=p.metadata.uid if p is not None else "") for p in victims.Pods or []]
            out[node] = MetaVictims(Pods=pods, NumPDBViolations=victims.NumPDBViolations)
        return ExtenderPreemptionResult(NodeNameToMetaVictims=out)


BIND_TIMEOUT_S = 4.0  # below the 5 s httpTimeout of the bind configurations


def _small(args: ExtenderArgs) -> bool:
    return args.Nodes is None and len(args.NodeNames or ()) <= INLINE_STATE_NODES


def _trace_id(span: trace.Span) -> str:
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


def _short(exc: Exception, limit: int = 300) -> str:
    text = str(exc).replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."
