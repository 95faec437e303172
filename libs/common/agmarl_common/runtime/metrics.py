"""Prometheus helpers: a registry per service, an HTTP exporter on a chosen/free port, and the
metric families the service middleware maintains."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from agmarl_common.runtime.subjects import subject_label

_SERVERS: dict[int, tuple[WSGIServer, threading.Thread]] = {}
_LOCK = threading.Lock()

CHILDREN_LIMIT = 1024  # label values remembered per family (Children) and subjects per label cache
HANDLING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no access log on stderr
        pass


def new_registry(process_metrics: bool = True) -> CollectorRegistry:
    """A fresh registry (nothing global); with process_* metrics unless disabled."""
    registry = CollectorRegistry(auto_describe=True)
    if process_metrics:
        ProcessCollector(registry=registry)
    return registry


Route = Callable[[], tuple[int, dict]]  # -> (HTTP status, JSON body), called on the server's thread


def _with_routes(app: Callable, routes: Mapping[str, Route]) -> Callable:
    """WSGI: ``routes`` (path -> JSON answer, e.g. /healthz and /readyz) before the metrics app."""
    def routed(environ: dict, start_response: Callable) -> list[bytes]:
        route = routes.get(environ.get("PATH_INFO", ""))
        if route is None:
            return app(environ, start_response)
        code, body = route()
        data = json.dumps(body).encode()
        start_response(f"{code} {'OK' if code == 200 else 'Service Unavailable'}",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]
    return routed


def start_metrics_server(registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0,
                         routes: Mapping[str, Route] | None = None) -> int:
    """Serve ``registry`` on http://host:port/metrics in a daemon thread; returns the bound port.
    ``routes``: extra JSON endpoints (the runtime's /healthz and /readyz).

    Same server as prometheus_client.start_http_server, with a short poll interval so that
    ``stop_metrics_server`` returns in ~50 ms instead of up to 0.5 s.
    """
    app = make_wsgi_app(registry)
    server = make_server(host, port, _with_routes(app, routes) if routes else app, ThreadingWSGIServer,
                         handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name=f"metrics-{server.server_port}", daemon=True)
    thread.start()
    bound = int(server.server_port)
    with _LOCK:
        _SERVERS[bound] = (server, thread)
    return bound


def stop_metrics_server(port: int, timeout: float = 2.0) -> None:
    """Stop the server started on ``port`` (no-op when none)."""
    with _LOCK:
        entry = _SERVERS.pop(port, None)
    if entry is None:
        return
    server, thread = entry
    server.shutdown()
    server.server_close()
    thread.join(timeout)


class Memo(dict):
    """Values computed once per key (``memo[key]``), all forgotten at once when ``limit`` keys are held (many
    distinct keys, e.g. reply inboxes: one subject per request). The one bounded memo of this module."""

    def __init__(self, compute: Callable, limit: int = CHILDREN_LIMIT):
        super().__init__()
        self.compute, self.limit = compute, limit

    def __missing__(self, key):
        if len(self) >= self.limit:
            self.clear()
        value = self[key] = self.compute(key)
        return value


class Children:
    """A labelled family's children by label values, each looked up once: ``labels()`` checks the values
    and takes the family's lock on every call, a few microseconds per message on a hot path. Only for
    families never ``clear()``-ed or ``remove()``-d (a child removed from its family would count unseen)."""

    def __init__(self, family: Counter | Histogram, limit: int = CHILDREN_LIMIT):
        self.family = family
        self._kids = Memo(lambda values: family.labels(*values), limit)

    def __call__(self, *values: str):
        return self._kids[values]


class MiddlewareMetrics:
    """The families every ServiceRuntime maintains; ``subject`` labels are collapsed."""

    def __init__(self, registry: CollectorRegistry, service: str):
        self.service = service
        self.received = Counter("agmarl_messages_received", "Messages decoded and handed to a handler",
                                ["service", "subject"], registry=registry)
        self.rejected = Counter("agmarl_messages_rejected", "Messages rejected before the handler",
                                ["service", "subject", "reason"], registry=registry)
        self.published = Counter("agmarl_messages_published", "Messages published",
                                 ["service", "subject"], registry=registry)
        self.handler_errors = Counter("agmarl_handler_errors", "Handlers that raised an exception",
                                      ["service", "subject"], registry=registry)
        self.duration = Histogram("agmarl_message_handling_duration_seconds", "Handler wall time",
                                  ["service", "subject"], buckets=HANDLING_BUCKETS, registry=registry)
        self.dead_letters = Counter("agmarl_dead_letters", "Dead letters published",
                                    ["service"], registry=registry)
        # per message: the children of a subject (its collapsed label computed once)
        self._received, self._published, self._duration = (Children(f) for f in (self.received, self.published,
                                                                                  self.duration))
        self._labels = Memo(subject_label)

    def label(self, subject: str) -> str:
        """``subject_label(subject)``, remembered (bounded: reply inboxes are one subject per request)."""
        return self._labels[subject]

    def on_received(self, subject: str) -> None:
        self._received(self.service, self.label(subject)).inc()

    def on_rejected(self, subject: str, reason: str) -> None:
        self.rejected.labels(self.service, subject_label(subject), reason).inc()

    def on_published(self, subject: str) -> None:
        self._published(self.service, self.label(subject)).inc()

    def on_handler_error(self, subject: str) -> None:
        self.handler_errors.labels(self.service, subject_label(subject)).inc()

    def on_dead_letter(self) -> None:
        self.dead_letters.labels(self.service).inc()

    def observe(self, subject: str, seconds: float) -> None:
        self._duration(self.service, self.label(subject)).observe(seconds)


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    """Current value of one sample (0.0 when absent): e.g. sample(r, "agmarl_messages_rejected_total", {...})."""
    value = registry.get_sample_value(name, labels or {})
    return float(value) if value is not None else 0.0
