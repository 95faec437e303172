"""The NATS bus: connect/reconnect, publish with trace context, request/reply, JetStream streams,
durable consumers, KV and Object Store helpers. A thin wrapper over nats-py; no service logic."""
from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import (APIError, BucketNotFoundError, KeyDeletedError, KeyNotFoundError, NotFoundError,
                            ObjectDeletedError, ObjectNotFoundError)

from agmarl_common.runtime import subjects
from agmarl_common.runtime.messages import MAX_MESSAGE_BYTES, Message, decode, encode
from agmarl_common.runtime.natsauth import NatsAuth
from agmarl_common.runtime.telemetry import inject

M = TypeVar("M", bound=Message)
RawCallback = Callable[[Msg], Awaitable[None]]
ERROR_HEADER = "Agmarl-Error"
KIND_HEADER = "Agmarl-Kind"
MSG_ID_HEADER = "Nats-Msg-Id"


def _is_auth_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "authorization violation" in text or "authentication" in text


class RequestError(Exception):
    """The responder rejected the request (reply carried an ``Agmarl-Error`` header)."""


def _payload(msg: Message | bytes) -> bytes:
    return msg if isinstance(msg, (bytes, bytearray)) else encode(msg)


def trace_headers(msg: Message | bytes, headers: dict[str, str] | None = None,
                  msg_id: str | None = None) -> dict[str, str]:
    """Headers for one publish: caller's, W3C trace context of the current span, kind, msg id."""
    out = dict(headers or {})
    inject(out)
    if isinstance(msg, Message):
        out.setdefault(KIND_HEADER, msg.KIND)
    if msg_id:
        out[MSG_ID_HEADER] = msg_id
    return out


class Bus:
    """One NATS connection of one service. Build it with ``await Bus.connect(url, name)``."""

    def __init__(self, nc: Client, name: str, log: logging.Logger | None = None):
        self.nc = nc
        self.name = name
        self.log = log or logging.getLogger(f"agmarl.bus.{name}")
        self.js: JetStreamContext = nc.jetstream()
        self.stream_replicas = 0  # replicas of the streams this bus creates; 0 = each spec's own (1)

    @classmethod
    async def connect(cls, url: str, name: str, max_reconnect: int = -1, connect_timeout: float = 2.0,
                      reconnect_time_wait: float = 0.5, connect_wait: float | None = 30.0,
                      log: logging.Logger | None = None, auth: NatsAuth | None = None) -> "Bus":
        """Connect (retrying for up to ``connect_wait`` seconds when NATS is not up yet; None = forever),
        then reconnect forever (``max_reconnect=-1``) after a disconnect. Connection changes are logged.
        ``auth``: the identity's nkey seed (replies then arrive on ``_INBOX.<identity>``) and TLS files;
        a server that refuses the identity raises ``ConnectionError`` at once (no retrying a bad key)."""
        logger = log or logging.getLogger(f"agmarl.bus.{name}")
        errors = [0]
        nc = Client()

        async def on_error(exc: Exception) -> None:
            errors[0] += 1
            if errors[0] == 1 or errors[0] % 20 == 0:  # a down server would log twice a second otherwise
                logger.warning("nats error service=%s (%d so far): %s: %s", name, errors[0], type(exc).__name__, exc)

        async def on_disconnected() -> None:
            if nc.is_closed or nc.is_draining:
                logger.info("nats disconnected service=%s (closing)", name)
            else:
                logger.warning("nats disconnected service=%s", name)

        async def on_reconnected() -> None:
            errors[0] = 0
            logger.info("nats reconnected service=%s url=%s", name, url)

        async def on_closed() -> None:
            logger.info("nats connection closed service=%s", name)

        refused: list[Exception] = []

        async def on_connect_error(exc: Exception) -> None:
            if _is_auth_error(exc) and not nc.is_connected:
                refused.append(exc)
                connecting.cancel()
            await on_error(exc)

        connecting = asyncio.ensure_future(nc.connect(
            servers=url, name=name, max_reconnect_attempts=max_reconnect, connect_timeout=connect_timeout,
            reconnect_time_wait=reconnect_time_wait, error_cb=on_connect_error, disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected, closed_cb=on_closed, allow_reconnect=True,
            **(auth.connect_options() if auth is not None else {})))
        try:
            await asyncio.wait_for(connecting, connect_wait)
        except asyncio.TimeoutError:
            await nc.close()
            raise ConnectionError(f"no NATS server at {url} within {connect_wait}s") from None
        except asyncio.CancelledError:
            if not refused:
                raise
            await nc.close()
            raise ConnectionError(f"NATS at {url} refused {name}: {refused[0]}") from None
        logger.info("nats connected service=%s url=%s", name, url)
        return cls(nc, name, logger)

    @property
    def is_connected(self) -> bool:
        return self.nc.is_connected

    @property
    def reconnects(self) -> int:
        """How many times this connection has reconnected (after a server restart, say)."""
        return int(self.nc.stats.get("reconnects", 0))

    # --- core NATS ------------------------------------------------------------------------------

    async def publish(self, subject: str, msg: Message | bytes, headers: dict[str, str] | None = None,
                      msg_id: str | None = None) -> None:
        """Publish with the current trace context as ``traceparent``/``tracestate`` headers."""
        await self.nc.publish(subject, _payload(msg), headers=trace_headers(msg, headers, msg_id))

    async def request(self, subject: str, msg: Message | bytes, reply_cls: type[M], timeout: float = 2.0,
                      headers: dict[str, str] | None = None, max_bytes: int = MAX_MESSAGE_BYTES) -> M:
        """Request/reply; raises ``RequestError`` when the responder rejected the request, nats
        ``TimeoutError`` when nobody answered, ``DecodeError`` when the reply is invalid."""
        reply = await self.nc.request(subject, _payload(msg), timeout=timeout, headers=trace_headers(msg, headers))
        if reply.headers and reply.headers.get(ERROR_HEADER):
            raise RequestError(reply.headers[ERROR_HEADER])
        return decode(reply_cls, reply.data, max_bytes)

    async def request_many(self, subject: str, msg: Message | bytes, reply_cls: type[M], timeout: float = 1.0,
                           max_replies: int = 100) -> list[M]:
        """Scatter-gather: every reply that arrives within ``timeout`` (invalid replies skipped)."""
        inbox = self.nc.new_inbox()
        replies: list[M] = []
        done = asyncio.Event()

        async def collect(m: Msg) -> None:
            try:
                replies.append(decode(reply_cls, m.data))
            except Exception as exc:  # a bad reply must not break the gather
                self.log.warning("bad reply on %s: %s", subject, exc)
            if len(replies) >= max_replies:
                done.set()

        sub = await self.nc.subscribe(inbox, cb=collect)
        try:
            await self.nc.publish(subject, _payload(msg), reply=inbox, headers=trace_headers(msg))
            try:
                await asyncio.wait_for(done.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        finally:
            await sub.unsubscribe()
        return replies

    async def subscribe(self, subject: str, cb: RawCallback | None = None, queue: str | None = None) -> Subscription:
        """Raw subscription: ``cb`` receives the nats ``Msg`` (decoding is the caller's job; without ``cb``, read
        it with ``next_msg``). Returns once the server has the subscription (``flush``), so a message another
        connection publishes next is not missed."""
        sub = await self.nc.subscribe(subject, queue=queue or "", cb=cb)
        await self.flush(5.0)
        return sub

    async def flush(self, timeout: float = 2.0) -> None:
        """Return once the server has processed everything this connection sent before (a PING answered).

        nats-py 2.x writes the PING straight to the socket, ahead of the commands still in its write buffer
        (SUB, PUB, UNSUB), so its ``flush`` can return before the server has them: a subscription that another
        connection then published to missed the messages in about 3 % of tries on this machine (a throwaway script:
        4-8 of 200). The buffer is written out first, so the PING follows it on the wire."""
        await self.nc._flush_pending(force_flush=True)  # noqa: SLF001 - the client's own buffer; see above
        await self.nc.flush(timeout)

    # --- JetStream ------------------------------------------------------------------------------

    async def js_publish(self, subject: str, msg: Message | bytes, headers: dict[str, str] | None = None,
                         msg_id: str | None = None, stream: str | None = None,
                         timeout: float = 5.0) -> js_api.PubAck:
        """Publish into a stream and wait for the ack; ``msg_id`` sets Nats-Msg-Id (deduplication)."""
        return await self.js.publish(subject, _payload(msg), timeout=timeout, stream=stream,
                                     headers=trace_headers(msg, headers, msg_id))

    async def ensure_stream(self, spec: subjects.StreamSpec) -> js_api.StreamInfo:
        """Create the stream, or update it to ``spec`` when it exists (idempotent)."""
        config = js_api.StreamConfig(
            name=spec.name, description=spec.description or None, subjects=list(spec.subjects),
            storage=js_api.StorageType.FILE if spec.storage == "file" else js_api.StorageType.MEMORY,
            duplicate_window=spec.duplicate_window, max_age=spec.max_age or None, max_bytes=spec.max_bytes,
            retention=js_api.RetentionPolicy.LIMITS, num_replicas=self.stream_replicas or spec.replicas)
        try:
            info = await self.js.stream_info(spec.name)
        except NotFoundError:
            return await self.js.add_stream(config)
        have = info.config.as_dict()
        if all(have.get(k) == v for k, v in config.as_dict().items()):
            return info  # already as specified: no update (only a stream's producer may update it)
        try:
            return await self.js.update_stream(config)
        except (NatsTimeoutError, APIError) as exc:  # a permission violation never answers: a timeout
            self.log.warning("stream %s differs from its spec and %s may not update it (%s: %s); its producer "
                             "updates it when it starts", spec.name, self.name, type(exc).__name__, exc)
            return info

    async def ensure_streams(self, streams: Iterable[subjects.StreamSpec] = subjects.STREAMS) -> list[str]:
        """Create DECISIONS, EXPERIENCE and EVENTS (or the given specs); returns the stream names."""
        names = []
        for spec in streams:
            await self.ensure_stream(spec)
            names.append(spec.name)
        return names

    async def durable_subscribe(self, stream: str, subject: str, durable: str, cb: RawCallback,
                                queue: str | None = None, ack_wait: float = 30.0, max_deliver: int = 5,
                                deliver_new: bool = False,
                                max_ack_pending: int | None = None) -> JetStreamContext.PushSubscription:
        """Durable push consumer with manual acks: ``cb`` must ack/nak/term each message. The deliver
        policy applies when the consumer is created; an existing durable continues from its ack floor."""
        config = js_api.ConsumerConfig(
            ack_wait=ack_wait, max_deliver=max_deliver, ack_policy=js_api.AckPolicy.EXPLICIT,
            deliver_policy=js_api.DeliverPolicy.NEW if deliver_new else js_api.DeliverPolicy.ALL,
            max_ack_pending=max_ack_pending)
        return await self.js.subscribe(subject, queue=queue, durable=durable, stream=stream, cb=cb,
                                       manual_ack=True, config=config)

    async def follow_since(self, subject: str, since: datetime.datetime) -> JetStreamContext.PushSubscription:
        """An ordered consumer of ``subject``'s stream from the first message stored at or after ``since``
        (``await sub.next_msg(timeout)``). An ordered consumer recreates itself from the next stream sequence
        when it misses a message or its heartbeats (a NATS restart); nats-py (2.16) then asks for "by start
        sequence" but keeps the start time, which the server refuses (error 10094: the consumer is never
        recreated and the subscription goes quiet, with only the error callback saying so; a full chaos run
        lost the reward-calculator's bind outcomes that way). nats-py keeps the config given and updates it in
        place, so the start time is cleared once the consumer exists (as nats.go and nats.net do on a reset)."""
        config = js_api.ConsumerConfig(deliver_policy=js_api.DeliverPolicy.BY_START_TIME, opt_start_time=since)
        sub = await self.js.subscribe(subject, ordered_consumer=True, config=config)
        config.opt_start_time = None
        return sub

    async def read_back(self, subject: str, since: datetime.datetime, decode: Callable[[bytes], Any],
                        timeout: float) -> list[Any]:
        """``decode(data)`` of every message of ``subject``'s stream stored since ``since`` (a None result is left
        out), read once until none is left or ``timeout`` seconds pass with none coming (``follow_since`` is the
        consumer that goes on following)."""
        out: list[Any] = []
        sub = await self.follow_since(subject, since)
        try:
            info = await sub.consumer_info()
            if info.num_pending == 0 and info.delivered.consumer_seq == 0:  # nothing stored, nothing on its way
                return out
            while True:
                try:
                    msg = await sub.next_msg(timeout=timeout)
                except (asyncio.TimeoutError, NatsTimeoutError):
                    return out
                found = decode(msg.data)
                if found is not None:
                    out.append(found)
                if msg.metadata.num_pending == 0:
                    return out
        finally:
            await sub.unsubscribe()

    async def pull_subscribe(self, stream: str, subject: str, durable: str, ack_wait: float = 30.0,
                             max_deliver: int = 5) -> JetStreamContext.PullSubscription:
        """Durable pull consumer: ``await sub.fetch(batch, timeout)`` then ack each message."""
        config = js_api.ConsumerConfig(ack_wait=ack_wait, max_deliver=max_deliver,
                                       ack_policy=js_api.AckPolicy.EXPLICIT)
        return await self.js.pull_subscribe(subject, durable=durable, stream=stream, config=config)

    # --- KV -------------------------------------------------------------------------------------

    async def kv(self, bucket: str = subjects.CONFIG_BUCKET, create: bool = True, history: int = 10):
        """The KV bucket (created with file storage when missing and ``create``)."""
        try:
            return await self.js.key_value(bucket)
        except BucketNotFoundError:
            if not create:
                raise
            return await self.js.create_key_value(bucket=bucket, history=history,
                                                  storage=js_api.StorageType.FILE)

    async def kv_get(self, bucket: str, key: str) -> bytes | None:
        """The value of ``key`` (None when missing or deleted)."""
        store = await self.kv(bucket)
        try:
            entry = await store.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return entry.value

    async def kv_put(self, bucket: str, key: str, value: bytes | str | Message) -> int:
        """Write ``key``; a Message is stored encoded. Returns the revision."""
        store = await self.kv(bucket)
        data = value.encode("utf-8") if isinstance(value, str) else _payload(value)
        return await store.put(key, data)

    # --- Object Store -------------------------------------------------------------------------------

    async def object_store(self, bucket: str = subjects.MODELS_BUCKET, create: bool = True):
        try:
            return await self.js.object_store(bucket)
        except BucketNotFoundError:
            if not create:
                raise
            return await self.js.create_object_store(bucket=bucket, storage=js_api.StorageType.FILE)

    async def object_put(self, bucket: str, name: str, data: bytes, description: str = "") -> Any:
        """Store ``data`` under ``name`` (chunked by nats-py; digest checked on read). Returns ObjectInfo."""
        store = await self.object_store(bucket)
        meta = js_api.ObjectMeta(name=name, description=description or None)
        return await store.put(name, data, meta=meta)

    async def object_get(self, bucket: str, name: str) -> bytes | None:
        """The object's bytes (None when missing); nats-py verifies the SHA-256 digest."""
        store = await self.object_store(bucket)
        try:
            result = await store.get(name)
        except (ObjectNotFoundError, ObjectDeletedError):
            return None
        return bytes(result.data or b"")

    async def object_list(self, bucket: str = subjects.MODELS_BUCKET) -> list[str]:
        store = await self.object_store(bucket)
        try:
            infos = await store.list()
        except NotFoundError:
            return []
        return sorted(i.name for i in infos if not i.deleted)

    # --- shutdown -------------------------------------------------------------------------------

    async def drain(self, timeout: float = 5.0) -> None:
        """Let subscriptions finish in-flight messages, flush publishes, close."""
        if self.nc.is_closed:
            return
        try:
            await asyncio.wait_for(self.nc.drain(), timeout)
        except Exception as exc:  # drain failing must not block shutdown
            self.log.warning("nats drain failed service=%s: %s", self.name, exc)
            await self.close()

    async def close(self) -> None:
        """Close; a connection the server already dropped is closed quietly (shutdown never fails on it)."""
        if not self.nc.is_closed:
            try:
                await self.nc.close()
            except (ConnectionError, OSError) as exc:
                self.log.info("closing %s: connection already gone (%s)", self.name, type(exc).__name__)
