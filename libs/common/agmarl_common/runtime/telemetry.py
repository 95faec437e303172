"""OpenTelemetry set-up, W3C trace-context propagation through NATS headers, local JSONL traces.

``setup_tracing`` builds a TracerProvider for one service: an OTLP exporter only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set (protocol from
``OTEL_EXPORTER_OTLP_PROTOCOL``: grpc or http/protobuf), and a JSONL exporter writing one line per
finished span to ``<trace_dir>/<service>-<pid>.jsonl`` for ``agmarl trace``.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("agmarl.telemetry")
_PROPAGATOR = TraceContextTextMapPropagator()
_JSONL_FLUSH_MS = 200


class JsonlSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to a file (thread-safe, flushed per batch)."""

    def __init__(self, path: str | Path, service: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.service = service
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [json.dumps(span_record(s, self.service), default=str) for s in spans]
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write("".join(line + "\n" for line in lines))
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def span_record(span: ReadableSpan, service: str) -> dict[str, Any]:
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_span_id": format(parent.span_id, "016x") if parent is not None else "",
        "name": span.name,
        "service": span.resource.attributes.get(SERVICE_NAME, service),
        "kind": span.kind.name if span.kind is not None else "",
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "status_description": span.status.description or "",
    }


def otlp_exporter_from_env() -> SpanExporter | None:
    """The OTLP span exporter the standard OTEL_* variables ask for, or None when no endpoint is set."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()  # endpoint, headers, timeout... from the standard OTEL_* variables


def setup_tracing(service_name: str, trace_dir: str | None = None, *, set_global: bool = True) -> TracerProvider:
    """A TracerProvider for ``service_name`` with OTLP (when configured) and JSONL (when trace_dir).

    Honors OTEL_SDK_DISABLED=true (no spans recorded, no files written). The provider becomes the
    global one when ``set_global`` and no SDK provider is installed yet (one per process).
    """
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return provider
    otlp = otlp_exporter_from_env()
    if otlp is not None:
        provider.add_span_processor(BatchSpanProcessor(otlp))
    if trace_dir:
        path = Path(trace_dir) / f"{service_name}-{os.getpid()}.jsonl"
        provider.add_span_processor(BatchSpanProcessor(JsonlSpanExporter(path, service_name),
                                                       schedule_delay_millis=_JSONL_FLUSH_MS))
    if set_global and not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(provider)
    return provider


def shutdown_tracing(provider: TracerProvider, timeout_millis: int = 5000) -> None:
    """Flush every processor, then shut the provider down (call on exit)."""
    try:
        provider.force_flush(timeout_millis)
    finally:
        provider.shutdown()


def inject(headers: dict[str, str], context: Context | None = None) -> dict[str, str]:
    """Write W3C ``traceparent``/``tracestate`` for ``context`` (default: current) into headers."""
    _PROPAGATOR.inject(headers, context=context)
    return headers


def extract(headers: Mapping[str, str] | None) -> Context:
    """The remote context carried by ``headers`` (an empty Context when there is none)."""
    return _PROPAGATOR.extract(headers if headers is not None else {})  # read only: no copy


def current_trace_id() -> str:
    """Hex trace id of the current span, '' outside a recording span."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


def read_spans(trace_dir: str | Path) -> list[dict[str, Any]]:
    """Every span record from ``<trace_dir>/*.jsonl``; a truncated or bad line is skipped."""
    spans: list[dict[str, Any]] = []
    for path in sorted(Path(trace_dir).glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and "trace_id" in record:
                    spans.append(record)
    return spans


def span_tree(spans: Sequence[Mapping[str, Any]], trace_id: str) -> str:
    """Indented tree of one trace: ``<service> <name> <duration> ms`` per span, children by start."""
    mine = [s for s in spans if s.get("trace_id") == trace_id]
    if not mine:
        return f"trace {trace_id}: no spans"
    ids = {s["span_id"] for s in mine}
    children: dict[str, list[Mapping[str, Any]]] = {}
    roots = []
    for s in mine:
        parent = s.get("parent_span_id") or ""
        if parent and parent in ids:
            children.setdefault(parent, []).append(s)
        else:
            roots.append(s)
    lines = [f"trace {trace_id} ({len(mine)} spans)"]

    def walk(span: Mapping[str, Any], depth: int) -> None:
        ms = (int(span.get("end_ns") or 0) - int(span.get("start_ns") or 0)) / 1e6
        status = "" if span.get("status") in ("UNSET", "OK", None) else f" [{span['status']}]"
        lines.append(f"{'  ' * (depth + 1)}{span.get('service', '?')} {span.get('name', '?')} {ms:.2f} ms{status}")
        for child in sorted(children.get(span["span_id"], []), key=lambda c: c.get("start_ns") or 0):
            walk(child, depth + 1)

    for root in sorted(roots, key=lambda r: r.get("start_ns") or 0):
        walk(root, 0)
    return "\n".join(lines)
