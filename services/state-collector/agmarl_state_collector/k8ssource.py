"""The Kubernetes source: list + watch Nodes and Pods with the official ``kubernetes`` client.

One thread per kind (the client is synchronous) lists, then watches from the list's
resourceVersion (``allow_watch_bookmarks=True``, ``timeout_seconds``), and hands every item to
the asyncio loop through a bounded ``asyncio.Queue`` (``run_coroutine_threadsafe``: a full queue
blocks the watch thread, nothing is dropped). The loop side applies items to a ``KubeCache``
(single-threaded, no locks) and calls the app back with the changes.

resourceVersion bookkeeping: every event advances it, BOOKMARKs included; a watch that ends
normally (server timeout) resumes from it. 410 Gone -- an HTTP 410 or an ERROR event with code
410 -- means the history is compacted: relist, then watch again. Any other failure (connection
dropped, 5xx, timeout) reconnects after an exponential backoff with jitter, bounded by
``backoff_max``, reset once the API answers again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from agmarl_state_collector.k8scache import Change, KubeCache, NodeConverter, PodConverter

log = logging.getLogger("agmarl.state-collector.k8s")
KINDS = ("nodes", "pods")


@dataclass(frozen=True)
class WatchConfig:
    timeout_seconds: int = 300  # server-side watch timeout; the watch then resumes from the last rv
    request_timeout: float = 30.0  # connect timeout, and read slack beyond timeout_seconds
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    queue_size: int = 1000
    max_batch: int = 500  # items applied per loop wake-up before calling back


@dataclass
class Backoff:
    """Exponential backoff with full jitter in [delay/2, delay]: base, 2*base, ... capped at ``cap``."""

    base: float
    cap: float
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next(self) -> float:
        delay = min(self.cap, self.base * (2 ** min(self.failures, 30)))
        self.failures += 1
        return delay / 2 + self.rng.random() * delay / 2

    def reset(self) -> None:
        self.failures = 0


@dataclass
class SourceStats:
    lists: int = 0
    relists: int = 0  # lists after a 410 Gone
    reconnects: int = 0  # watches reopened after a failure
    events: int = 0
    bookmarks: int = 0
    errors: int = 0


class RawWatch(watch.Watch):
    """The official Watch without model deserialization: events carry the API's JSON dicts, and
    ERROR events still turn into ``ApiException`` (the ``deserialize=False`` path of this client
    loses the ERROR object)."""

    def get_return_type(self, func: Callable) -> None:  # noqa: ARG002
        return None


OnChanges = Callable[[list[Change]], Awaitable[None]]


class KubernetesSource:
    """``start(loop)`` the watch threads, ``await run(on_changes)`` on the loop, ``stop()`` at the end."""

    def __init__(self, api_client: client.ApiClient, pod_from_api: PodConverter, node_from_api: NodeConverter,
                 cfg: WatchConfig = WatchConfig(), rng: random.Random | None = None):
        self.api = client.CoreV1Api(api_client)
        self.cfg = cfg
        self.cache = KubeCache(pod_from_api, node_from_api)
        self.stats = SourceStats()
        self.synced = asyncio.Event()  # both kinds listed once
        self.changed = asyncio.Event()  # set after every applied batch; the app clears it
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._queue: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, watch.Watch] = {}
        self._listed: set[str] = set()
        self.watch_rv: dict[str, str] = {}  # what each watch thread resumes from (thread side)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._queue = asyncio.Queue(self.cfg.queue_size)
        for kind in KINDS:
            t = threading.Thread(target=self._watch_loop, args=(kind,), name=f"k8s-watch-{kind}", daemon=True)
            self._threads.append(t)
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the watch threads (their open streams are shut down) and wait for them."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            while t.is_alive() and time.monotonic() < deadline:
                for w in list(self._watches.values()):
                    w.stop()  # again and again: a watch still connecting has no socket to shut yet
                t.join(0.05)

    @property
    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    # --- loop side ------------------------------------------------------------------------------

    async def run(self, on_changes: OnChanges) -> None:
        """Apply queued items to the cache forever; ``on_changes`` gets each non-empty batch."""
        assert self._queue is not None, "start() first"
        while True:
            items = [await self._queue.get()]
            while len(items) < self.cfg.max_batch and not self._queue.empty():
                items.append(self._queue.get_nowait())
            changes: list[Change] = []
            for item in items:
                changes += self._apply(item)
            self.changed.set()
            if changes:
                await on_changes(changes)

    def _apply(self, item: tuple) -> list[Change]:
        if item[0] == "list":
            _, kind, objs, rv = item
            self._listed.add(kind)
            out = self.cache.replace(kind, objs, rv)
            if self._listed == set(KINDS):
                self.synced.set()
            return out
        _, kind, etype, obj = item
        try:
            return self.cache.apply(kind, etype, obj)
        except (KeyError, TypeError, ValueError) as exc:  # an object the converter cannot read
            self.stats.errors += 1
            log.warning("skipped %s %s event: %s: %s", kind, etype, type(exc).__name__, exc)
            return []

    # --- thread side ----------------------------------------------------------------------------

    def _put(self, item: tuple) -> bool:
        """Hand ``item`` to the loop, blocking while the queue is full; False when stopping."""
        assert self._loop is not None and self._queue is not None
        fut = asyncio.run_coroutine_threadsafe(self._queue.put(item), self._loop)
        while not self._stop.is_set():
            try:
                fut.result(timeout=0.2)
                return True
            except TimeoutError:
                continue
            except RuntimeError:  # loop closed
                return False
        fut.cancel()
        return False

    def _list_fn(self, kind: str) -> Callable[..., Any]:
        return self.api.list_node if kind == "nodes" else self.api.list_pod_for_all_namespaces

    def _list(self, kind: str) -> str:
        resp = self._list_fn(kind)(_preload_content=False, _request_timeout=self.cfg.request_timeout)
        body = json.loads(resp.data)
        rv = str(body["metadata"]["resourceVersion"])
        self.stats.lists += 1
        self._put(("list", kind, body.get("items") or [], rv))
        return rv

    def _watch_loop(self, kind: str) -> None:
        backoff = Backoff(self.cfg.backoff_base, self.cfg.backoff_max, self._rng)
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._list(kind)
                    self.watch_rv[kind] = rv
                    backoff.reset()
                rv = self._watch_once(kind, rv, backoff)
                backoff.reset()  # the stream ended normally (server timeout): resume at once
            except ApiException as exc:
                rv = self.watch_rv.get(kind, rv) if rv else rv  # the last event's rv, even mid-stream
                if exc.status == 410:
                    self.stats.relists += 1
                    log.info("%s watch: resourceVersion %s expired (410 Gone); relisting", kind, rv)
                    rv = ""
                    continue
                rv = self._failed(kind, rv, backoff, f"HTTP {exc.status} {exc.reason}")
            except Exception as exc:  # noqa: BLE001 - connection errors come in many types; all mean reconnect
                if self._stop.is_set():
                    break
                rv = self.watch_rv.get(kind, rv) if rv else rv
                rv = self._failed(kind, rv, backoff, f"{type(exc).__name__}: {exc}")
        log.info("%s watch stopped", kind)

    def _failed(self, kind: str, rv: str, backoff: Backoff, why: str) -> str:
        self.stats.errors += 1
        delay = backoff.next()
        log.warning("%s watch failed (%s); reconnecting from rv=%s in %.2fs", kind, why, rv or "-", delay)
        self._stop.wait(delay)
        self.stats.reconnects += 1
        return rv

    def _watch_once(self, kind: str, rv: str, backoff: Backoff) -> str:
        """One watch request from ``rv``; returns the resourceVersion to resume from."""
        w = RawWatch()
        self._watches[kind] = w
        self.watch_rv[kind] = rv
        try:
            stream = w.stream(self._list_fn(kind), resource_version=rv, allow_watch_bookmarks=True,
                              timeout_seconds=self.cfg.timeout_seconds,
                              _request_timeout=(self.cfg.request_timeout,
                                                self.cfg.timeout_seconds + self.cfg.request_timeout))
            for event in stream:
                if self._stop.is_set():
                    w.stop()
                    break
                etype, obj = event.get("type"), event.get("raw_object") or event.get("object") or {}
                if etype == "ERROR":  # this client raises on ERROR; kept for clients that yield it
                    raise ApiException(status=int(obj.get("code") or 500), reason=str(obj.get("message", "")))
                new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if etype == "BOOKMARK":
                    self.stats.bookmarks += 1
                else:
                    self.stats.events += 1
                if not self._put(("event", kind, etype, obj)):
                    break
                if new_rv:
                    rv = new_rv
                    self.watch_rv[kind] = rv
                backoff.reset()
        finally:
            self._watches.pop(kind, None)
        return rv
