"""Tracing: JSONL spans on disk promptly, W3C propagation, span tree, OTLP only when configured."""
import time

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

from agmarl_common.runtime.telemetry import (
    extract, inject, otlp_exporter_from_env, read_spans, setup_tracing, shutdown_tracing, span_tree)


def _wait_for_spans(trace_dir, n, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spans = read_spans(trace_dir)
        if len(spans) >= n:
            return spans
        time.sleep(0.05)
    return read_spans(trace_dir)


def test_spans_reach_disk_within_a_second_and_form_a_tree(tmp_path):
    producer = setup_tracing("svc-a", str(tmp_path), set_global=False)
    consumer = setup_tracing("svc-b", str(tmp_path), set_global=False)
    try:
        headers: dict[str, str] = {}
        with producer.get_tracer("t").start_as_current_span("svc-a publish") as root:
            inject(headers)
        assert headers["traceparent"].split("-")[1] == format(root.get_span_context().trace_id, "032x")
        tracer_b = consumer.get_tracer("t")
        with tracer_b.start_as_current_span("svc-b handle", context=extract(headers)):
            with tracer_b.start_as_current_span("svc-b score"):
                pass
        started = time.monotonic()
        spans = _wait_for_spans(tmp_path, 3)
        assert time.monotonic() - started < 1.5  # flushed without an explicit force_flush
    finally:
        shutdown_tracing(producer)
        shutdown_tracing(consumer)
    trace_id = format(root.get_span_context().trace_id, "032x")
    assert len(spans) == 3 and {s["trace_id"] for s in spans} == {trace_id}
    by_name = {s["name"]: s for s in spans}
    assert by_name["svc-b handle"]["parent_span_id"] == by_name["svc-a publish"]["span_id"]
    assert by_name["svc-b score"]["parent_span_id"] == by_name["svc-b handle"]["span_id"]
    assert {s["service"] for s in spans} == {"svc-a", "svc-b"}
    assert sorted(p.name.split("-")[1] for p in tmp_path.glob("*.jsonl")) == ["a", "b"]
    assert all(s["end_ns"] >= s["start_ns"] > 0 for s in spans)

    tree = span_tree(spans, trace_id).splitlines()
    assert tree[0] == f"trace {trace_id} (3 spans)"
    assert tree[1].startswith("  svc-a svc-a publish ") and tree[1].endswith(" ms")
    assert tree[2].startswith("    svc-b svc-b handle ")
    assert tree[3].startswith("      svc-b svc-b score ")
    assert "no spans" in span_tree(spans, "0" * 32)


def test_read_spans_skips_truncated_lines(tmp_path):
    (tmp_path / "x-1.jsonl").write_text('{"trace_id": "t", "span_id": "s", "name": "ok"}\n{"trace_id": "t", "sp')
    assert [s["name"] for s in read_spans(tmp_path)] == ["ok"]


def test_extract_without_headers_is_empty_context():
    assert inject({}, extract({})) == {}
    assert inject({}, extract(None)) == {}


def test_sdk_disabled_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    provider = setup_tracing("svc-off", str(tmp_path), set_global=False)
    with provider.get_tracer("t").start_as_current_span("x") as span:
        assert not span.is_recording()
    shutdown_tracing(provider)
    assert read_spans(tmp_path) == []


def test_otlp_exporter_only_when_endpoint_set(monkeypatch):
    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(key, raising=False)
    assert otlp_exporter_from_env() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    exporter = otlp_exporter_from_env()
    assert isinstance(exporter, HttpExporter)
    exporter.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    exporter = otlp_exporter_from_env()
    assert isinstance(exporter, GrpcExporter)
    exporter.shutdown()
