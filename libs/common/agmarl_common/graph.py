"""The candidate view that travels from graph-builder to inference.

graph-builder turns (pending pod, cluster state, candidates after the hard filter) into a
``features`` dict of plain lists; inference turns it back into a candidate-only ``ClusterState``
for the policies and the final guard. The learned model's inputs are built from that state by
``agmarl_common.features`` (the same code the trainer uses). Pure functions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from agmarl_common.cluster.model import MAX_GPUS, ClusterState, Node


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
