"""With OTEL_EXPORTER_OTLP_ENDPOINT set, spans go out over OTLP/HTTP unchanged (to a local OTLP
receiver here: a real HTTP server on 127.0.0.1 decoding the protobuf), and the local JSONL files
keep working alongside."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agmarl_common.runtime.telemetry import read_spans, setup_tracing, shutdown_tracing


class Receiver(BaseHTTPRequestHandler):
    got: list[tuple[str, bytes]] = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Receiver.got.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_spans_are_exported_over_otlp_http_and_to_local_files(monkeypatch, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        provider = setup_tracing("otlp-test", str(tmp_path), set_global=False)
        with provider.get_tracer("t").start_as_current_span("decide", attributes={"agmarl.pod": "ns/p"}):
            pass
        shutdown_tracing(provider)
    finally:
        server.shutdown()
    paths = [p for p, _ in Receiver.got]
    assert "/v1/traces" in paths
    names = []
    for path, body in Receiver.got:
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
            assert service == "otlp-test"
            names += [s.name for ss in rs.scope_spans for s in ss.spans]
    assert names == ["decide"]
    assert [s["name"] for s in read_spans(str(tmp_path))] == ["decide"]
