"""Node rows of the scheduling graph (re-exported by ``agmarl_common.core.features``): ``node_feature_rows``,
each row a function of one node alone (so ``FeatureContext`` recomputes only the nodes whose usage
changed), in ``features.NODE_FEATURES`` order, and ``node_order_keys``, the stable per-name key of its
last column."""

from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState
from agmarl_common.core.features.pairs import CPU_SCALE, GPU_SCALE, MEM_SCALE, gpu_left
from agmarl_common.core.sim.fragmentation import TargetWorkload, expectation, node_frag_amount


def node_feature_rows(state: ClusterState, rows: np.ndarray, access: np.ndarray,
                      target: TargetWorkload) -> tuple[np.ndarray, np.ndarray]:
    """((len(rows), F_NODE) float32 features, (len(rows),) fragmentation amount) of nodes ``rows``."""
    rows = np.asarray(rows, dtype=np.int64)
    cpu_cap = state.cpu_cap[rows]
    cpu_left = cpu_cap - state.cpu_used[rows]
    mem_cap = state.mem_cap[rows]
    gcount = state.gpu_count[rows]
    left = gpu_left(state, rows)  # (r, G)
    exists = np.arange(MAX_GPUS)[None, :] < gcount[:, None]
    idle = left.sum(axis=1)
    frag = node_frag_amount(cpu_left, left, access, target)
    gpu_pods = np.array([sum(1 for p in state.bound[i] if p.num_gpu > 0) for i in rows], dtype=np.float64)
    cols = [
        cpu_left / CPU_SCALE,
        (mem_cap - state.mem_used[rows]) / MEM_SCALE,
        idle / GPU_SCALE,
        ((left >= GPU_MILLI) & exists).sum(axis=1) / MAX_GPUS,
        np.minimum(np.maximum(state.pods_cap[rows] - state.pods_used[rows], 0), 110) / 110.0,  # np.clip, cheaper
        state.cpu_used[rows] / np.maximum(cpu_cap, 1),
        state.mem_used[rows] / np.maximum(mem_cap, 1),
        np.where(gcount > 0, 1.0 - idle / np.maximum(gcount * GPU_MILLI, 1), 0.0),
        (gcount > 0).astype(np.float64),
        gcount / MAX_GPUS,
        ((left > 0) & (left < GPU_MILLI) & exists).sum(axis=1) / MAX_GPUS,
        left.max(axis=1) / GPU_MILLI,
        frag / GPU_SCALE,
        np.divide(frag, idle, out=np.zeros(len(rows)), where=idle > 0),
        expectation(access.astype(np.float64), target.prob),
        (state.pods_used[rows] == 0).astype(np.float64),
        state.schedulable[rows].astype(np.float64),
        np.minimum(gpu_pods, 16) / MAX_GPUS,
    ]
    dev = -np.sort(-left, axis=1) / GPU_MILLI  # (r, G) free milli per device, descending
    # the float64 columns rounded once into the float32 rows (one row a decision: cheaper than stacking them)
    x = np.empty((len(rows), len(cols) + MAX_GPUS + 1), np.float32)
    for j, col in enumerate(cols):
        x[:, j] = col
    x[:, len(cols):-1] = dev
    x[:, -1] = node_order_keys([state.nodes[i].name for i in rows])
    return x, frag


def node_order_keys(names: Sequence[str]) -> np.ndarray:
    """(len(names),) stable pseudo-random key in [0, 1) per node name (CRC-32 / 2**32): a fixed node order.

    Breaking near-ties between equally good nodes by one fixed order packs (a first-fit over that
    order) where a fresh random pick per pod spreads; the FGD paper's simulator gets its published
    figures from such an order. The key is a function of the name alone: the same on every
    scheduler replica, across restarts and in training."""
    return np.fromiter((zlib.crc32(n.encode("utf-8")) for n in names), np.float64, len(names)) / 2.0**32
