"""Graph edges of the scheduling graph (re-exported by ``agmarl_common.core.features``): node -> node rings
within a rack (+-``RACK_HALF``) and a zone (+-``ZONE_HALF``), pod -> pod rings between pending pods of one
service or affine label set (+-``POD_HALF``), self loops; bounded degree whatever the cluster size."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod

RACK_HALF, ZONE_HALF, POD_HALF = 2, 1, 2  # ring neighbours on each side


def _ring(members: np.ndarray, half: int) -> list[np.ndarray]:
    """Edges (src, dst) linking each member to ``half`` neighbours on each side of a ring (no self loops)."""
    k = len(members)
    if k < 2:
        return []
    out = []
    for s in range(1, min(half, (k - 1) // 2 + (k - 1) % 2) + 1):
        src, dst = members, np.roll(members, -s)
        out.append(np.stack([src, dst]))
        out.append(np.stack([dst, src]))
    return out


def node_edges(state: ClusterState) -> np.ndarray:
    """(2, E_nn) int64 node -> node: rack ring (+-RACK_HALF), zone ring (+-ZONE_HALF), self loops; unique."""
    zones, racks, rack_of = {}, {}, []
    for i, nd in enumerate(state.nodes):
        zone, rack = nd.zone, nd.rack
        if not zone and not rack:
            rack = f"pool:{nd.gpu_model or 'cpu'}"  # unlabelled nodes: one pool per GPU model
        racks.setdefault((zone, rack), []).append(i)
        rack_of.append(rack)
        zones.setdefault(zone, []).append(i)
    parts = [np.stack([np.arange(state.n_nodes)] * 2)]
    for members in racks.values():
        parts += _ring(np.asarray(members, np.int64), RACK_HALF)
    for zone, members in zones.items():  # a zone ring in rack order: links racks (pools) at their ends
        order = sorted(members, key=lambda i: (rack_of[i], i))
        parts += _ring(np.asarray(order, np.int64), ZONE_HALF)
    edges = np.concatenate(parts, axis=1)
    edges = np.unique(edges, axis=1)
    return edges.astype(np.int64)


def _pod_group(p: Pod) -> tuple | None:
    if p.service:
        return ("svc", p.namespace, p.service)
    if p.has_pod_affinity and p.labels:
        return ("labels", p.namespace, tuple(sorted(p.labels.items())))
    return None


def pod_edges(pods: Sequence[Pod]) -> np.ndarray:
    """(2, E_pp) int64 pod -> pod between pending pods of one service / affine label set (+-POD_HALF), self loops."""
    groups: dict[tuple, list[int]] = {}
    for k, p in enumerate(pods):
        g = _pod_group(p)
        if g is not None:
            groups.setdefault(g, []).append(k)
    parts = [np.stack([np.arange(len(pods))] * 2)]
    for members in groups.values():
        parts += _ring(np.asarray(members, np.int64), POD_HALF)
    if len(parts) == 1:  # self loops only: already unique and sorted
        return parts[0].astype(np.int64).reshape(2, -1)
    return np.unique(np.concatenate(parts, axis=1), axis=1).astype(np.int64).reshape(2, -1)
