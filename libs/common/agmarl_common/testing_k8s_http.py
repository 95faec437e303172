"""The HTTP handler of the stand-in Kubernetes API server (``agmarl_common.testing_k8s``), for tests.

``StandInApiServer.start`` subclasses ``_Handler`` with ``standin`` set to the server whose state
it serves: lists, chunked watch streams, single pods and bindings, as described in ``testing_k8s``.
"""

from __future__ import annotations

import json
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from agmarl_common.testing_k8s_objects import KINDS, Request, _truthy, status_json

if TYPE_CHECKING:
    from agmarl_common.testing_k8s import StandInApiServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
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
