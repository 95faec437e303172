"""The batch binder's Bindings in a process of their own, so that deciding and binding use two cores.

One Binding costs about as much CPU as deciding a pod (the official client's request building, urllib3 and
``http.client``: ~0.5-1 ms). In the deciding process they shared one GIL with ``decide_batch``; here they run
in ``python -m agmarl_inference.bindworker``, a child started by the binder (``BindWorker``), with a pool of
threads over the client's keep-alive connection pool.

The wire between the two is a pair of pipes (the child's stdin and stdout) carrying frames: a 4-byte
big-endian length, then the payload.
- first frame, parent -> child: pickled ``Hello`` (the API client's ``Configuration``, or the kubeconfig and
  context to load one from; threads; the per-request timeout); the child answers ``[]`` once it is ready;
- then parent -> child: JSON ``[[ticket, namespace, name, node], ...]`` (the names already checked with
  ``kube.names.check_name``); child -> parent: JSON ``[[ticket, status, reason], ...]``, status the HTTP status
  (2xx: bound) or 0 for a request that got no answer (timeout, connection error; ``reason`` says which).

The child ends with its parent (``PR_SET_PDEATHSIG``, and its stdin closing); it ends by itself when its stdin
closes, after the Bindings it holds are answered (``BindWorker.close`` drains it that way). In the parent, a
child that dies fails the Bindings it held (``WorkerGone``: the binder retries them as any failed request)
and is started again, each time logged as an error and counted; one that cannot start raises.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pickle
import queue
import signal
import struct
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agmarl_common.kube.client import load_api_client
from agmarl_common.kube.names import check_name
from agmarl_common.runtime.lifetime import die_with_parent

BINDING_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/binding"


def create_binding(api: client.CoreV1Api, namespace: str, name: str, node: str, timeout: float) -> None:
    """POST pods/{name}/binding through ``api``; raises ApiException on a
    non-2xx answer, ``kube.names.InvalidName`` (before any request) for a name Kubernetes would refuse. The request is
    built and sent by the official client's ``ApiClient`` (``param_serialize`` and ``call_api``: its host,
    auth, default headers, path quoting, REST layer and timeouts) as ``create_namespaced_pod_binding`` does,
    minus its per-call pydantic validation and ``V1Binding`` models: the body is a plain dict, the names are
    checked here. The raw answer is read, not deserialized (the API answers a ``Status``, no ``V1Binding``)."""
    body = {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": check_name("pod", name), "namespace": check_name("namespace", namespace)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": check_name("node", node)}}
    ac = api.api_client
    request = ac.param_serialize("POST", BINDING_PATH, path_params={"namespace": namespace, "name": name},
                                 header_params={"Accept": "application/json", "Content-Type": "application/json"},
                                 body=body, auth_settings=["BearerToken"])
    resp = ac.call_api(*request, _request_timeout=timeout)
    try:
        resp.read()
    finally:
        resp.response.release_conn()
    if not 200 <= resp.status <= 299:
        raise ApiException.from_response(http_resp=resp, body=None, data=None)


# --- the wire -------------------------------------------------------------------------------------

_LEN = struct.Struct(">I")


def frame(payload: bytes) -> bytes:
    return _LEN.pack(len(payload)) + payload


def read_frame(stream: IO[bytes]) -> bytes | None:
    """The next frame's payload from a blocking binary stream; None at its end."""
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    payload = stream.read(_LEN.unpack(head)[0])
    return payload


@dataclass(frozen=True)
class Hello:
    """What the child needs: an API client ``Configuration`` (pickled with this), or where to load one from."""
    configuration: Any = None  # kubernetes.client.Configuration; None: load_api_client(kubeconfig, context)
    kubeconfig: str = ""
    context: str = ""
    threads: int = 8
    timeout: float = 5.0  # per request


# --- the child ------------------------------------------------------------------------------------

def api_from(hello: Hello) -> client.CoreV1Api:
    if hello.configuration is not None:
        return client.CoreV1Api(client.ApiClient(hello.configuration))
    return client.CoreV1Api(load_api_client(hello.kubeconfig, hello.context))


def bind_one(api: client.CoreV1Api, timeout: float, ticket: int, namespace: str, name: str, node: str) -> list:
    """[ticket, status, reason] of one Binding (status 0: no answer)."""
    try:
        create_binding(api, namespace, name, node, timeout)
    except ApiException as exc:
        return [ticket, int(exc.status or 0), str(exc.reason or "")]
    except Exception as exc:  # noqa: BLE001 - timeouts and connection errors come in many types
        return [ticket, 0, f"{type(exc).__name__}: {exc}"]
    return [ticket, 201, ""]


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """The child's loop: Bindings in from ``inp``, results out on ``out``, until ``inp`` ends; then the
    Bindings already taken are finished and answered before it returns."""
    hello = pickle.loads(read_frame(inp) or b"")
    api = api_from(hello)
    results: queue.SimpleQueue = queue.SimpleQueue()

    def send() -> None:  # one writer: every result ready so far goes out in one frame
        while (item := results.get()) is not None:
            batch = [item]
            while True:
                try:
                    more = results.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    out.write(frame(json.dumps(batch).encode()))
                    out.flush()
                    return
                batch.append(more)
            out.write(frame(json.dumps(batch).encode()))
            out.flush()

    sender = threading.Thread(target=send, name="bind-results", daemon=True)
    sender.start()
    out.write(frame(b"[]"))  # ready
    out.flush()
    with ThreadPoolExecutor(hello.threads, thread_name_prefix="bind") as pool:
        while (payload := read_frame(inp)) is not None:
            for ticket, namespace, name, node in json.loads(payload):
                pool.submit(bind_one, api, hello.timeout, ticket, namespace, name, node).add_done_callback(
                    lambda f: results.put(f.result()))
    results.put(None)
    sender.join()


def main() -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the parent stops it by closing stdin
    out = os.fdopen(os.dup(1), "wb")  # stdout carries frames only: anything printed goes to stderr
    os.dup2(2, 1)
    serve(sys.stdin.buffer, out)
    out.close()


# --- the parent -----------------------------------------------------------------------------------


class WorkerGone(ConnectionError):
    """The bind worker ended (or could not start) before it answered this Binding."""


GONE = -1  # status of a Binding whose child ended before answering (parent side only, never on the wire)


class BindWorker:
    """The parent's handle on the bind worker process: ``await bind(namespace, name, node)`` returns when the
    Binding was accepted and raises ``ApiException`` (the API's answer), ``ConnectionError`` (no answer) or
    ``WorkerGone``. Bindings asked for in one turn of the event loop go to the child in one frame. A child
    that ends unexpectedly is started again (``on_restart(exit code)`` is called, an error logged); while none
    runs, ``bind`` starts one, or raises ``WorkerGone`` when that fails."""

    START_TIMEOUT_S = 120.0

    def __init__(self, hello: Hello, log: Any, on_restart: Callable[[int | None], None] | None = None):
        self.hello, self.log, self.on_restart = hello, log, on_restart
        self.proc: asyncio.subprocess.Process | None = None
        self.waiting: dict[int, asyncio.Future] = {}  # ticket -> (status, reason)
        self.outgoing: list[list] = []  # asked for, not yet written to the child
        self.tickets = itertools.count(1)
        self.starting: asyncio.Task | None = None  # a start in progress
        self.reader: asyncio.Task | None = None  # the running child's answers
        self._ready = False
        self._closing = False
        self._flush_scheduled = False

    @property
    def alive(self) -> bool:
        return self._ready and self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        """Start a child and wait until it is ready; raises ``WorkerGone`` if it ends first or takes longer
        than ``START_TIMEOUT_S``."""
        self._ready = False
        proc = self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agmarl_inference.bindworker", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE)
        proc.stdin.write(frame(pickle.dumps(self.hello)))
        try:
            head = await asyncio.wait_for(proc.stdout.readexactly(_LEN.size), self.START_TIMEOUT_S)
            await proc.stdout.readexactly(_LEN.unpack(head)[0])  # "[]": ready
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
            if proc.returncode is None:
                proc.kill()
            code = await proc.wait()
            raise WorkerGone(f"bind worker did not start (exit code {code}, {type(exc).__name__})") from None
        self._ready = True
        self.reader = asyncio.get_running_loop().create_task(self._read(proc), name="bind-worker-results")
        self.flush()

    def submit(self, namespace: str, name: str, node: str) -> asyncio.Future:
        """Ask for a Binding; the future gets ``(status, reason)`` (``check`` it). It goes to the child with the
        others asked for before the next ``flush`` (called soon by itself, or by the caller at once)."""
        loop = asyncio.get_running_loop()
        if not self.alive and not self._closing and (self.starting is None or self.starting.done()):
            self.starting = loop.create_task(self._start_again(), name="bind-worker-start")
        fut = loop.create_future()
        if self._closing:
            fut.set_result((GONE, "bind worker closed"))
            return fut
        ticket = next(self.tickets)
        self.waiting[ticket] = fut
        fut.add_done_callback(lambda _, t=ticket: self.waiting.pop(t, None))
        self.outgoing.append([ticket, namespace, name, node])
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self.flush)
        return fut

    @staticmethod
    def check(answer: tuple[int, str]) -> None:
        """Raise for a Binding that was not accepted: ``ApiException`` (the API's answer), ``WorkerGone`` or
        ``ConnectionError`` (no answer)."""
        status, reason = answer
        if 200 <= status <= 299:
            return
        if status == GONE:
            raise WorkerGone(reason)
        if status:
            raise ApiException(status=status, reason=reason)
        raise ConnectionError(reason)

    async def bind(self, namespace: str, name: str, node: str) -> None:
        """One Binding, sent soon; returns once accepted, raises as ``check``."""
        self.check(await self.submit(namespace, name, node))

    def flush(self) -> None:
        """Send what was asked for (once a child is ready: at its start otherwise)."""
        self._flush_scheduled = False
        if self.outgoing and self.alive:  # else: sent once the (next) child is ready
            batch, self.outgoing = self.outgoing, []
            self.proc.stdin.write(frame(json.dumps(batch).encode()))

    def _fail_waiting(self, reason: str) -> None:
        self.outgoing.clear()
        for fut in list(self.waiting.values()):
            if not fut.done():
                fut.set_result((GONE, reason))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        """Answers from ``proc`` until it ends; then its unanswered Bindings fail (their callers retry them) and,
        unless closing, a new child is started."""
        try:
            while True:
                head = await proc.stdout.readexactly(_LEN.size)
                for ticket, status, reason in json.loads(await proc.stdout.readexactly(_LEN.unpack(head)[0])):
                    fut = self.waiting.get(ticket)
                    if fut is not None and not fut.done():
                        fut.set_result((status, reason))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        code = await proc.wait()
        self._ready = False
        self._fail_waiting(f"bind worker ended (exit code {code}) before answering")
        if self._closing:
            return
        self.log.error("bind worker ended unexpectedly (exit code %s); starting a new one", code)
        if self.on_restart is not None:
            self.on_restart(code)
        self.starting = asyncio.get_running_loop().create_task(self._start_again(), name="bind-worker-start")

    async def _start_again(self) -> None:
        try:
            await self.start()
        except Exception as exc:  # noqa: BLE001 - logged loudly; the Bindings waiting fail and are retried
            self.log.error("bind worker could not be started: %s", exc)
            self._fail_waiting(str(exc))

    async def close(self, timeout: float) -> None:
        """Let the child finish the Bindings it holds (at most ``timeout`` s), then end it."""
        self._closing = True
        if self.starting is not None and not self.starting.done():
            self.starting.cancel()
        proc = self.proc
        if proc is None or proc.returncode is not None:
            self._fail_waiting("bind worker closed")
            return
        self.flush()
        proc.stdin.close()  # the child answers what it holds, then ends; its last answers are read
        if self.reader is not None:
            await asyncio.wait([self.reader], timeout=timeout)
        if proc.returncode is None:
            self.log.warning("bind worker still busy after %.1f s; ended", timeout)
            proc.kill()
            await proc.wait()
        self._fail_waiting("bind worker closed")


if __name__ == "__main__":
    main()
