"""Regime features: what the gate and the drift detectors look at.

- the pod mix of arrivals: a joint distribution over 8 cells (GPU | CPU-only) x (LS | BE) x
  (with affinity terms | plain), and the marginal shares ``gpu_share``, ``ls_share``, ``be_share``
  (1 - ls), ``affinity_share``;
- ``load``: the reward's ``cluster_load`` (mean requested/allocatable of cpu, memory, gpu);
- ``load_std``: std of per-node utilisation (``balance_std``; its square is the load variance);
- ``arrival_rate``: pods first seen per second;
- ``nodes_down_share``: share of nodes not schedulable.

A pod has "affinity terms" when it carries any node selector, required or preferred node
affinity, pod (anti-)affinity or topology spread constraint. LS means ``qos == "LS"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.reward import balance_std, cluster_load

MIX_CELLS = tuple(f"{g}-{q}-{a}" for g in ("gpu", "cpu") for q in ("ls", "be") for a in ("aff", "plain"))


def has_affinity_terms(pod: Pod) -> bool:
    return bool(pod.node_selector or pod.required_node_affinity or pod.preferred_node_affinity
                or pod.has_pod_affinity or pod.topology_spread)


def mix_cell(pod: Pod) -> int:
    """Index of the pod's cell in ``MIX_CELLS``."""
    return 4 * (0 if pod.num_gpu > 0 else 1) + 2 * (0 if pod.qos == "LS" else 1) + (0 if has_affinity_terms(pod) else 1)


def mix_counts(pods: Iterable[Pod]) -> np.ndarray:
    """(8,) counts of pods per ``MIX_CELLS`` cell."""
    counts = np.zeros(len(MIX_CELLS))
    for p in pods:
        counts[mix_cell(p)] += 1
    return counts


def shares(mix: Sequence[float]) -> dict[str, float]:
    """Marginal shares of a mix (counts or probabilities); all 0 for an empty mix."""
    a = np.asarray(mix, dtype=np.float64).reshape(2, 2, 2)
    total = float(a.sum())
    if total <= 0:
        return {"gpu_share": 0.0, "ls_share": 0.0, "be_share": 0.0, "affinity_share": 0.0}
    ls = float(a[:, 0, :].sum()) / total
    return {"gpu_share": float(a[0].sum()) / total, "ls_share": ls, "be_share": 1.0 - ls,
            "affinity_share": float(a[:, :, 0].sum()) / total}


@dataclass(frozen=True, slots=True)
class RegimeFeatures:
    load: float = 0.0
    load_std: float = 0.0
    arrival_rate: float = 0.0
    nodes_down_share: float = 0.0
    gpu_share: float = 0.0
    ls_share: float = 0.0
    be_share: float = 0.0
    affinity_share: float = 0.0
    mix: tuple[float, ...] = (0.0,) * len(MIX_CELLS)  # probabilities over MIX_CELLS

    def as_dict(self) -> dict[str, float]:
        out = {k: round(float(getattr(self, k)), 4) for k in self.__dataclass_fields__ if k != "mix"}
        out["mix"] = {c: round(float(v), 4) for c, v in zip(MIX_CELLS, self.mix)}
        return out


def regime_features(state: ClusterState, mix: Sequence[float], arrival_rate: float) -> RegimeFeatures:
    """Features from a cluster state, a (smoothed) arrival mix and an arrival rate."""
    a = np.asarray(mix, dtype=np.float64)
    probs = a / a.sum() if a.sum() > 0 else np.zeros(len(MIX_CELLS))
    n = max(state.n_nodes, 1)
    return RegimeFeatures(load=cluster_load(state), load_std=balance_std(state), arrival_rate=float(arrival_rate),
                          nodes_down_share=1.0 - float(np.count_nonzero(state.schedulable)) / n,
                          mix=tuple(probs.tolist()), **shares(probs))


def regime_features_from_stats(stats: dict[str, float], mix: Sequence[float], arrival_rate: float) -> RegimeFeatures:
    """Features from snapshot statistics (``utilisation_<resource>``, ``balance``, optional ``nodes_down``
    and ``nodes``), without decoding the state. GPU utilisation enters the load only when above 0."""
    used = [stats.get("utilisation_cpu", 0.0), stats.get("utilisation_memory", 0.0)]
    if stats.get("utilisation_gpu", 0.0) > 0:
        used.append(stats["utilisation_gpu"])
    a = np.asarray(mix, dtype=np.float64)
    probs = a / a.sum() if a.sum() > 0 else np.zeros(len(MIX_CELLS))
    nodes = stats.get("nodes", 0.0)
    return RegimeFeatures(load=float(np.mean(used)), load_std=float(stats.get("balance", 0.0)),
                          arrival_rate=float(arrival_rate),
                          nodes_down_share=float(stats.get("nodes_down", 0.0)) / nodes if nodes else 0.0,
                          mix=tuple(probs.tolist()), **shares(probs))
