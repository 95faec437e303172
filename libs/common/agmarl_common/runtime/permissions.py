"""NATS permissions generated from the subject catalogue: what each identity may publish and subscribe.

Identities are the services the catalogue names, plus two for the CLI: ``cli`` (read-only verbs and
``agmarl up``'s monitor: the catalogue's consumer "cli") and ``operator`` (write verbs ``policy set``,
``policy rollback``, ``retrain``: the catalogue's producer "cli", and its consumer "operator").

- A service publishes exactly the subjects whose catalogue producer it is (producer ``*``: its own
  ``dead_letter.<service>``) and subscribes to what it consumes (``*``-produced health: it answers its
  own ``health.<service>`` and ``health_all``; replies go out through ``allow_responses``).
- Its request replies and JetStream API answers arrive on its own inbox ``_INBOX.<identity>.>``
  (``inbox_prefix``), so no identity can read another's replies.
- JetStream: every identity may look up and create the catalogue's streams and buckets (create is
  idempotent with the project's spec); only a stream's producer may update it; a consumer of a
  stream-backed subject may create consumers on that stream and ack them; nobody may delete or purge
  a stream or another identity's consumer (the object store's writer purges its own old chunks).
- KV ``agmarl_config``: everyone reads; a key is written by the producer of the catalogue kind it
  mirrors (``KV_KEY_KIND``) and by the operator. Object Store ``agmarl_models``: written by the
  producer of ``model_published``, read by its consumers and the operator.

Pure: plain functions over the catalogue; ``natsauth`` turns them into a server configuration.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agmarl_common.runtime import subjects
from agmarl_common.core.adaptive.history import KEY_POLICY_HISTORY

READ_ONLY = "cli"
OPERATOR = "operator"
CLI_PRODUCER = "cli"  # a catalogue producer "cli" is a CLI write verb: the operator identity
JS_API = "$JS.API"
INBOX = "_INBOX"
# which catalogue kind each agmarl_config key mirrors: its producers may write it (None: operator only)
KV_KEY_KIND: dict[str, str | None] = {
    subjects.KEY_ACTIVE_POLICY: "policy_selection",
    KEY_POLICY_HISTORY: "policy_selection",
    subjects.KEY_ROLLOUT: None,
}
# which catalogue kind announces what an Object Store bucket holds: its producer writes, consumers read
OBJECT_BUCKET_KIND: dict[str, str] = {subjects.MODELS_BUCKET: "model_published"}
_PLACEHOLDERS = ("{cluster}", "{namespace}", "{service}")


@dataclass(frozen=True)
class Permissions:
    """One identity's allow lists (everything else is denied by the server)."""

    identity: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool

    def to_config(self) -> dict:
        """The ``permissions`` map of a nats-server user entry."""
        out: dict = {"publish": {"allow": list(self.publish)}, "subscribe": {"allow": list(self.subscribe)}}
        if self.allow_responses:
            out["allow_responses"] = True
        return out


def names(field: str) -> set[str]:
    """``"adaptive-engine,cli"`` -> {"adaptive-engine", "cli"}."""
    return {n.strip() for n in field.split(",") if n.strip()}


def services(catalogue: Sequence[subjects.CatalogueEntry] = subjects.CATALOGUE) -> list[str]:
    """Every service the catalogue names as a producer or consumer (not ``*``, ``cli``, ``operator``)."""
    found: set[str] = set()
    for e in catalogue:
        found |= names(e.producer) | set(e.consumers)
    return sorted(found - {"*", READ_ONLY, OPERATOR, CLI_PRODUCER})


def identities(catalogue: Sequence[subjects.CatalogueEntry] = subjects.CATALOGUE) -> list[str]:
    return [*services(catalogue), READ_ONLY, OPERATOR]


def inbox_prefix(identity: str) -> str:
    """Where this identity's request replies arrive (``nats.connect(inbox_prefix=...)``)."""
    return f"{INBOX}.{subjects.token(identity)}"


def subject_filter(pattern: str, service: str = "*") -> str:
    """Catalogue pattern -> NATS subject filter: ``{cluster}``/``{namespace}`` -> ``*``, ``{service}``
    -> ``service``."""
    out = pattern.replace("{service}", subjects.token(service) if service != "*" else "*")
    for placeholder in _PLACEHOLDERS:
        out = out.replace(placeholder, "*")
    return out


def _is_request_reply(entry: subjects.CatalogueEntry) -> bool:
    """Health checks: producer ``*`` means every service answers requests the consumers send."""
    return entry.kind == "health" and entry.producer == "*"


def _produces(identity: str, entry: subjects.CatalogueEntry, is_service: bool) -> bool:
    producers = names(entry.producer)
    if identity == READ_ONLY:  # the read-only CLI publishes nothing but health requests
        return False
    if identity == OPERATOR:
        return CLI_PRODUCER in producers
    return identity in producers or ("*" in producers and is_service)


def _consumes(identity: str, entry: subjects.CatalogueEntry) -> bool:
    consumers = set(entry.consumers)
    if identity == OPERATOR:  # the operator can do whatever the read-only CLI does, and more
        return bool(consumers & {OPERATOR, READ_ONLY})
    return identity in consumers


def _stream_consumer(stream: str) -> list[str]:
    """What creating/reading a durable, ephemeral or ordered consumer on ``stream`` and acking needs."""
    return [f"{JS_API}.CONSUMER.INFO.{stream}.*", f"{JS_API}.CONSUMER.CREATE.{stream}",
            f"{JS_API}.CONSUMER.CREATE.{stream}.>", f"{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.*",
            f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.*", f"$JS.ACK.{stream}.>", f"$JS.FC.{stream}.>"]


def _bucket_read(stream: str) -> list[str]:
    return [f"{JS_API}.DIRECT.GET.{stream}", f"{JS_API}.DIRECT.GET.{stream}.>",
            f"{JS_API}.STREAM.MSG.GET.{stream}", *_stream_consumer(stream)]


def _streams(catalogue: Sequence[subjects.CatalogueEntry]) -> list[str]:
    found = {e.stream for e in catalogue if e.stream}
    return sorted(found | {s.name for s in subjects.STREAMS})


def _producers_of(kind: str | None, catalogue: Sequence[subjects.CatalogueEntry]) -> set[str]:
    out: set[str] = set()
    for e in catalogue:
        if e.kind == kind:
            out |= names(e.producer)
    return out


def _consumers_of(kind: str, catalogue: Sequence[subjects.CatalogueEntry]) -> set[str]:
    return {c for e in catalogue if e.kind == kind for c in e.consumers}


def _as(identity: str) -> set[str]:
    """The catalogue names an identity acts as (the operator writes as "cli")."""
    return {OPERATOR, CLI_PRODUCER} if identity == OPERATOR else {identity}


def permissions_for(identity: str,
                    catalogue: Sequence[subjects.CatalogueEntry] = subjects.CATALOGUE) -> Permissions:
    """The allow lists of one identity, generated from ``catalogue``."""
    is_service = identity in services(catalogue)
    if not is_service and identity not in (READ_ONLY, OPERATOR):
        raise KeyError(f"unknown NATS identity {identity!r}: not in the subject catalogue")
    pub: list[str] = []
    sub: list[str] = [f"{inbox_prefix(identity)}.>"]
    # JetStream housekeeping every identity needs: look up / idempotently create the project's streams
    pub += [f"{JS_API}.INFO", f"{JS_API}.STREAM.NAMES"]
    for stream in _streams(catalogue):
        pub += [f"{JS_API}.STREAM.INFO.{stream}", f"{JS_API}.STREAM.CREATE.{stream}"]
    for e in catalogue:
        if _is_request_reply(e):
            if is_service:
                sub.append(subject_filter(e.pattern, identity))
            if _consumes(identity, e):
                pub.append(subject_filter(e.pattern))
            continue
        if _produces(identity, e, is_service):
            pub.append(subject_filter(e.pattern, identity))
            if e.stream:
                pub.append(f"{JS_API}.STREAM.UPDATE.{e.stream}")
        if _consumes(identity, e):
            sub.append(subject_filter(e.pattern))
            if e.stream:
                pub += _stream_consumer(e.stream)
    # KV agmarl_config: everyone reads; writers per key
    kv_stream = f"KV_{subjects.CONFIG_BUCKET}"
    pub += [f"{JS_API}.STREAM.INFO.{kv_stream}", f"{JS_API}.STREAM.CREATE.{kv_stream}", *_bucket_read(kv_stream)]
    for key, kind in KV_KEY_KIND.items():
        if identity == OPERATOR or _as(identity) & _producers_of(kind, catalogue):
            pub.append(f"$KV.{subjects.CONFIG_BUCKET}.{key}")
    # Object Store buckets
    for bucket, kind in OBJECT_BUCKET_KIND.items():
        obj_stream = f"OBJ_{bucket}"
        writer = bool(_as(identity) & _producers_of(kind, catalogue))
        reader = writer or identity == OPERATOR or identity in _consumers_of(kind, catalogue)
        if reader:
            pub += [f"{JS_API}.STREAM.INFO.{obj_stream}", f"{JS_API}.STREAM.CREATE.{obj_stream}",
                    *_bucket_read(obj_stream)]
        if writer:  # chunks and metadata; a put over an existing name purges the old chunks
            pub += [f"$O.{bucket}.>", f"{JS_API}.STREAM.PURGE.{obj_stream}"]
    return Permissions(identity, _unique(pub), _unique(sub), allow_responses=is_service)


def matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` one token, ``>`` one or more trailing tokens."""
    pt, st = pattern.split("."), subject.split(".")
    for i, token in enumerate(pt):
        if token == ">":
            return len(st) > i
        if i >= len(st) or (token != "*" and token != st[i]):
            return False
    return len(pt) == len(st)


def may_publish(perms: Permissions, subject: str) -> bool:
    return any(matches(p, subject) for p in perms.publish)


def may_subscribe(perms: Permissions, subject: str) -> bool:
    return any(matches(p, subject) for p in perms.subscribe)


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def all_permissions(catalogue: Sequence[subjects.CatalogueEntry] = subjects.CATALOGUE) -> dict[str, Permissions]:
    return {name: permissions_for(name, catalogue) for name in identities(catalogue)}


def publish_table(catalogue: Sequence[subjects.CatalogueEntry] = subjects.CATALOGUE) -> list[dict]:
    """Who may publish and subscribe to each catalogue subject (the generated table in docs/proto)."""
    rows = []
    everyone = identities(catalogue)
    for e in catalogue:
        publishers, subscribers = [], []
        for name in everyone:
            perms = permissions_for(name, catalogue)
            own = subject_filter(e.pattern, name)
            if own in perms.publish or subject_filter(e.pattern) in perms.publish:
                publishers.append(name)
            if own in perms.subscribe or subject_filter(e.pattern) in perms.subscribe:
                subscribers.append(name)
        rows.append({"subject": e.pattern, "kind": e.kind, "publish": publishers, "subscribe": subscribers})
    for key, kind in KV_KEY_KIND.items():
        writers = [n for n in everyone if f"$KV.{subjects.CONFIG_BUCKET}.{key}" in permissions_for(n, catalogue).publish]
        rows.append({"subject": f"KV {subjects.CONFIG_BUCKET}/{key}", "kind": kind or "-", "publish": writers,
                     "subscribe": everyone})
    for bucket, kind in OBJECT_BUCKET_KIND.items():
        writers = [n for n in everyone if f"$O.{bucket}.>" in permissions_for(n, catalogue).publish]
        readers = [n for n in everyone
                   if f"{JS_API}.DIRECT.GET.OBJ_{bucket}" in permissions_for(n, catalogue).publish]
        rows.append({"subject": f"Object Store {bucket}", "kind": kind, "publish": writers, "subscribe": readers})
    return rows


def render_markdown(catalogue: Sequence[subjects.CatalogueEntry] = subjects.CATALOGUE) -> str:
    lines = ["| subject | kind | may publish (write) | may subscribe (read) |", "|---|---|---|---|"]
    for row in publish_table(catalogue):
        lines.append(f"| `{row['subject']}` | {row['kind']} | {', '.join(row['publish']) or '-'} | "
                     f"{', '.join(row['subscribe']) or '-'} |")
    return "\n".join(lines) + "\n"
