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
next n requests with an error; ``hold_bindings(n)`` keeps the next n binding requests unanswered until
``release_bindings()``. ``requests`` records every request (time, method, path, query).

The JSON builders live in ``testing_k8s_objects`` (re-exported here); the HTTP handler is at the end of
this module.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from agmarl_testing.k8s_objects import (  # noqa: F401  (builders: re-exported, part of this module's API)
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
        self._holds = 0  # binding requests still to hold
        self._held = 0  # binding requests waiting for release_bindings()
        self._release = threading.Event()
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

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="standin-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()  # held bindings end
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

    def hold_bindings(self, n: int) -> None:
        """Keep the next ``n`` binding requests unanswered (before anything else is done with them) until
        ``release_bindings()``; ``held`` says how many wait."""
        with self._cond:
            self._holds += n
            self._release.clear()

    def release_bindings(self) -> None:
        self._release.set()

    @property
    def held(self) -> int:
        with self._cond:
            return self._held

    def _hold(self) -> None:
        with self._cond:
            if not self._holds:
                return
            self._holds -= 1
            self._held += 1
        self._release.wait(30.0)
        with self._cond:
            self._held -= 1

    def watch_requests(self, plural: str) -> list[Request]:
        with self._cond:
            return [r for r in self.requests if r.path == f"/api/v1/{plural}" and _truthy(r.query.get("watch"))]

    def list_requests(self, plural: str) -> list[Request]:
        with self._cond:
            return [r for r in self.requests if r.path == f"/api/v1/{plural}" and not _truthy(r.query.get("watch"))]

    def pod(self, key: str) -> dict:
        with self._cond:
            return json.loads(json.dumps(self.objects["pods"][key]))


# --- the HTTP handler ------------------------------------------------------------------------------
# ``StandInApiServer.start`` subclasses ``_Handler`` with ``standin`` set to the server whose state it
# serves: lists, chunked watch streams, single pods and bindings, as described in the module docstring.


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a killed test client, a held request answered late) is not an error here."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # headers and body go out in separate writes: with Nagle on, the second waits for the client's delayed ACK
    # (~40 ms a response on loopback); kube-apiserver (Go) sets TCP_NODELAY, so this stand-in does too
    disable_nagle_algorithm = True
    standin: StandInApiServer

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet
        pass

    # --- plumbing ----------------------------------------------------------------------------

    def _send_json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> tuple[str, dict[str, str]]:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        with self.standin._cond:
            self.standin.requests.append(Request(time.monotonic(), self.command, parts.path, query))
        return parts.path, query

    # --- GET ---------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        path, query = self._record()
        s = self.standin
        segs = path.strip("/").split("/")
        if segs[:2] == ["api", "v1"] and len(segs) == 3 and segs[2] in KINDS:
            if _truthy(query.get("watch")):
                self._watch(segs[2], query)
            else:
                self._list(segs[2])
            return
        if segs[:3] == ["api", "v1", "namespaces"] and len(segs) == 6 and segs[4] == "pods":
            key = f"{segs[3]}/{segs[5]}"
            with s._cond:
                obj = s.objects["pods"].get(key)
            if obj is None:
                self._send_json(404, status_json(404, "NotFound", f'pods "{segs[5]}" not found'))
            else:
                self._send_json(200, obj)
            return
        self._send_json(404, status_json(404, "NotFound", f"the stand-in does not serve {path}"))

    def _list(self, plural: str) -> None:
        s = self.standin
        with s._cond:
            items = list(s.objects[plural].values())
            rv = str(s.rv)
        self._send_json(200, {"kind": f"{KINDS[plural]}List", "apiVersion": "v1",
                              "metadata": {"resourceVersion": rv}, "items": items})

    def _watch(self, plural: str, query: dict[str, str]) -> None:
        s = self.standin
        failure = None
        with s._cond:
            for k, (status, only) in enumerate(s._fail_watches):
                if only in ("", plural):
                    failure = status
                    del s._fail_watches[k]
                    break
        if failure is not None:
            self._send_json(failure, status_json(failure, "InternalError", "stand-in: injected watch failure"))
            return
        with s._cond:
            since = int(query.get("resourceVersion") or 0) or s.rv  # unset / "0": from now on
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
        gone = status_json(410, "Expired", f"too old resource version: {since} ({s.oldest_rv})")
        with s._cond:  # the expiry check and the generations at once: a later drop/expire reaches this watch
            expired = since < s.oldest_rv
            generations = (s._drop_generation, s._gone_generation)
        if expired and not s.gone_as_event:
            self._send_json(410, gone)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if expired:
            self._chunk({"type": "ERROR", "object": gone})
            self._end()
            return
        self._stream(plural, since, bookmarks, deadline, generations)

    def _stream(self, plural: str, since: int, bookmarks: bool, deadline: float,
                generations: tuple[int, int]) -> None:
        s = self.standin
        drop_gen, gone_gen = generations
        sent = since
        while True:
            with s._cond:
                s._cond.wait_for(lambda: s._stopping or s._drop_generation != drop_gen or s._gone_generation != gone_gen
                                 or any(rv > sent for rv, _, _, _ in s.history[-64:]), timeout=0.1)
                if s._stopping or s._drop_generation != drop_gen:
                    break
                if s._gone_generation != gone_gen:
                    gone = status_json(410, "Expired", "too old resource version")
                    events = [(0, "ERROR", gone)]
                else:
                    events = [(rv, t, o) for rv, p, t, o in s.history if rv > sent and p == plural
                              and (t != "BOOKMARK" or bookmarks)]
                    sent = max([sent] + [rv for rv, _, _, _ in s.history])
            try:
                for _, etype, obj in events:
                    self._chunk({"type": etype, "object": obj})
                if events and events[-1][1] == "ERROR":
                    self._end()
                    return
                if time.monotonic() >= deadline:
                    self._end()
                    return
            except OSError:
                return
        # dropped (or stopping): close the socket without the terminating chunk
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _chunk(self, event: dict) -> None:
        data = (json.dumps(event) + "\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True

    # --- POST binding ------------------------------------------------------------------------

    def do_POST(self) -> None:  # noqa: N802
        path, _ = self._record()
        s = self.standin
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        segs = path.strip("/").split("/")
        if segs[:3] == ["api", "v1", "namespaces"] and len(segs) == 7 and segs[4] == "pods" and segs[6] == "binding":
            ns, name = segs[3], segs[5]  # the pods/binding subresource (kube-scheduler's way)
        elif segs[:3] == ["api", "v1", "namespaces"] and len(segs) == 5 and segs[4] == "bindings":
            ns, name = segs[3], (body.get("metadata") or {}).get("name", "")  # the Binding resource
        else:
            self._send_json(404, status_json(404, "NotFound", f"the stand-in does not serve POST {path}"))
            return
        key = f"{ns}/{name}"
        s._hold()
        with s._cond:
            failure = s._fail_bindings.pop(0) if s._fail_bindings else None
        if failure is not None:
            reason = "Conflict" if failure == 409 else "InternalError"
            self._send_json(failure, status_json(failure, reason, f"stand-in: injected binding failure {failure}"))
            return
        target = (body.get("target") or {}).get("name", "")
        with s._cond:
            pod = s.objects["pods"].get(key)
            known_node = target in s.objects["nodes"]
        if pod is None or not known_node:
            what = f'pods "{name}"' if pod is None else f'nodes "{target}"'
            self._send_json(404, status_json(404, "NotFound", f"{what} not found"))
            return
        if pod["spec"].get("nodeName"):
            self._send_json(409, status_json(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": '
                                                              f'pod {name} is already assigned to node '
                                                              f'"{pod["spec"]["nodeName"]}"'))
            return
        s.modify_pod(key, node_name=target)
        with s._cond:
            s.bindings.append((key, target))
        self._send_json(201, status_json(201, "", ""))
