"""The reward-aware gains of many pods against one state at once: the one implementation of
``rewardaware``'s balance, utilisation, ls_ok and io_locality gains (``rewardaware.score_*_gain`` and
``reward_gains`` are this function for a batch of one; the definitions are in ``rewardaware``'s docstring).

The per-state terms (per-node utilisation, the balance sums, cpu pressure, LS pods per node, IO-heavy
count, local-SSD nodes) are computed once per batch and the gains vectorised over every (pod,
candidate) pair, pod-major. ``net_locality`` walks the bound pods of the pod's service, so it stays per
pod (``rewardaware.score_net_gain``), for pods with a service only. The learned policy's
``reward_gain`` input (``features_pairs.objective_gains``) scores a whole batch of pending pods with it
(``RewardAwarePolicy.score_batch``); scoring pod by pod recomputed the per-state terms for every pod.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from agmarl_common.cluster.model import ClusterState, Pod, pod_index
from agmarl_common.policies.rewardaware import (
    _label_count,
    node_mean_utilisation,
    overload_loss,
    score_net_gain,
)
from agmarl_common.reward import HOT_NODE_THRESHOLD, IO_HEAVY_LABEL, LOCAL_SSD_LABEL
from agmarl_common.sim.metrics import LS_QOS, node_cpu_pressure


def pairs(candidates: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sizes (P,), node index per pair (E,), pod position per pair (E,)), pod-major."""
    cands = [np.asarray(c, dtype=np.int64) for c in candidates]
    sizes = np.array([c.size for c in cands], dtype=np.int64)
    idx = np.concatenate(cands) if cands else np.zeros(0, np.int64)
    return sizes, idx, np.repeat(np.arange(len(cands)), sizes)


def reward_gains_batch(pods: Sequence[Pod], state: ClusterState, candidates: Sequence[np.ndarray],
                       threshold: float = HOT_NODE_THRESHOLD) -> dict[str, np.ndarray]:
    """Every gain of ``rewardaware.GAINS`` per (pod, candidate) pair, concatenated pod-major."""
    sizes, idx, pod_of = pairs(candidates)
    e = idx.size
    zeros = np.zeros(e)
    if e == 0:
        return {"balance": zeros, "utilisation": zeros, "ls_ok": zeros, "io_locality": zeros,
                "net_locality": zeros}
    cpu = np.array([p.cpu_milli for p in pods], dtype=np.float64)[pod_of]
    mem = np.array([p.memory_mib for p in pods], dtype=np.float64)[pod_of]
    cpu_cap = np.maximum(state.cpu_cap[idx], 1)
    d = (cpu / cpu_cap + mem / np.maximum(state.mem_cap[idx], 1)) / 2.0  # pod_utilisation_delta
    u_all = node_mean_utilisation(state)
    u = u_all[idx]
    # balance (score_balance_gain)
    up = state.schedulable
    n_up = int(up.sum())
    if n_up:
        s, q = float(u_all[up].sum()), float((u_all[up] ** 2).sum())
        std0 = np.sqrt(max(q / n_up - (s / n_up) ** 2, 0.0))
        du = np.where(up[idx], d, 0.0)
        q1 = q + 2.0 * u * du + du ** 2
        balance = -2.0 * (np.sqrt(np.maximum(q1 / n_up - ((s + du) / n_up) ** 2, 0.0)) - std0)
    else:
        balance = zeros
    # utilisation knee (score_utilisation_gain)
    utilisation = -(overload_loss(u + d) - overload_loss(u)) / max(n_up, 1)
    # ls_ok (score_ls_gain): zero for a pod with no crossing candidate and no own hot placement
    is_ls = np.array([p.qos == LS_QOS for p in pods], dtype=bool)[pod_of]
    pressure = node_cpu_pressure(state)
    after = pressure[idx] + cpu / cpu_cap
    crossing = (pressure[idx] <= threshold) & (after > threshold)
    own = ((after > threshold) & is_ls).astype(np.float64)
    ls_ok = zeros
    if crossing.any() or own.any():
        moved = np.bincount(pod_of, weights=(crossing | (own > 0)).astype(np.float64), minlength=len(pods)) > 0
        ls_nodes = pod_index(state).ls.astype(np.float64)
        total0 = float(ls_nodes.sum())
        total1 = total0 + is_ls
        bad0 = float(ls_nodes[pressure > threshold].sum())
        before = 1.0 - bad0 / total0 if total0 else 1.0
        safe = np.where(total1 > 0, total1, 1.0)
        gain = 1.0 - (bad0 + np.where(crossing, ls_nodes[idx], 0.0) + own) / safe - before
        ls_ok = np.where(moved[pod_of] & (total1 > 0), gain, 0.0)
    # io_locality (score_io_gain)
    io = np.array([p.labels.get(IO_HEAVY_LABEL) == "true" for p in pods], dtype=bool)[pod_of]
    io_locality = zeros
    if io.any():
        ssd = np.array([n.labels.get(LOCAL_SSD_LABEL) == "true" for n in state.nodes], dtype=np.float64)
        io_locality = np.where(io, ssd[idx], 0.0) / (_label_count(state, IO_HEAVY_LABEL) + 1)
    # net_locality (score_net_gain), per pod with a service
    net = np.zeros(e)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for k, pod in enumerate(pods):
        if pod.service and sizes[k]:
            net[starts[k]:starts[k + 1]] = score_net_gain(pod, state, idx[starts[k]:starts[k + 1]])
    return {"balance": balance, "utilisation": utilisation, "ls_ok": ls_ok, "io_locality": io_locality,
            "net_locality": net}
