"""Graph features, built by the same code in training and in serving (no train/serve skew).

graph-builder turns (pending pod, cluster state, candidates after the hard filter) into a
``features`` dict of plain lists that travels on the wire; inference turns it back into a
candidate-only ``ClusterState`` (for baseline scorers and the final guard) and feature matrices
(for the model). Pure functions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from agmarl_common.cluster.model import MAX_GPUS, ClusterState, Node, Pod

NODE_FEATURES = ("cpu_free", "mem_free", "gpu_free", "gpu_whole_free", "pods_free", "cpu_util", "mem_util",
                 "gpu_util", "has_gpu")
POD_FEATURES = ("cpu", "mem", "gpu", "gpu_share", "is_ls")
CPU_SCALE = 128_000.0  # milli-cpu of a large node
MEM_SCALE = 1_048_576.0  # MiB of a large node


def candidate_features(state: ClusterState, candidates: np.ndarray) -> dict[str, Any]:
    """Plain-list description of the candidate nodes: capacities, usage and labels."""
    idx = np.asarray(candidates, dtype=np.int64)
    return {
        "names": [state.nodes[i].name for i in idx],
        "cpu_cap": state.cpu_cap[idx].tolist(),
        "cpu_used": state.cpu_used[idx].tolist(),
        "mem_cap": state.mem_cap[idx].tolist(),
        "mem_used": state.mem_used[idx].tolist(),
        "pods_cap": state.pods_cap[idx].tolist(),
        "pods_used": state.pods_used[idx].tolist(),
        "gpu_count": state.gpu_count[idx].tolist(),
        "gpu_model": [str(state.gpu_model[i]) for i in idx],
        "gpu_used": state.gpu_used[idx].tolist(),
        "labels": [dict(state.nodes[i].labels) for i in idx],
    }


def state_from_features(features: Mapping[str, Any]) -> ClusterState:
    """The candidate-only cluster state (usage arrays as sent; bound pods are not carried)."""
    names = list(features["names"])
    n = len(names)
    for key in ("cpu_cap", "cpu_used", "mem_cap", "mem_used", "pods_cap", "pods_used", "gpu_count", "gpu_used"):
        if len(features[key]) != n:
            raise ValueError(f"features[{key!r}] has {len(features[key])} rows, expected {n}")
    labels = features.get("labels") or [{} for _ in names]
    nodes = tuple(
        Node(name=names[i], cpu_milli=int(features["cpu_cap"][i]), memory_mib=int(features["mem_cap"][i]),
             gpu_count=int(features["gpu_count"][i]), gpu_model=str(features["gpu_model"][i]),
             max_pods=int(features["pods_cap"][i]), labels=dict(labels[i]))
        for i in range(n)
    )
    state = ClusterState.empty(nodes)
    gpu = np.zeros((n, MAX_GPUS), dtype=np.int64)
    if n:
        gpu[:, :] = np.asarray(features["gpu_used"], dtype=np.int64).reshape(n, MAX_GPUS)
    return replace(state, cpu_used=np.asarray(features["cpu_used"], dtype=np.int64),
                   mem_used=np.asarray(features["mem_used"], dtype=np.int64),
                   pods_used=np.asarray(features["pods_used"], dtype=np.int64), gpu_used=gpu)


def node_feature_matrix(state: ClusterState, idx: np.ndarray | None = None) -> np.ndarray:
    """(n, len(NODE_FEATURES)) float32 features in roughly [0, 1]."""
    if idx is None:
        idx = np.arange(state.n_nodes)
    cpu_cap = np.maximum(state.cpu_cap[idx], 1)
    mem_cap = np.maximum(state.mem_cap[idx], 1)
    gcount = state.gpu_count[idx]
    free = state.gpu_free()[idx]
    gpu_cap = np.maximum(gcount * 1000, 1)
    cols = [
        (state.cpu_cap[idx] - state.cpu_used[idx]) / CPU_SCALE,
        (state.mem_cap[idx] - state.mem_used[idx]) / MEM_SCALE,
        free.sum(axis=1) / 8000.0,
        (free >= 1000).sum(axis=1) / 8.0,
        (state.pods_cap[idx] - state.pods_used[idx]) / 110.0,
        state.cpu_used[idx] / cpu_cap,
        state.mem_used[idx] / mem_cap,
        np.where(gcount > 0, state.gpu_used[idx].sum(axis=1) / gpu_cap, 0.0),
        (gcount > 0).astype(np.float64),
    ]
    return np.stack(cols, axis=1).astype(np.float32)


def pod_feature_vector(pod: Pod) -> np.ndarray:
    """(len(POD_FEATURES),) float32."""
    return np.array([
        pod.cpu_milli / CPU_SCALE,
        pod.memory_mib / MEM_SCALE,
        pod.num_gpu / 8.0,
        pod.gpu_milli / 1000.0 if pod.is_gpu_share else 0.0,
        1.0 if pod.qos in ("LS", "Guaranteed") else 0.0,
    ], dtype=np.float32)
