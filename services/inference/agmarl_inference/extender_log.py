"""The extender's decision log: every answer becomes a Decision published to JetStream off the request
path (a bounded queue; ``offer`` never blocks, drops are counted in ``dropped``, the extender's
``agmarl_extender_decisions_dropped`` counter by reason)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from opentelemetry import trace
from opentelemetry.trace import SpanKind
from prometheus_client import Counter

from agmarl_common import messages as m
from agmarl_common import subjects

log = logging.getLogger("agmarl.inference.extender")



class DecisionPublisher:
    """Fire and forget: ``offer`` never blocks; ``run`` publishes to JetStream in the background."""

    def __init__(self, publish: Callable[[m.Decision], Awaitable[None]], dropped: Counter,
                 tracer: trace.Tracer, connected: Callable[[], bool] = lambda: True, maxsize: int = 1024,
                 timeout: float = 2.0):
        self._publish, self.dropped, self.tracer, self.connected = publish, dropped, tracer, connected
        self.queue: asyncio.Queue = asyncio.Queue(maxsize)
        self.timeout = timeout
        self.published = 0

    def offer(self, build: Callable[[], m.Decision], ctx: Any) -> bool:
        """Queue a decision builder (with the OpenTelemetry context of its request); False = dropped, counted."""
        try:
            self.queue.put_nowait((build, ctx))
            return True
        except asyncio.QueueFull:
            self.dropped.labels(reason="queue_full").inc()
            return False

    async def run(self) -> None:
        while True:
            build, ctx = await self.queue.get()
            if not self.connected():
                self.dropped.labels(reason="nats_down").inc()
                continue
            try:
                decision = await asyncio.to_thread(build)  # off the event loop: requests keep flowing
            except Exception:  # noqa: BLE001 - a bug in the explanation must not stop the log
                log.exception("decision-log entry could not be built")
                self.dropped.labels(reason="build_error").inc()
                continue
            with self.tracer.start_as_current_span("extender publish decision", context=ctx, kind=SpanKind.PRODUCER,
                                                   attributes={"agmarl.decision_id": decision.decision_id}):
                try:
                    await asyncio.wait_for(self._publish(decision), self.timeout)
                    self.published += 1
                except Exception:  # noqa: BLE001 - counted; the request was answered long ago
                    self.dropped.labels(reason="publish_error").inc()


def decision_subject(decision: m.Decision) -> str:
    return subjects.decision(decision.cluster, decision.namespace)
