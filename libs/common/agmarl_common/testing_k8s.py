"""A STAND-IN Kubernetes API server for tests: real HTTP on 127.0.0.1, just enough of the core/v1 API.

There is no Kubernetes API in the test environment, so the state-collector's watch and the batch
binder are tested against this stand-in with the official ``kubernetes`` client pointed at it. It is
not Kubernetes: no auth, no admission, no field selectors, one global resourceVersion counter.

Served:
- ``GET /api/v1/nodes`` and ``GET /api/v1/pods`` -- a list with ``metadata.resourceVersion``;
  with ``watch=true`` a chunked stream of JSON lines (ADDED / MODIFIED / DELETED / BOOKMARK / ERROR)
  from the requested resourceVersion on, ending after ``timeoutSeconds``;
- ``GET /api/v1/namespaces/{ns}/pods/{name}``;
- ``POST /api/v1/namespaces/{ns}/pods/{name}/binding`` -- sets ``spec.nodeName`` (409 when the pod
  is already bound, 404 when pod or node is unknown) and answers a ``Status`` like the real server.

Test controls: ``add_node`` / ``add_pod`` / ``modify_pod`` / ``delete_pod`` / ``set_phase`` emit watch
events; ``bookmark()`` sends a BOOKMARK to every watcher that allowed them; ``expire()`` forgets the
event history so a watch from an older resourceVersion is answered 410 Gone (``gone_as_event``
chooses an ERROR event in a 200 stream instead of an HTTP 410); ``drop_watches()`` cuts every open
watch connection mid-stream; ``fail_watches(n, status)`` and ``fail_bindings(n, status)`` answer the
next n requests with an error. ``requests`` records every request (time, method, path, query).

The JSON builders live in ``testing_k8s_objects`` and the HTTP handler in ``testing_k8s_http``;
both are re-exported here.
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from agmarl_common.testing_k8s_http import _Handler
from agmarl_common.testing_k8s_objects import (  # noqa: F401  (builders: re-exported, part of this module's API)
    KINDS, Request, _key, _truthy, node_json, pod_json, status_json)


class StandInApiServer:
    """The stand-in (see the module docstring). ``start()`` / ``stop()``, or use it as a context manager."""

    def __init__(self, gone_as_event: bool = False):
        self.gone_as_event = gone_as_event
        self.rv = 100
        self.objects: dict[str, dict[str, dict]] = {"nodes": {}, "pods": {}}
        self.history: list[tuple[int, str, str, dict]] = []  # (rv, plural, type, object)
        self.oldest_rv = self.rv  # watches from below this get 410 Gone
        self.bindings: list[tuple[str, str]] = []  # (namespace/name, node) accepted
        self.requests: list[Request] = []
        self._fail_watches: list[tuple[int, str]] = []  # (status, plural or "" = any)
        self._fail_bindings: list[int] = []
        self._drop_generation = 0
        self._gone_generation = 0
        self._cond = threading.Condition()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "StandInApiServer":
        server = self

        class Handler(_Handler):
            standin = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="standin-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5.0)

    def __enter__(self) -> "StandInApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() first"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def write_kubeconfig(self, path: str | Path) -> Path:
        """A kubeconfig whose current context points at this stand-in (token auth, no TLS)."""
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
               "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
               "users": [{"name": "standin", "user": {"token": "standin-token"}}],
               "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}]}
        path = Path(path)
        path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        return path

    # --- state changes (each emits a watch event) ----------------------------------------------

    def _emit(self, plural: str, etype: str, obj: dict) -> int:
        with self._cond:
            self.rv += 1
            obj = json.loads(json.dumps(obj))
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
            key = _key(obj)
            if etype == "DELETED":
                self.objects[plural].pop(key, None)
            else:
                self.objects[plural][key] = obj
            self.history.append((self.rv, plural, etype, obj))
            self._cond.notify_all()
            return self.rv

    def add_node(self, obj: dict) -> int:
        return self._emit("nodes", "MODIFIED" if _key(obj) in self.objects["nodes"] else "ADDED", obj)

    def delete_node(self, name: str) -> int:
        return self._emit("nodes", "DELETED", self.objects["nodes"][name])

    def add_pod(self, obj: dict) -> int:
        return self._emit("pods", "MODIFIED" if _key(obj) in self.objects["pods"] else "ADDED", obj)

    def modify_pod(self, key: str, **changes: Any) -> int:
        """Shallow edits: ``node_name=...`` and/or ``phase=...``."""
        with self._cond:
            obj = json.loads(json.dumps(self.objects["pods"][key]))
        if "node_name" in changes:
            obj["spec"]["nodeName"] = changes["node_name"]
        if "phase" in changes:
            obj["status"]["phase"] = changes["phase"]
        return self._emit("pods", "MODIFIED", obj)

    def set_phase(self, key: str, phase: str) -> int:
        return self.modify_pod(key, phase=phase)

    def delete_pod(self, key: str) -> int:
        return self._emit("pods", "DELETED", self.objects["pods"][key])

    def bookmark(self) -> int:
        """Advance the global resourceVersion (as other resources would) and bookmark every watch."""
        with self._cond:
            self.rv += 1
            for plural in KINDS:
                self.history.append((self.rv, plural, "BOOKMARK",
                                     {"kind": KINDS[plural], "apiVersion": "v1",
                                      "metadata": {"resourceVersion": str(self.rv)}}))
            self._cond.notify_all()
            return self.rv

    def expire(self, tell_watchers: bool = False) -> None:
        """Compact history: any watch from an older resourceVersion gets 410 Gone. With
        ``tell_watchers`` the open watches receive an ERROR event (code 410) and end."""
        with self._cond:
            self.history.clear()
            self.rv += 1  # the compaction itself; lists from now on return a valid resourceVersion
            self.oldest_rv = self.rv
            if tell_watchers:
                self._gone_generation += 1
            self._cond.notify_all()

    def drop_watches(self) -> None:
        """Cut every open watch connection without ending the chunked stream."""
        with self._cond:
            self._drop_generation += 1
            self._cond.notify_all()

    def fail_watches(self, n: int, status: int = 500, plural: str = "") -> None:
        """Answer the next ``n`` watch requests (of ``plural`` only, when given) with ``status``."""
        with self._cond:
            self._fail_watches.extend([(status, plural)] * n)

    def fail_bindings(self, n: int, status: int = 500) -> None:
        with self._cond:
            self._fail_bindings.extend([status] * n)

    def watch_requests(self, plural: str) -> list[Request]:
        with self._cond:
            return [r for r in self.requests if r.path == f"/api/v1/{plural}" and _truthy(r.query.get("watch"))]

    def list_requests(self, plural: str) -> list[Request]:
        with self._cond:
            return [r for r in self.requests if r.path == f"/api/v1/{plural}" and not _truthy(r.query.get("watch"))]

    def pod(self, key: str) -> dict:
        with self._cond:
            return json.loads(json.dumps(self.objects["pods"][key]))

