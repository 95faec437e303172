"""A compact wire form of a cluster state and its pending pods, for messages that must stay small.

``state_to_dict`` writes every node and every bound pod in full: an openb-sized cluster (1,523 nodes,
~7,500 bound pods) is ~1.5 MB of msgpack, over the 1 MiB message limit. The compact form keeps exactly
what the hard filter and the graph features read and drops per-pod identity:

    {"format": "agmarl.compact/1",
     "nodes":     {"n": N, "<Node field>": [value per node], ..., "labels": {"<key>": [value | None per node]}},
     "templates": [pod dict (``to_dict``) without name, uid, node_name, gpu_devices, creation_time, duration],
     "bound":     [[template << 8 | gpu device mask, ...] per node],
     "pending":   [template, ...]}

Node columns whose values are all the field default are left out. Pods with the same spec (requests,
labels, namespace, constraints, QoS) share one template, so a bound pod costs a few bytes. Decoding
gives a ``ClusterState`` with the same nodes, the same usage arrays and bound pods equal to the originals
but for their identity (bound pods are named ``<node>#<k>``), hence the same ``feasible_nodes`` and
``build_graph`` results; pending pods come back as anonymous pods (``pending#<k>``) of the same specs.

Snapshots (``ClusterSnapshot.state``) need pod identity, so they use a sibling form that keeps it:

    {"format": "agmarl.snapshot/1",
     "nodes":     as above,
     "templates": as above,
     "pods":      {"count": [bound pods per node], "template": [index per pod], "name": [...],
                   "uid": [...], "creation_time": [...], "duration": [...], "gpu_devices": [...],
                   "node_name": [...]}}

Bound pods are listed node by node; the per-pod columns hold what differs between pods of one spec.
A column whose values are all the default is left out (``node_name``: the pod's node). A UUID ``uid``
travels as its 16 bytes, integral times as integers, ascending GPU devices as a bit mask. Decoding is
exact: ``state_from_snapshot(compact_snapshot(s))`` equals ``state_from_dict(state_to_dict(s))`` field
by field, and ``state_from_dict`` here (``model.state_from_dict``) decodes the full form and both compact
forms (it dispatches on ``"format"``).

Experiences (``Experience.state["cluster"]``) carry the compact form deflated: every transition decided on one
snapshot holds the same nodes, templates and bound pods, and only its pending list differs, so those are packed
(msgpack) and compressed (zlib) once per snapshot:

    {"format": "agmarl.compact-zlib/1",
     "shared":  zlib(msgpack({"nodes", "templates", "bound"}))   (bytes; base64 text in a JSON file),
     "pending": [template, ...]}

The templates make up most of a compact state and repeat their labels and constraints, so the shared part
shrinks ~9x (a 50-node synthetic cluster: 95 KB -> 11 KB), and a reader unpacks one bytes value instead of
hundreds of small maps. ``inflated`` gives the compact form back (at most ``MAX_INFLATED_BYTES``).
Pure: plain dicts in, plain dicts out.
"""

from __future__ import annotations

import base64
import json
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields, replace
from typing import Any, TypeVar

import msgpack

from agmarl_common.core.cluster import codec
from agmarl_common.core.cluster.codec import node_from_dict, pod_from_dict, state_to_dict, to_dict
from agmarl_common.core.cluster.specs import MAX_GPUS, Node, Pod
from agmarl_common.core.cluster.state import ClusterState, state_with_bound

FORMAT = "agmarl.compact/1"
DEFLATED_FORMAT = "agmarl.compact-zlib/1"
MAX_INFLATED_BYTES = 64 * 1024 * 1024  # a deflated state that inflates past this is refused (a zip bomb)
_SHARED = ("nodes", "templates", "bound")
SNAPSHOT_FORMAT = "agmarl.snapshot/1"
INSTANCE_FIELDS = ("name", "uid", "node_name", "gpu_devices", "creation_time", "duration")
_T = TypeVar("_T")
_POD_FIELDS = tuple(f.name for f in fields(Pod) if f.name not in INSTANCE_FIELDS)  # what a template holds
_MASK_BITS = 8  # low bits of a bound entry: GPU device mask (MAX_GPUS devices)
_NODE_FIELDS = tuple(f for f in fields(Node))


def is_compact(data: Any) -> bool:
    """Is ``data`` a compact state (``compact_state`` output)?"""
    return isinstance(data, Mapping) and data.get("format") == FORMAT


def is_snapshot(data: Any) -> bool:
    """Is ``data`` a compact snapshot state (``compact_snapshot`` output)?"""
    return isinstance(data, Mapping) and data.get("format") == SNAPSHOT_FORMAT


def is_deflated(data: Any) -> bool:
    """Is ``data`` a deflated compact state (``deflated`` output)?"""
    return isinstance(data, Mapping) and data.get("format") == DEFLATED_FORMAT


def deflate_shared(compact: Mapping[str, Any]) -> bytes:
    """The nodes, templates and bound pods of a compact state, packed and compressed (``deflated``'s "shared")."""
    return zlib.compress(msgpack.packb({k: compact[k] for k in _SHARED}, use_bin_type=True), 1)


def deflated(compact: Mapping[str, Any], shared: bytes | None = None) -> dict[str, Any]:
    """A compact state in its deflated form; ``shared``: ``deflate_shared`` of the same nodes, templates and bound
    pods, made once for every state that differs from this one only in its pending list."""
    return {"format": DEFLATED_FORMAT, "shared": deflate_shared(compact) if shared is None else shared,
            "pending": list(compact["pending"])}


def inflated(data: Mapping[str, Any]) -> dict[str, Any]:
    """The compact state of a deflated one (its "shared" as bytes, or base64 text as a JSON file holds it); raises
    ValueError when it is not one, does not inflate, inflates past ``MAX_INFLATED_BYTES`` or lacks a part."""
    if not is_deflated(data):
        found = data.get("format") if isinstance(data, Mapping) else None
        raise ValueError(f"not a deflated compact state (format {found!r})")
    shared = data.get("shared")
    if isinstance(shared, str):
        try:
            shared = base64.urlsafe_b64decode(shared)
        except (ValueError, TypeError):
            raise ValueError("deflated compact state: shared is not base64") from None
    if not isinstance(shared, (bytes, bytearray)):
        raise ValueError("deflated compact state: shared must be bytes")
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(shared, MAX_INFLATED_BYTES)
    except zlib.error as exc:
        raise ValueError(f"deflated compact state: {exc}") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise ValueError(f"deflated compact state: no whole state within {MAX_INFLATED_BYTES} bytes")
    try:
        parts = msgpack.unpackb(raw, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise ValueError(f"deflated compact state: not msgpack ({type(exc).__name__})") from None
    if not isinstance(parts, dict) or set(parts) != set(_SHARED):
        raise ValueError(f"deflated compact state: shared must hold exactly {list(_SHARED)}")
    pending = data.get("pending")
    if not isinstance(pending, list):
        raise ValueError("deflated compact state: pending must be a list")
    return {"format": FORMAT, **parts, "pending": pending}


def pod_key_of(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod dict (``to_dict`` form omits the default namespace)."""
    return f"{pod.get('namespace', 'default')}/{pod.get('name', '')}"


# ---------------------------------------------------------------------------------------------
# Encoding


def _default(f) -> Any:
    if f.default is not MISSING:
        return to_dict(f.default)
    if f.default_factory is not MISSING:
        return to_dict(f.default_factory())
    return MISSING


def _node_columns(nodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Node dicts -> columns (all-default columns omitted; labels one column per key)."""
    cols: dict[str, Any] = {"n": len(nodes)}
    for f in _NODE_FIELDS:
        if f.name == "labels":
            continue
        default = _default(f)
        values = [nd.get(f.name, default) for nd in nodes]
        if default is MISSING or any(v != default for v in values):
            cols[f.name] = values
    keys = sorted({k for nd in nodes for k in nd.get("labels", {})})
    if keys:
        cols["labels"] = {k: [nd.get("labels", {}).get(k) for nd in nodes] for k in keys}
    return cols


class _Templates:
    """Pod specs without identity, numbered in order of first use."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.items: list[dict[str, Any]] = []

    def of(self, pod: Mapping[str, Any]) -> int:
        spec = {k: v for k, v in pod.items() if k not in INSTANCE_FIELDS}
        key = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        if key not in self.index:
            self.index[key] = len(self.items)
            self.items.append(spec)
        return self.index[key]


def _mask(devices: Sequence[int]) -> int:
    out = 0
    for j in devices:
        if not 0 <= int(j) < MAX_GPUS:
            raise ValueError(f"compact state: gpu device {j} outside 0..{MAX_GPUS - 1}")
        out |= 1 << int(j)
    return out


_DEVICES = tuple(tuple(j for j in range(MAX_GPUS) if mask >> j & 1) for mask in range(1 << MAX_GPUS))


def _devices_of(mask: int) -> tuple[int, ...]:
    """The devices of a bit mask, ascending (bits from MAX_GPUS up are ignored)."""
    return _DEVICES[mask & (1 << MAX_GPUS) - 1]


def _nodes_and_rows(state: Mapping[str, Any], what: str) -> tuple[list, list]:
    """(node dicts, bound pod dicts per node) of a ``state_to_dict`` state."""
    nodes = list(state["nodes"])
    rows = list(state.get("bound") or [[] for _ in nodes])
    if len(rows) != len(nodes):
        raise ValueError(f"{what}: {len(rows)} bound lists for {len(nodes)} nodes")
    return nodes, rows


def compact_dict(state: Mapping[str, Any], pending: Sequence[Mapping[str, Any]] = (),
                 without: str = "", nodes: tuple[Node, ...] | None = None) -> dict[str, Any]:
    """The compact form of a ``state_to_dict`` state and ``to_dict`` pending pods; the pod whose key is
    ``without`` (if any) is left out of both, e.g. the pod a decision placed, as it was before.
    ``state`` may also be a compact snapshot (``compact_snapshot``); ``nodes``: that snapshot's nodes when the
    caller parsed them already (``state_from_dict(state).nodes``: not parsed again)."""
    if is_snapshot(state):
        return _compact_of_snapshot(state, pending, without, nodes)
    nodes, rows = _nodes_and_rows(state, "compact state")
    templates = _Templates()
    bound = [[templates.of(p) << _MASK_BITS | _mask(p.get("gpu_devices", ())) for p in pods
              if not without or pod_key_of(p) != without] for pods in rows]
    waiting = [templates.of(p) for p in pending if not without or pod_key_of(p) != without]
    return {"format": FORMAT, "nodes": _node_columns(nodes), "templates": templates.items, "bound": bound,
            "pending": waiting}


def compact_state(state: ClusterState, pending: Sequence[Pod] = (), without: str = "") -> dict[str, Any]:
    """``compact_dict`` of a ``ClusterState`` and pending ``Pod`` s."""
    return compact_dict(state_to_dict(state), [to_dict(p) for p in pending], without)


def drop_pending(compact: Mapping[str, Any], position: int) -> dict[str, Any]:
    """The compact state without its ``position``-th pending pod (the pending list is in input order)."""
    waiting = list(compact["pending"])
    return {**compact, "pending": waiting[:position] + waiting[position + 1:]}


# ---------------------------------------------------------------------------------------------
# Decoding


def _nodes_from_columns(cols: Mapping[str, Any]) -> tuple[Node, ...]:
    n = cols["n"]
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"compact state: bad node count {n!r}")
    plain = {k: v for k, v in cols.items() if k not in ("n", "labels")}
    labels = cols.get("labels", {})
    if not isinstance(labels, Mapping):
        raise TypeError("compact state: labels must be a mapping of columns")
    for name, col in list(plain.items()) + list(labels.items()):
        if not isinstance(col, list) or len(col) != n:
            raise ValueError(f"compact state: node column {name!r} does not hold {n} values")
    nodes = []
    for i in range(n):
        data = {k: col[i] for k, col in plain.items()}
        data["labels"] = {k: col[i] for k, col in labels.items() if col[i] is not None}
        nodes.append(node_from_dict(data))
    return tuple(nodes)


def _nodes_and_templates(data: Mapping[str, Any]) -> tuple[tuple[Node, ...], list[Pod]]:
    """The nodes and the pod templates (anonymous pods) of either compact form."""
    return _nodes_from_columns(data["nodes"]), [pod_from_dict({**t, "name": ""}) for t in data["templates"]]


def _template(templates: list[_T], t: int) -> _T:
    if not 0 <= t < len(templates):
        raise ValueError(f"compact state: template {t} outside 0..{len(templates) - 1}")
    return templates[t]


def state_from_compact(data: Mapping[str, Any]) -> tuple[ClusterState, tuple[Pod, ...]]:
    """(cluster state, pending pods) of a compact state; raises ValueError/TypeError/KeyError when malformed."""
    if not is_compact(data):
        raise ValueError(f"not a compact state (format {data.get('format') if isinstance(data, Mapping) else None!r})")
    nodes, templates = _nodes_and_templates(data)
    rows = data["bound"]
    if not isinstance(rows, list) or len(rows) != len(nodes):
        raise ValueError(f"compact state: bound does not hold {len(nodes)} node lists")
    bound = []
    for i, entries in enumerate(rows):
        pods = []
        for k, entry in enumerate(entries):
            base = _template(templates, int(entry) >> _MASK_BITS)
            pods.append(replace(base, name=f"{nodes[i].name}#{k}", node_name=nodes[i].name,
                                gpu_devices=_devices_of(int(entry))))
        bound.append(tuple(pods))
    pending = tuple(replace(_template(templates, int(t)), name=f"pending#{k}") for k, t in enumerate(data["pending"]))
    return state_with_bound(nodes, bound), pending


# ---------------------------------------------------------------------------------------------
# Snapshots: the compact form with pod identity

_SNAPSHOT_DEFAULTS = {"uid": "", "creation_time": 0.0, "duration": 0.0, "gpu_devices": 0}


def _uid_out(uid: str) -> str | bytes:
    """A canonical UUID as its 16 bytes (18 on the wire instead of 37), anything else as is."""
    if len(uid) == 36:
        try:
            parsed = uuid.UUID(uid)
        except ValueError:
            return uid
        if str(parsed) == uid:
            return parsed.bytes
    return uid


def _uid_in(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return str(uuid.UUID(bytes=bytes(value)))
    if not isinstance(value, str):
        raise TypeError(f"compact snapshot: uid {value!r} is neither text nor 16 bytes")
    return value


def _time_out(t: Any) -> Any:
    """An integral float as an int (fewer bytes); decoded back to the same float."""
    return int(t) if isinstance(t, float) and t.is_integer() and abs(t) < 2 ** 53 else t


def _devices_out(devices: Sequence[int]) -> int | list[int]:
    """Ascending devices as a bit mask, any other order as the list itself (order is kept)."""
    mask = _mask(devices)
    return mask if tuple(devices) == _devices_of(mask) else [int(j) for j in devices]


def _devices_in(value: Any) -> tuple[int, ...]:
    if isinstance(value, list):
        return tuple(value)
    if not isinstance(value, int) or not 0 <= value < 1 << MAX_GPUS:
        raise ValueError(f"compact snapshot: bad gpu device mask {value!r}")
    return _devices_of(value)


def compact_snapshot_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    """The compact snapshot form of a ``state_to_dict`` state: every bound pod kept with its identity."""
    nodes, rows = _nodes_and_rows(state, "compact snapshot")
    templates = _Templates()
    cols: dict[str, list] = {k: [] for k in ("template", "name", "uid", "creation_time", "duration", "gpu_devices",
                                             "node_name")}
    own_node = True
    for nd, pods in zip(nodes, rows):
        for p in pods:
            cols["template"].append(templates.of(p))
            cols["name"].append(p["name"])
            cols["uid"].append(_uid_out(p.get("uid", "")))
            cols["creation_time"].append(_time_out(p.get("creation_time", 0.0)))
            cols["duration"].append(_time_out(p.get("duration", 0.0)))
            cols["gpu_devices"].append(_devices_out(p.get("gpu_devices", ())))
            cols["node_name"].append(p.get("node_name", ""))
            own_node = own_node and cols["node_name"][-1] == nd["name"]
    pods_out: dict[str, Any] = {"count": [len(pods) for pods in rows]}
    for k, col in cols.items():
        if k in _SNAPSHOT_DEFAULTS and all(v == _SNAPSHOT_DEFAULTS[k] for v in col) or k == "node_name" and own_node:
            continue
        pods_out[k] = col
    return {"format": SNAPSHOT_FORMAT, "nodes": _node_columns(nodes), "templates": templates.items,
            "pods": pods_out}


def compact_snapshot(state: ClusterState) -> dict[str, Any]:
    """``compact_snapshot_dict`` of a ``ClusterState``: what the state-collector publishes as a snapshot's state."""
    return compact_snapshot_dict(state_to_dict(state))


def _snapshot_columns(data: Mapping[str, Any], nodes: tuple[Node, ...]) -> tuple[list[int], dict[str, list]]:
    """(bound pods per node, every per-pod column with defaults filled in) of a compact snapshot."""
    pods = data["pods"]
    if not isinstance(pods, Mapping):
        raise TypeError("compact snapshot: pods must be a mapping of columns")
    count = pods["count"]
    if not isinstance(count, list) or len(count) != len(nodes) or \
            not all(isinstance(c, int) and c >= 0 for c in count):
        raise ValueError(f"compact snapshot: count does not hold {len(nodes)} pod counts")
    unknown = set(pods) - {"count", "template", "name", "node_name", *_SNAPSHOT_DEFAULTS}
    if unknown:
        raise ValueError(f"compact snapshot: unknown pod columns {sorted(unknown)}")
    total = sum(count)
    own = [nd.name for nd, c in zip(nodes, count) for _ in range(c)]
    cols = {"template": pods["template"], "name": pods["name"], "node_name": pods.get("node_name", own)}
    cols.update({k: pods.get(k, [v] * total) for k, v in _SNAPSHOT_DEFAULTS.items()})
    for name, col in cols.items():
        if not isinstance(col, list) or len(col) != total:
            raise ValueError(f"compact snapshot: pod column {name!r} does not hold {total} values")
    return count, cols


def state_from_snapshot(data: Mapping[str, Any]) -> ClusterState:
    """The ``ClusterState`` of a compact snapshot; raises ValueError/TypeError/KeyError when malformed."""
    if not is_snapshot(data):
        found = data.get("format") if isinstance(data, Mapping) else None
        raise ValueError(f"not a compact snapshot (format {found!r})")
    nodes, templates = _nodes_and_templates(data)
    count, cols = _snapshot_columns(data, nodes)
    tmpl, name, uid, node = cols["template"], cols["name"], cols["uid"], cols["node_name"]
    created, duration, devices = cols["creation_time"], cols["duration"], cols["gpu_devices"]
    specs = [{f: getattr(t, f) for f in _POD_FIELDS} for t in templates]  # ``replace`` without its per-call work
    bound, end = [], 0
    for c in count:
        first, end = end, end + c
        bound.append(tuple(Pod(**_template(specs, tmpl[k]), name=name[k], uid=_uid_in(uid[k]),
                               creation_time=float(created[k]), duration=float(duration[k]), node_name=node[k],
                               gpu_devices=_devices_in(devices[k])) for k in range(first, end)))
    return state_with_bound(nodes, bound)


def bound_pod_dicts(data: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    """Bound pods per node in ``to_dict`` form, of a ``state_to_dict`` state or a compact snapshot
    (for readers of a snapshot's raw pod dicts)."""
    if not is_snapshot(data):
        return [list(pods) for pods in data.get("bound") or [[] for _ in data["nodes"]]]
    return [[to_dict(p) for p in pods] for pods in state_from_snapshot(data).bound]


def _compact_of_snapshot(data: Mapping[str, Any], pending: Sequence[Mapping[str, Any]],
                         without: str, nodes: tuple[Node, ...] | None) -> dict[str, Any]:
    """``compact_dict`` of a compact snapshot, without expanding its pods: identity is dropped."""
    nodes = _nodes_from_columns(data["nodes"]) if nodes is None else nodes
    count, cols = _snapshot_columns(data, nodes)
    templates = _Templates()
    remap = [templates.of(t) for t in data["templates"]]
    spaces = [t.get("namespace", "default") for t in data["templates"]]
    bound, end = [], 0
    for c in count:
        first, end = end, end + c
        row = []
        for k in range(first, end):
            t = cols["template"][k]
            if not 0 <= t < len(remap):
                raise ValueError(f"compact snapshot: template {t} outside 0..{len(remap) - 1}")
            if not without or f"{spaces[t]}/{cols['name'][k]}" != without:
                row.append(remap[t] << _MASK_BITS | _mask(_devices_in(cols["gpu_devices"][k])))
        bound.append(row)
    waiting = [templates.of(p) for p in pending if not without or pod_key_of(p) != without]
    return {"format": FORMAT, "nodes": data["nodes"], "templates": templates.items, "bound": bound,
            "pending": waiting}


def state_from_dict(data: Mapping[str, Any]) -> ClusterState:
    """The ``ClusterState`` of any wire form (``model.state_from_dict``): ``state_to_dict`` output (``codec``),
    a compact snapshot exactly, a compact experience state (plain or deflated) without pod identity (its pending
    pods dropped)."""
    if "format" not in data:
        return codec.state_from_dict(data)
    if is_snapshot(data):
        return state_from_snapshot(data)
    if is_compact(data):
        return state_from_compact(data)[0]
    if is_deflated(data):
        return state_from_compact(inflated(data))[0]
    raise ValueError(f"unknown cluster state format {data['format']!r}")
