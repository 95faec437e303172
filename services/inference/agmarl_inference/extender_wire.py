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
from typing import Any

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


# node names -> per host its entry for each score 0..MAX_EXTENDER_SCORE ('{"Host":"<name>","Score":<s>}'), for the
# last few node lists
_ENTRIES: dict[tuple[str, ...], list[list[str]]] = {}


def priorities_json(scores: dict[str, int]) -> bytes:
    """A HostPriorityList, written directly: no per-host objects (1,500 of them per call otherwise). For the last
    few node lists (kube-scheduler sends the same names pod after pod) every host's entry is kept for each score an
    answer can give, so an answer is one lookup a host and one join (a score outside 0..10 is written out)."""
    hosts = tuple(scores)
    entries = _ENTRIES.get(hosts)
    if entries is None:
        if len(_ENTRIES) >= 4:
            _ENTRIES.clear()
        entries = _ENTRIES[hosts] = [[f'{{"Host":{json.dumps(h)},"Score":{v}}}' for v in range(MAX_EXTENDER_SCORE + 1)]
                                     for h in hosts]
    values = list(scores.values())
    try:
        if values and min(values) < 0:
            raise IndexError("negative score")
        body = ",".join([e[v] for e, v in zip(entries, values)])
    except (IndexError, TypeError):  # a score outside 0..10, or not an int
        body = ",".join([f'{e[0][:-2]}{int(v)}}}' for e, v in zip(entries, values)])
    return ("[" + body + "]").encode()
