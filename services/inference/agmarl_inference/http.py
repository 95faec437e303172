"""The extender's HTTP server inside the inference process, and its wiring to the runtime.

- ``build_app``: the FastAPI app (extender routes under every configured path prefix, e.g. "" and
  "/ext" for ``urlPrefix: http://host:port/ext``) with a per-verb duration histogram;
- ``ExtenderServer``: uvicorn on a listening socket with TCP_NODELAY (kube-scheduler's Go client
  otherwise waits ~40 ms per call on delayed ACKs), no signal handling of its own (the
  ServiceRuntime owns SIGTERM), keep-alive longer than Go's idle connections, clean stop;
- ``watch_rollout``: the rollout mode from KV ``agmarl_config/rollout`` (a plain mode name, or JSON
  ``{"mode": ...}``), watched and re-read every ``resync_s``: switched at run time, no restart;
- ``load_binder``: a Kubernetes Binding creator from the one client loader (``agmarl_common.kube.client``);
- ``setup_extender`` (before ``rt.start()``) and ``start_extender`` (after) wire it all up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import nats.errors
import uvicorn
from fastapi import FastAPI
from nats.js.kv import KV_DEL, KV_PURGE

from agmarl_common.kube import client as kubeclient
from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_inference.extender import BIND_TIMEOUT_S, MODES, ExtenderMetrics, ExtenderService, PolicySource
from agmarl_inference.extender_log import DecisionPublisher, decision_subject
from agmarl_common.core.cluster.view import ClusterView
from agmarl_inference.extender_routes import VERBS, router
from agmarl_inference.settings import InferenceSettings

log = logging.getLogger("agmarl.inference.http")
KEEP_ALIVE_S = 120  # > Go's 90 s idle-connection timeout: the scheduler closes first, no reset races


# ---------------------------------------------------------------------------------------------
# App and server

class VerbTimer:
    """ASGI middleware: ``agmarl_extender_request_duration_seconds{verb}`` from first byte to last."""

    def __init__(self, app: Any, metrics: ExtenderMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        verb = scope.get("path", "").rstrip("/").rsplit("/", 1)[-1] if scope.get("type") == "http" else ""
        if verb not in VERBS:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.metrics.duration.labels(verb=verb).observe(time.perf_counter() - started)


def build_app(ext: ExtenderService, prefixes: list[str] | None = None) -> FastAPI:
    # FastAPI's own HTTP spans, metrics and logs are off: each verb has its span (one trace per pod) and
    # its duration histogram already, and they cost ~0.3 ms per request on the scheduling path.
    app = FastAPI(title="agmarl kube-scheduler extender", openapi_url=None, docs_url=None, redoc_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.extender = ext
    for prefix in prefixes if prefixes is not None else ext.settings.extender_path_prefixes:
        app.include_router(router, prefix=prefix.rstrip("/"))
    app.add_middleware(VerbTimer, metrics=ext.metrics)
    return app


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # the ServiceRuntime handles SIGTERM/SIGINT
        yield


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening, non-blocking TCP socket with TCP_NODELAY (inherited by accepted sockets)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ExtenderServer:
    """uvicorn serving ``app`` in the current event loop: ``port = await start()``, ``await stop()``."""

    def __init__(self, app: FastAPI, host: str, port: int):
        self.app, self.host, self.port = app, host, port
        self.sock: socket.socket | None = None
        self.server: _Server | None = None
        self.task: asyncio.Task | None = None

    async def start(self, timeout: float = 5.0) -> int:
        self.sock = listen_socket(self.host, self.port)
        self.port = int(self.sock.getsockname()[1])
        config = uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off", http="h11",
                                timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=2, server_header=False)
        self.server = _Server(config)
        self.task = asyncio.get_running_loop().create_task(self.serve(), name="extender http")
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self.task.done():
                self.task.result()  # raises what stopped it
                raise RuntimeError("extender HTTP server exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"extender HTTP server not started within {timeout}s")
            await asyncio.sleep(0.01)
        return self.port

    async def serve(self) -> None:
        try:
            await self.server.serve(sockets=[self.sock])
        except asyncio.CancelledError:  # runtime shutdown: close listeners and connections, then go
            self.server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.shutdown(sockets=[self.sock]), 3.0)
            raise
        finally:
            self.sock.close()

    async def stop(self, timeout: float = 3.0) -> None:
        if self.server is None or self.task is None:
            return
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except asyncio.TimeoutError:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


# ---------------------------------------------------------------------------------------------
# Rollout mode from KV

def parse_mode(raw: bytes | None) -> str | None:
    """KV value -> mode: b"hybrid" or b'{"mode": "hybrid"}'; None when absent or not a known mode."""
    if not raw:
        return None
    text = raw.decode("utf-8", errors="replace").strip()
    if text.startswith("{"):
        try:
            text = str(json.loads(text).get("mode", ""))
        except (ValueError, AttributeError):
            return None
    text = text.strip().lower()
    return text if text in MODES else None


async def watch_rollout(bus: Any, source: PolicySource, default_mode: str, resync_s: float = 30.0,
                        retry_s: float = 1.0) -> None:
    """Apply every change of the ``rollout`` key to ``source`` until cancelled. A deleted key goes
    back to ``default_mode``; an invalid value is logged and ignored; NATS trouble is retried."""
    last: list[bytes | None] = [None]

    def apply(raw: bytes | None, deleted: bool = False) -> None:
        if raw == last[0] and not deleted:
            return
        last[0] = raw
        mode = default_mode if deleted else parse_mode(raw)
        if mode is None:
            log.warning("rollout key %r is not one of %s; keeping %s", raw, MODES, source.mode)
        elif mode != source.mode:
            source.set_mode(mode, "KV agmarl_config/rollout")

    while True:
        watcher = None
        try:
            kv = await bus.kv(subjects.CONFIG_BUCKET)
            watcher = await kv.watch(subjects.KEY_ROLLOUT)
            while True:
                try:
                    entry = await watcher.updates(timeout=resync_s)
                except nats.errors.TimeoutError:  # quiet: re-read, in case the watch missed a change
                    apply(await bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ROLLOUT))
                    continue
                if entry is None:  # end of the initial values
                    continue
                if entry.operation in (KV_DEL, KV_PURGE):
                    apply(None, deleted=True)
                else:
                    apply(entry.value)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - NATS down or the bucket missing: retry
            log.debug("rollout watch: %s: %s (retrying)", type(exc).__name__, exc)
            await asyncio.sleep(retry_s)
        finally:
            if watcher is not None:
                with contextlib.suppress(Exception):
                    await watcher.stop()


# ---------------------------------------------------------------------------------------------
# Binding through the Kubernetes API

class KubeBinder:
    """Creates the pods/binding subresource, as kube-scheduler's DefaultBinder does."""

    def __init__(self, api_client: Any):
        from kubernetes import client
        self.client = client
        self.api = client.CoreV1Api(api_client)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        c = self.client
        body = c.V1Binding(metadata=c.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
                           target=c.V1ObjectReference(api_version="v1", kind="Node", name=node))
        # the API answers a Status, which the generated model cannot deserialise: keep it raw
        self.api.create_namespaced_pod_binding(name=name, namespace=namespace, body=body, _preload_content=False,
                                               _request_timeout=BIND_TIMEOUT_S)


def load_binder(kubeconfig: str = "", context: str = "", environ: Mapping[str, str] | None = None) -> KubeBinder | None:
    """A binder from ``kubeclient.load_api_client`` (the kubeconfig setting, $KUBECONFIG, in-cluster, then
    ~/.kube/config); None when there are no credentials anywhere."""
    if kubeclient.resolve(kubeconfig, environ)[0] == "none":
        return None
    return KubeBinder(kubeclient.load_api_client(kubeconfig, context, environ))


# ---------------------------------------------------------------------------------------------
# Wiring

@dataclass
class Extender:
    service: ExtenderService
    view: ClusterView
    publisher: DecisionPublisher
    server: ExtenderServer | None = None
    port: int = 0


SWITCH_INTERVAL_S = 0.0005


def setup_extender(rt: ServiceRuntime, source: PolicySource, settings: InferenceSettings, view: ClusterView,
                   decisions: Any = None, binder: KubeBinder | None = None) -> Extender:
    """Before ``rt.start()``: metrics, publisher and service over the process's cluster view."""
    metrics = ExtenderMetrics(rt.registry, decisions)

    def connected() -> bool:
        return rt.bus is not None and rt.bus.is_connected

    async def publish(decision: m.Decision) -> None:
        await rt.publish(decision_subject(decision), decision, js=True, msg_id=decision.decision_id)

    publisher = DecisionPublisher(publish, metrics.dropped, rt.tracer, connected)
    if binder is None:
        try:
            binder = load_binder(settings.kubeconfig, settings.kube_context)
        except Exception as exc:  # noqa: BLE001 - a broken kubeconfig must not stop the service
            rt.log.warning("no Kubernetes binder: %s: %s", type(exc).__name__, exc)
    service = ExtenderService(settings, source, view, metrics, rt.tracer, publisher, connected, binder)
    return Extender(service, view, publisher)


async def start_extender(rt: ServiceRuntime, ext: Extender, settings: InferenceSettings) -> int:
    """After ``rt.start()``: publisher and rollout watch as runtime tasks, then the HTTP server.
    Returns the bound port (0 when the port could not be bound: the loop keeps running without it)."""
    ext.service.tracer = rt.tracer  # the SDK tracer exists only once the runtime has started
    # A thread holding the GIL (a decision-log entry built, a model scored) keeps it up to the switch
    # interval (5 ms by default) before the event loop gets it back to answer kube-scheduler: 0.5 ms.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    ext.publisher.tracer = rt.tracer
    rt.spawn(ext.publisher.run(), name="extender decision publisher")
    rt.spawn(ext.service.sweep_loop(), name="extender unbound decisions")
    rt.spawn(watch_rollout(rt.bus, ext.service.source, settings.rollout_mode), name="rollout watch")
    ext.server = ExtenderServer(build_app(ext.service), settings.http_host, settings.http_port)
    try:
        ext.port = await ext.server.start()
    except OSError as exc:
        rt.log.error("extender HTTP server not started on %s:%d: %s", settings.http_host, settings.http_port, exc)
        ext.server = None
        return 0
    rt.spawn(_serve_until_cancelled(ext), name="extender http")
    rt.log.info("extender listening on http://%s:%d prefixes=%s budget_ms=%d", settings.http_host, ext.port,
                settings.extender_path_prefixes, settings.extender_budget_ms)
    return ext.port


async def _serve_until_cancelled(ext: Extender) -> None:
    """Owned by the runtime: on shutdown (cancel) the server stops and the thread pools close."""
    try:
        await asyncio.shield(ext.server.task)
    finally:
        if ext.server is not None and not ext.server.task.done():
            await ext.server.stop()
        ext.service.close()
