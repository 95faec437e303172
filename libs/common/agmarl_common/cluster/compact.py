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
Pure: plain dicts in, plain dicts out.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields, replace
from typing import Any, Mapping, Sequence

from agmarl_common.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState, Node, Pod, node_from_dict, \
    pod_from_dict, state_to_dict, to_dict

FORMAT = "agmarl.compact/1"
INSTANCE_FIELDS = ("name", "uid", "node_name", "gpu_devices", "creation_time", "duration")
_MASK_BITS = 8  # low bits of a bound entry: GPU device mask (MAX_GPUS devices)
_NODE_FIELDS = tuple(f for f in fields(Node))


def is_compact(data: Any) -> bool:
    """Is ``data`` a compact state (``compact_state`` output)?"""
    return isinstance(data, Mapping) and data.get("format") == FORMAT


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


def compact_dict(state: Mapping[str, Any], pending: Sequence[Mapping[str, Any]] = (),
                 without: str = "") -> dict[str, Any]:
    """The compact form of a ``state_to_dict`` state and ``to_dict`` pending pods; the pod whose key is
    ``without`` (if any) is left out of both, e.g. the pod a decision placed, as it was before."""
    nodes = list(state["nodes"])
    rows = list(state.get("bound") or [[] for _ in nodes])
    if len(rows) != len(nodes):
        raise ValueError(f"compact state: {len(rows)} bound lists for {len(nodes)} nodes")
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


def _template(templates: list[Pod], t: int) -> Pod:
    if not 0 <= t < len(templates):
        raise ValueError(f"compact state: template {t} outside 0..{len(templates) - 1}")
    return templates[t]


def state_from_compact(data: Mapping[str, Any]) -> tuple[ClusterState, tuple[Pod, ...]]:
    """(cluster state, pending pods) of a compact state; raises ValueError/TypeError/KeyError when malformed."""
    if not is_compact(data):
        raise ValueError(f"not a compact state (format {data.get('format') if isinstance(data, Mapping) else None!r})")
    nodes = _nodes_from_columns(data["nodes"])
    templates = [pod_from_dict({**t, "name": ""}) for t in data["templates"]]
    rows = data["bound"]
    if not isinstance(rows, list) or len(rows) != len(nodes):
        raise ValueError(f"compact state: bound does not hold {len(nodes)} node lists")
    state = ClusterState.empty(nodes)
    cpu, mem, cnt, eph, aff = (a.copy() for a in (state.cpu_used, state.mem_used, state.pods_used, state.eph_used,
                                                  state.affinity_pods))
    gpu = state.gpu_used.copy()
    bound = []
    for i, entries in enumerate(rows):
        pods = []
        for k, entry in enumerate(entries):
            base = _template(templates, int(entry) >> _MASK_BITS)
            devices = tuple(j for j in range(MAX_GPUS) if int(entry) >> j & 1)
            p = replace(base, name=f"{nodes[i].name}#{k}", node_name=nodes[i].name, gpu_devices=devices)
            pods.append(p)
            cpu[i] += p.cpu_milli
            mem[i] += p.memory_mib
            cnt[i] += 1
            eph[i] += p.ephemeral_mib
            aff[i] += p.has_pod_affinity
            for j in devices:
                gpu[i, j] += p.gpu_milli if p.is_gpu_share else GPU_MILLI
        bound.append(tuple(pods))
    pending = tuple(replace(_template(templates, int(t)), name=f"pending#{k}") for k, t in enumerate(data["pending"]))
    state = replace(state, cpu_used=cpu, mem_used=mem, pods_used=cnt, eph_used=eph, gpu_used=gpu,
                    bound=tuple(bound), affinity_pods=aff, pods_by_label=None)
    return state, pending

