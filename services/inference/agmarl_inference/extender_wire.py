"""The kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``) as kube-scheduler
v1.36 sends and accepts it (recorded in /work/shared/k8s/): capitalised Go field names, scores 0..10.
Keys are matched case-insensitively on input, as Go's encoding/json does; unknown keys are ignored.

``parse_args`` is the one way a request body becomes a model, checked at the edge: JSON as Go writes it
(UTF-8, no lone surrogates, no NaN, nesting at most 200 deep, pydantic_core's parser limit: 400 otherwise), at most ``max_nodes``
nodes, counted before any validation (413), then the schema (422). kube-scheduler treats every
non-200 answer alike (an error: ignored for prioritize, and for filter and bind when the extender is
``ignorable``), so the status tells an operator, not the scheduler, what was wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import from_json

MAX_EXTENDER_SCORE = 10  # kube-scheduler's MaxExtenderPriority
NEUTRAL_SCORE = 0
INT64 = (-(2 ** 63), 2 ** 63 - 1)  # Go's int64: NumPDBViolations


class _GoArgs(BaseModel):
    """Input model: unknown keys ignored, keys matched case-insensitively (Go encoding/json)."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _fold_case(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        names = {n.lower(): n for n in cls.model_fields}
        return {names.get(str(k).lower(), k): v for k, v in data.items()}


class NodeList(BaseModel):
    model_config = ConfigDict(extra="allow")
    metadata: dict[str, Any] = {}
    items: list[dict[str, Any]] = []  # v1.Node objects, answered back untouched

    @field_validator("items")
    @classmethod
    def _named(cls, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each node's ``metadata`` an object and its ``name`` a string, where given."""
        for i, obj in enumerate(items):
            meta = obj.get("metadata")
            if meta is not None and (not isinstance(meta, dict) or not isinstance(meta.get("name", ""), str)):
                raise ValueError(f"items.{i}.metadata: not an object with a string name")
        return items


class ExtenderArgs(_GoArgs):
    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(BaseModel):
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = {}
    FailedAndUnresolvableNodes: dict[str, str] = {}
    Error: str = ""


class HostPriority(BaseModel):
    Host: str
    Score: int = Field(ge=0, le=MAX_EXTENDER_SCORE)


class ExtenderBindingArgs(_GoArgs):
    PodName: str
    PodNamespace: str
    PodUID: str = ""
    Node: str


class ExtenderBindingResult(BaseModel):
    Error: str = ""


class MetaPod(_GoArgs):
    UID: str


class MetaVictims(_GoArgs):
    Pods: list[MetaPod] = []
    NumPDBViolations: int = Field(0, ge=INT64[0], le=INT64[1])


class VictimMeta(_GoArgs):
    uid: str = ""


class VictimPod(_GoArgs):
    """A victim v1.Pod: only its uid is read."""

    metadata: VictimMeta = VictimMeta()


class Victims(_GoArgs):
    Pods: list[VictimPod | None] | None = None
    NumPDBViolations: int = Field(0, ge=INT64[0], le=INT64[1])


class ExtenderPreemptionArgs(_GoArgs):
    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Victims | None] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims | None] | None = None


class ExtenderPreemptionResult(BaseModel):
    NodeNameToMetaVictims: dict[str, MetaVictims] = {}


class BadRequest(Exception):
    """A schema-valid body that does not describe a pod/node we can read (answered 422)."""


class BodyError(Exception):
    """A request body refused at the edge: ``status`` 400 (not JSON as Go writes it), 413 (too large,
    too many nodes) or 422 (not the verb's schema); ``reason`` labels the rejection metric."""

    def __init__(self, status: int, reason: str, detail: str):
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


def _every(obj: Any, key: str) -> list[Any]:
    """The values of every key of ``obj`` equal to ``key`` ignoring case (lower-case ``key``)."""
    return [v for k, v in obj.items() if k.lower() == key] if isinstance(obj, dict) else []


def count_nodes(data: Any) -> int:
    """The most nodes any part of a decoded request names (NodeNames, Nodes.items, the victim maps),
    over every spelling of each key: what the case-folding models read is never more."""
    sized = [*_every(data, "nodenames"), *(i for n in _every(data, "nodes") for i in _every(n, "items")),
             *_every(data, "nodenametovictims"), *_every(data, "nodenametometavictims")]
    return max((len(v) for v in sized if isinstance(v, (list, dict))), default=0)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def parse_args(model: type[BaseModel], body: bytes, max_nodes: int) -> Any:
    """Request body -> ``model``, or ``BodyError``: 400 when it is not JSON as Go's encoding/json writes
    it (invalid UTF-8, a lone surrogate, NaN, nesting deeper than 200), 413 past ``max_nodes``
    (counted on the decoded JSON, before any validation), 422 when it is not ``model``."""
    try:
        data = from_json(body, allow_inf_nan=False, cache_strings="keys")
    except ValueError as exc:
        try:
            bytes(body).decode("utf-8")
        except UnicodeDecodeError as bad:
            raise BodyError(400, "encoding", f"body is not UTF-8: {bad.reason} at byte {bad.start}") from None
        escape = "surrogate" in str(exc) or "hex escape" in str(exc)
        raise BodyError(400, "encoding" if escape else "malformed", f"body is not JSON: {exc}") from None
    nodes = count_nodes(data)
    if nodes > max_nodes:
        raise BodyError(413, "too_many_nodes", f"{nodes} nodes exceed the limit of {max_nodes} per request")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(_short(str(p)) for p in e['loc']) or '<root>'}: {_short(e['msg'], 200)}"
                             for e in exc.errors(include_url=False, include_input=False)[:5])
        raise BodyError(422, "schema", f"not a {model.__name__}: {problems}") from None


def request_names(args: ExtenderArgs) -> list[str]:
    """The node names of a request, in request order (from the NodeList or NodeNames)."""
    if args.Nodes is not None:
        return [str((o.get("metadata") or {}).get("name", "")) for o in args.Nodes.items]
    return list(args.NodeNames or [])


@dataclass(frozen=True)
class Priorities:
    """A prioritize answer: the request's hosts, in request order, and each one's score (``scores[k]`` for
    ``hosts[k]``; 0..10 as answered)."""

    hosts: Sequence[str]
    scores: np.ndarray

    @classmethod
    def neutral(cls, hosts: Sequence[str]) -> "Priorities":
        return cls(hosts, np.full(len(hosts), NEUTRAL_SCORE, np.int64))


@dataclass(frozen=True)
class _Layout:
    """The bytes of a HostPriorityList of some hosts with every score left blank (two spaces), and where each
    host's two score characters are: an answer is a copy with the digits written in."""

    template: np.ndarray  # uint8
    tens: np.ndarray  # positions of each host's first score character ("1" for 10, else a space)
    ones: np.ndarray  # positions of its second (the last digit)


# host lists -> their layout (None: a list that names a host twice), for the last few lists
_LAYOUTS: dict[tuple[str, ...], _Layout | None] = {}
_UNSEEN = object()


def _layout(hosts: tuple[str, ...]) -> _Layout | None:
    if len(set(hosts)) != len(hosts):
        return None
    parts, tens, at = [b"["], [], 1
    for k, host in enumerate(hosts):
        head = f'{"," if k else ""}{{"Host":{json.dumps(host)},"Score":'.encode()
        parts.append(head)
        at += len(head)
        tens.append(at)
        parts.append(b"  }")
        at += 3
    parts.append(b"]")
    first = np.asarray(tens, np.int64)
    return _Layout(np.frombuffer(b"".join(parts), np.uint8).copy(), first, first + 1)


def _written_out(scores: dict[str, Any]) -> bytes:
    """The list written entry by entry (scores outside 0..10 or not ints, hosts named twice: the last wins)."""
    return ("[" + ",".join(f'{{"Host":{json.dumps(h)},"Score":{int(v)}}}' for h, v in scores.items()) + "]").encode()


def priorities_json(answer: Priorities) -> bytes:
    """A HostPriorityList, written without a per-host object or string: for the last few host lists
    (kube-scheduler sends the same names pod after pod) the list's bytes are kept with blank scores, and an
    answer is one copy of them with the scores' digits written in at once (numpy), each score as two characters
    (`` 7``, ``10``: JSON allows the space). The per-host entries this replaced were 1,523 small strings and lists
    read from all over the heap per answer. A score outside 0..10 or not an int, and a list naming a host twice,
    are written entry by entry (one entry per host, as a dict of the scores)."""
    hosts = tuple(answer.hosts)
    layout = _LAYOUTS.get(hosts, _UNSEEN)  # one lookup: a tuple's hash is computed anew each time
    if layout is _UNSEEN:
        if len(_LAYOUTS) >= 4:
            _LAYOUTS.clear()
        layout = _LAYOUTS[hosts] = _layout(hosts)
    values = np.asarray(answer.scores)
    if layout is None or values.dtype.kind not in "iu" or (values.size and (values.min() < 0 or
                                                                           values.max() > MAX_EXTENDER_SCORE)):
        return _written_out(dict(zip(hosts, values.tolist())))
    out = layout.template.copy()
    out[layout.tens] = np.where(values >= 10, ord("1"), ord(" "))
    out[layout.ones] = ord("0") + values % 10
    return out.tobytes()
