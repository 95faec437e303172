"""The thin-shell runtime every service uses: tracing, metrics, bus, health, and the middleware that
decodes, validates, traces, times and dead-letters around each handler.

    rt = ServiceRuntime("inference", settings)

    @rt.handle(subjects.pending(settings.cluster), PendingPod, queue="inference")
    async def on_pending(msg: PendingPod, ctx: HandlerContext) -> None:
        await ctx.publish(subjects.decision(msg.cluster, ns), decision, js=True, msg_id=decision.decision_id)

    return await rt.run_until_stopped()
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NoReturn

from nats.aio.msg import Msg
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import ERROR_HEADER, MSG_ID_HEADER, Bus, trace_headers
from agmarl_common.runtime.health import Beat, HealthLimits, judge
from agmarl_common.runtime.lifetime import process_alive
from agmarl_common.runtime.messages import DecodeError, HealthStatus, Message, dead_letter, decode, encode
from agmarl_common.runtime.natsauth import NatsAuth
from agmarl_common.runtime.metrics import MiddlewareMetrics, new_registry, start_metrics_server, stop_metrics_server
from agmarl_common.runtime.settings import CommonSettings
from agmarl_common.runtime.telemetry import extract, setup_tracing, shutdown_tracing

Handler = Callable[[Any, "HandlerContext"], Awaitable[Any]]
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


@dataclass
class HandlerContext:
    """What a handler gets besides its message: where it came from and how to publish onwards."""

    runtime: "ServiceRuntime"
    subject: str
    headers: dict[str, str]
    span: Span
    msg_id: str | None = None
    reply: str = ""
    delivery: Msg | None = None  # a JetStream delivery (``handle_stream``), settled by the runtime ...
    deferred: bool = False  # ... unless the handler took it over with ``defer_ack``

    def defer_ack(self) -> Msg:
        """Stream handlers: the runtime does not ack when the handler returns; the handler keeps the
        returned delivery and acks it once the message is fully processed (one never acked is redelivered
        after the consumer's ack_wait, to this process or the next)."""
        if self.delivery is None:
            raise RuntimeError("defer_ack: not a JetStream delivery")
        self.deferred = True
        return self.delivery

    async def publish(self, subject: str, msg: Message, js: bool = False, msg_id: str | None = None,
                      headers: dict[str, str] | None = None) -> None:
        """Publish inside the handler's span, so the trace continues in the consumer."""
        await self.runtime.publish(subject, msg, js=js, msg_id=msg_id, headers=headers)

    @property
    def trace_id(self) -> str:
        ctx = self.span.get_span_context()
        return format(ctx.trace_id, "032x") if ctx.is_valid else ""


@dataclass
class _Registration:
    subject: str
    cls: type[Message]
    fn: Handler
    queue: str | None = None
    max_bytes: int | None = None
    reply_cls: type[Message] | None = None
    stream: subjects.StreamSpec | str | None = None
    durable: str | None = None
    consumer: dict[str, Any] = field(default_factory=dict)
    span_name: str = ""  # "<service> <kind>", the name of each message's span


class ServiceRuntime:
    """One service process: ``start()``, register handlers, ``await run_until_stopped()``."""

    def __init__(self, name: str, settings: CommonSettings):
        self.name = name
        self.settings = settings
        self.log = logging.getLogger(f"agmarl.{name}")
        self.registry = new_registry()
        self.metrics = MiddlewareMetrics(self.registry, name)
        self.tracer_provider: TracerProvider | None = None
        self.tracer: trace.Tracer = trace.NoOpTracer()
        self.bus: Bus = None  # type: ignore[assignment]  # set by start()
        self.metrics_port = 0
        self.health: Callable[[], str] = self.default_health
        self.health_details: Callable[[], dict[str, Any]] = dict
        self.started_at = 0.0
        self.clock: Callable[[], float] = time.time
        self._checks: list[Callable[[], str | None]] = []
        # /healthz and /readyz (health.py): the heartbeat's last Beat, handlers running, NATS down since
        self.health_limits = HealthLimits(settings.nats_grace_seconds, settings.handler_stuck_seconds)
        self._beat: Beat | None = None
        self._inflight: dict[int, tuple[str, float]] = {}
        self._down_since: float | None = None
        self._registrations: list[_Registration] = []
        self._subscriptions: list[Any] = []
        self._tasks: set[asyncio.Task] = set()
        self._on_stop: list[Callable[[], Awaitable[None]]] = []
        self._stop = asyncio.Event()
        self._started = False

    # --- registration -------------------------------------------------------------------------

    def handle(self, subject: str, cls: type[Message], queue: str | None = None,
               max_bytes: int | None = None) -> Callable[[Handler], Handler]:
        """Decorator: ``async def handler(msg, ctx) -> None`` for every valid ``cls`` on ``subject``."""
        return self._register(_Registration(subject, cls, None, queue, max_bytes))  # type: ignore[arg-type]

    def handle_request(self, subject: str, cls: type[Message], reply_cls: type[Message],
                       queue: str | None = None, max_bytes: int | None = None) -> Callable[[Handler], Handler]:
        """Decorator for request/reply: the handler returns a ``reply_cls`` message. A rejected request
        or failed handler answers with an empty payload and an ``Agmarl-Error`` header."""
        return self._register(_Registration(subject, cls, None, queue, max_bytes, reply_cls))  # type: ignore[arg-type]

    def handle_stream(self, stream: subjects.StreamSpec | str, subject: str, durable: str, cls: type[Message],
                      queue: str | None = None, max_bytes: int | None = None, ack_wait: float = 30.0,
                      max_deliver: int = 5, deliver_new: bool = False,
                      max_ack_pending: int | None = None) -> Callable[[Handler], Handler]:
        """Decorator for a JetStream durable consumer: ack after the handler (or later, ``ctx.defer_ack``),
        term on bad input, nak (redeliver) on a handler error until ``max_deliver``, then dead-letter and
        term. ``deliver_new``: a consumer created now starts at the stream's end (one that exists continues
        where it stopped); ``max_ack_pending``: deliveries held unacked at most (None: the server's 1,000)."""
        consumer = {"ack_wait": ack_wait, "max_deliver": max_deliver, "deliver_new": deliver_new}
        if max_ack_pending is not None:
            consumer["max_ack_pending"] = max_ack_pending
        return self._register(_Registration(subject, cls, None, queue, max_bytes, None,  # type: ignore[arg-type]
                                            stream, durable, consumer))

    def _register(self, reg: _Registration) -> Callable[[Handler], Handler]:
        reg.span_name = f"{self.name} {reg.cls.KIND}"

        def decorator(fn: Handler) -> Handler:
            reg.fn = fn
            self._registrations.append(reg)
            if self._started:  # registered late: subscribe in the background
                self.spawn(self._subscribe(reg), name=f"subscribe {reg.subject}")
            return fn
        return decorator

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Tracing, metrics server, NATS connection, health responder, registered handlers."""
        if self._started:
            return
        self.started_at = self.clock()
        logging.getLogger("agmarl").setLevel(str(self.settings.log_level).upper())
        self.tracer_provider = setup_tracing(self.name, self.settings.trace_dir)
        self.tracer = self.tracer_provider.get_tracer(f"agmarl.{self.name}")
        self.metrics_port = start_metrics_server(self.registry, self.settings.metrics_host,
                                                 self.settings.metrics_port,
                                                 routes={"/healthz": lambda: self.probe("live"),
                                                         "/readyz": lambda: self.probe("ready")})
        self.spawn(self._heartbeat(), name="health-heartbeat")
        self.bus = await Bus.connect(self.settings.nats_url, self.name, log=self.log,
                                     auth=NatsAuth.from_settings(self.settings, self.name))
        self.bus.stream_replicas = self.settings.stream_replicas
        for subject in (subjects.health(self.name), subjects.health_all()):
            self._subscriptions.append(await self.bus.subscribe(subject, self._on_health))
        for reg in list(self._registrations):
            await self._subscribe(reg)
        self._started = True
        if self.settings.parent_pid:
            self.spawn(self._watch_parent(self.settings.parent_pid), name="parent-watchdog")
        self.log.info("service started service=%s pid=%d metrics_port=%d nats=%s handlers=%d",
                      self.name, os.getpid(), self.metrics_port, self.settings.nats_url, len(self._registrations))

    async def _subscribe(self, reg: _Registration) -> None:
        async def on_msg(msg: Msg) -> None:
            await self._dispatch(reg, msg)

        if reg.stream is None:
            sub = await self.bus.subscribe(reg.subject, on_msg, queue=reg.queue)
        else:
            if isinstance(reg.stream, subjects.StreamSpec):
                await self.bus.ensure_stream(reg.stream)
            name = reg.stream.name if isinstance(reg.stream, subjects.StreamSpec) else reg.stream
            sub = await self.bus.durable_subscribe(name, reg.subject, reg.durable or self.name, on_msg,
                                                   queue=reg.queue, **reg.consumer)
        self._subscriptions.append(sub)

    async def _watch_parent(self, pid: int, interval: float = 1.0) -> None:
        """Stop when the supervising process is gone (killed, terminal closed): no orphans."""
        while True:
            await asyncio.sleep(interval)
            if os.getppid() != pid and not process_alive(pid):
                self.log.warning("parent process %d is gone; stopping service=%s", pid, self.name)
                self.request_stop()
                return

    @property
    def stopping(self) -> bool:
        """A stop was requested (SIGTERM/SIGINT or ``request_stop``): background loops end instead of retrying."""
        return self._stop.is_set()

    def request_stop(self, sig: int | None = None) -> None:
        """Ask ``run_until_stopped`` to return (what SIGTERM/SIGINT do)."""
        self.log.info("stop requested service=%s signal=%s", self.name, sig)
        self._stop.set()

    async def run_until_stopped(self) -> int:
        """Start if needed, wait for SIGTERM/SIGINT or ``request_stop``, shut down cleanly, return 0."""
        if not self._started:
            await self.start()
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread: request_stop() is the way out
        try:
            await self._stop.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self.shutdown()
        return 0

    def on_stop(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``await fn()`` first thing at shutdown, while subscriptions still deliver (a flush of what
        a service holds); a failing hook is logged and shutdown goes on."""
        self._on_stop.append(fn)

    async def shutdown(self) -> None:
        """Stop hooks, cancel background tasks, drain subscriptions, stop metrics, flush telemetry."""
        began = time.monotonic()
        for fn in self._on_stop:
            try:
                await fn()
            except Exception:  # noqa: BLE001 - shutdown must finish; the log has the traceback
                self.log.exception("stop hook failed service=%s", self.name)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            _, late = await asyncio.wait(list(self._tasks), timeout=5.0)
            if late:  # a task that swallowed its cancellation keeps the process alive: name it
                self.log.warning("background tasks still running after cancel service=%s tasks=%s", self.name,
                                 ",".join(sorted(t.get_name() for t in late)))
        if self.bus is not None:
            await self.bus.drain()
        if self.metrics_port:
            stop_metrics_server(self.metrics_port)
        if self.tracer_provider is not None:
            shutdown_tracing(self.tracer_provider)
        self._started = False
        self.log.info("service stopped service=%s shutdown_s=%.2f", self.name, time.monotonic() - began)

    async def __aenter__(self) -> "ServiceRuntime":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def backlog(self) -> int:
        """Messages this service received and has not handed to a handler yet (its subscriptions' pending
        queues in the NATS client): work waiting, for a loop deciding whether optional work can go first."""
        return sum(int(getattr(sub, "pending_msgs", 0)) for sub in self._subscriptions)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> asyncio.Task:
        """Run a background coroutine owned by the runtime: logged if it fails, cancelled on shutdown."""
        task = asyncio.get_running_loop().create_task(coro, name=name or None)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self.log.error("background task failed service=%s task=%s", self.name, t.get_name(),
                               exc_info=t.exception())
        task.add_done_callback(done)
        return task

    # --- publishing, spans, health ----------------------------------------------------------------

    async def publish(self, subject: str, msg: Message, js: bool = False, msg_id: str | None = None,
                      headers: dict[str, str] | None = None) -> None:
        """Publish (core or JetStream with ack) carrying the current trace context; counted."""
        if js:
            await self.bus.js_publish(subject, msg, headers=headers, msg_id=msg_id)
        else:
            await self.bus.publish(subject, msg, headers=headers, msg_id=msg_id)
        self.metrics.on_published(subject)

    def span(self, name: str, **attributes: Any):
        """Context manager starting a span (the root of a trace when nothing is current)."""
        return self.tracer.start_as_current_span(name, attributes=attributes or None)

    async def _heartbeat(self, interval: float = 0.5) -> None:
        """Record a ``Beat`` twice a second; the metrics thread judges /healthz and /readyz from the last one,
        so an event loop that stops running shows as a beat that ages."""
        while True:
            now = time.monotonic()
            connected = self.bus is not None and self.bus.is_connected
            if connected:
                self._down_since = None
            elif self._down_since is None:
                self._down_since = now
            oldest = min(list(self._inflight.values()), key=lambda h: h[1], default=None)
            unhealthy = next((reason for reason in (check() for check in self._checks) if reason), None)
            self._beat = Beat(now, self._started, connected, self._down_since, oldest, unhealthy)
            await asyncio.sleep(interval)

    def probe(self, which: str) -> tuple[int, dict]:
        """``which`` = "live" (/healthz) or "ready" (/readyz): (200 or 503, JSON body). Any thread."""
        verdict = judge(self._beat, time.monotonic(), self.health_limits)
        ok = verdict.live if which == "live" else verdict.ready
        return (200 if ok else 503), verdict.body(which)

    def add_health_check(self, check: Callable[[], str | None]) -> None:
        """``check`` returns None when fine or a reason string that makes the service unhealthy."""
        self._checks.append(check)

    def default_health(self) -> str:
        if self.bus is None or not self.bus.is_connected:
            return "nats disconnected"
        if not self._started:  # handlers (durable consumers) not subscribed yet
            return "starting"
        for check in self._checks:
            reason = check()
            if reason:
                return reason
        verdict = judge(self._beat, time.monotonic(), self.health_limits)
        return "healthy" if verdict.live else verdict.problems[0]  # a handler stuck

    def health_status(self) -> HealthStatus:
        try:
            status = self.health()
        except Exception as exc:
            status = f"health check failed: {type(exc).__name__}: {exc}"
        details = {"uptime_s": round(self.clock() - self.started_at, 3), "cluster": self.settings.cluster,
                   "subscriptions": len(self._subscriptions)}
        try:
            details.update(self.health_details())
        except Exception as exc:
            details["details_error"] = str(exc)
        return HealthStatus(service=self.name, status=status, pid=os.getpid(),
                            metrics_port=self.metrics_port, details=details)

    async def _on_health(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            await self.bus.nc.publish(msg.reply, encode(self.health_status()))
        except Exception:
            self.log.exception("health reply failed service=%s", self.name)

    # --- middleware -------------------------------------------------------------------------------

    async def _dispatch(self, reg: _Registration, msg: Msg) -> None:
        """Never raises: every failure is logged, counted and dead-lettered here."""
        try:
            final = True
            if reg.stream is not None:
                final = msg.metadata.num_delivered >= int(reg.consumer.get("max_deliver", 5))
            outcome, result = await self._process(reg, msg, final)
            if reg.stream is not None:
                await self._settle(msg, outcome, final)
            elif msg.reply and reg.reply_cls is not None:
                await self._respond(reg, msg, outcome, result)
        except Exception:
            self.log.exception("middleware failure service=%s subject=%s", self.name, msg.subject)
        # a subscription with a backlog would otherwise run handler after handler without giving the loop
        # back (a non-empty queue does not suspend): health probes and the other subscriptions wait behind it
        await asyncio.sleep(0)

    async def _process(self, reg: _Registration, msg: Msg, final: bool) -> tuple[str, Any]:
        subject, data = msg.subject, msg.data
        headers = dict(msg.headers or {})
        try:
            obj = decode(reg.cls, data, reg.max_bytes or self.settings.max_message_bytes)
        except DecodeError as exc:
            await self._reject(subject, data, exc.kind, exc.reason)
            return "rejected", None
        started = time.perf_counter()
        attributes = {"messaging.system": "nats", "messaging.destination.name": subject,
                      "agmarl.kind": reg.cls.KIND, "messaging.message.body.size": len(data)}
        # the handler's span, current while it runs (what start_as_current_span does, without its two
        # generator-based context managers per message)
        span = self.tracer.start_span(reg.span_name, context=extract(headers),
                                      kind=SpanKind.CONSUMER, attributes=attributes, record_exception=False,
                                      set_status_on_exception=False)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            self.metrics.on_received(subject)
            ctx = HandlerContext(self, subject, headers, span, headers.get(MSG_ID_HEADER), msg.reply or "",
                                 msg if reg.stream is not None else None)
            self._inflight[id(ctx)] = (subject, time.monotonic())  # a handler stuck makes /healthz fail
            try:
                result = await reg.fn(obj, ctx)
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                self.metrics.on_handler_error(subject)
                self.log.exception("handler failed service=%s subject=%s kind=%s final=%s",
                                   self.name, subject, reg.cls.KIND, final)
                if final:
                    await self._dead_letter(subject, data, "handler_error", f"{type(exc).__name__}: {exc}")
                return "error", None
            finally:
                self._inflight.pop(id(ctx), None)
                self.metrics.observe(subject, time.perf_counter() - started)
            if reg.reply_cls is not None and msg.reply and not isinstance(result, reg.reply_cls):
                self.log.error("handler returned %s, expected %s service=%s subject=%s",
                               type(result).__name__, reg.reply_cls.__name__, self.name, subject)
                return "error", None
            return ("deferred" if ctx.deferred else "ok"), result
        finally:
            otel_context.detach(token)
            span.end()

    @staticmethod
    async def _settle(msg: Msg, outcome: str, final: bool) -> None:
        if outcome == "deferred":
            return  # the handler acks it later (HandlerContext.defer_ack)
        if outcome == "ok":
            await msg.ack()
        elif outcome == "rejected" or final:
            await msg.term()
        else:
            await msg.nak(delay=1.0)  # redelivered, at most max_deliver times in all

    async def _respond(self, reg: _Registration, msg: Msg, outcome: str, result: Any) -> None:
        if outcome == "ok":
            await self.bus.nc.publish(msg.reply, encode(result), headers=trace_headers(result))
        else:
            await self.bus.nc.publish(msg.reply, b"", headers={ERROR_HEADER: outcome})
        self.metrics.on_published(msg.reply)

    async def _reject(self, subject: str, data: bytes, kind: str, reason: str) -> None:
        self.log.warning("rejected message service=%s subject=%s kind=%s reason=%s",
                         self.name, subject, kind, reason)
        self.metrics.on_rejected(subject, kind)
        await self._dead_letter(subject, data, kind, reason)

    async def _dead_letter(self, subject: str, data: bytes, kind: str, reason: str) -> None:
        if subject.startswith(f"{subjects.PREFIX}.dead_letter."):
            return  # never dead-letter a dead letter
        letter = dead_letter(self.name, subject, reason, kind, data, self.clock())
        try:
            await self.bus.publish(subjects.dead_letter(self.name), letter)
            self.metrics.on_dead_letter()
        except Exception:
            self.log.exception("dead letter publish failed service=%s subject=%s", self.name, subject)


def configure_logging(level: str = "INFO") -> None:
    """One line per record on stderr: time, level, logger, message."""
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO), format=LOG_FORMAT,
                        stream=sys.stderr)


def run_service(main: Callable[[], Awaitable[int]] | Awaitable[int], log_level: str | None = None) -> NoReturn:
    """``if __name__ == "__main__": run_service(main)`` -- logging, asyncio.run, exit with the code."""
    configure_logging(log_level or os.environ.get("AGMARL_LOG_LEVEL", "INFO"))
    try:
        code = asyncio.run(main() if callable(main) else main)  # type: ignore[arg-type]
    except KeyboardInterrupt:
        code = 130
    sys.exit(int(code or 0))
