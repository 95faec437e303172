"""Load-aware baselines: Trimaran (kubernetes-sigs/scheduler-plugins) and Koordinator LoadAware.

Measured load comes from ``state.cpu_load`` / ``state.mem_load`` when the state carries it;
otherwise the requests bound on the node stand in for it. No history means no variance: the
standard deviation of LoadVariationRiskBalancing is 0 unless the caller passes one.
All scorers are pure: ``(pod, state, candidates) -> (len(candidates),) float`` in 0..100.
"""

from __future__ import annotations

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.policies.base import PolicyBase
from agmarl_common.core.scoring.kube_resources import MAX_NODE_SCORE

# Trimaran defaults (pkg/apis/config/v1 defaults)
TLP_TARGET_PERCENT = 40
TLP_REQUESTS_MULTIPLIER = 1.5
TLP_DEFAULT_REQUEST_MILLI = 1000
LVRB_MARGIN = 1.0
LVRB_SENSITIVITY = 1.0
# Koordinator LoadAwareScheduling defaults
KOORD_WEIGHTS = {"cpu": 1, "memory": 1}
KOORD_THRESHOLDS = {"cpu": 65, "memory": 95}  # percent; 0 disables
KOORD_SCALING = {"cpu": 85, "memory": 70}  # percent of the request a pod is estimated to use
KOORD_DEFAULT_CPU_MILLI = 250
KOORD_DEFAULT_MEMORY_MIB = 200


def _round(x: np.ndarray) -> np.ndarray:
    """Go's math.Round (half away from zero)."""
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _cpu_load(state: ClusterState, c: np.ndarray) -> np.ndarray:
    return (state.cpu_load if state.cpu_load is not None else state.cpu_used)[c].astype(np.float64)


def _mem_load(state: ClusterState, c: np.ndarray) -> np.ndarray:
    return (state.mem_load if state.mem_load is not None else state.mem_used)[c].astype(np.float64)


def score_target_load_packing(pod: Pod, state: ClusterState, candidates: np.ndarray,
                              target: int = TLP_TARGET_PERCENT) -> np.ndarray:
    """TargetLoadPacking: predicted cpu % = 100 * (node load + pod estimate) / capacity, where the pod
    estimate is 1.5 x its cpu request (1000m without one). Up to ``target`` the score climbs from
    ``target`` to 100; above it falls linearly to 0 at 100 %; beyond 100 % it is 0."""
    c = np.asarray(candidates, dtype=np.int64)
    pod_use = round(pod.cpu_milli * TLP_REQUESTS_MULTIPLIER) if pod.cpu_milli > 0 else TLP_DEFAULT_REQUEST_MILLI
    cap = state.cpu_cap[c].astype(np.float64)
    predicted = 100.0 * (_cpu_load(state, c) + pod_use) / np.maximum(cap, 1.0)
    below = _round((100.0 - target) * predicted / target + target)
    above = _round(target * (100.0 - predicted) / (100.0 - target))
    score = np.where(predicted > target, np.where(predicted > 100.0, 0.0, above), below)
    return np.where(cap > 0, score, 0.0)


def _risk_score(req: float, used: np.ndarray, std: np.ndarray, cap: np.ndarray,
                margin: float, sensitivity: float) -> np.ndarray:
    """(1 - risk) * 100 with risk = (mu + margin * sigma^(1/sensitivity)) / 2, everything in [0, 1]."""
    safe = np.maximum(cap, 1.0)
    used = np.clip(used, 0.0, cap)
    std = np.clip(std, 0.0, cap)
    mu = np.clip((used + max(req, 0.0)) / safe, 0.0, 1.0)
    sigma = np.clip(std / safe, 0.0, 1.0)
    if sensitivity > 0:
        sigma = sigma ** (1.0 / sensitivity)
    sigma = np.clip(sigma * margin, 0.0, 1.0)
    return np.where(cap > 0, (1.0 - (mu + sigma) / 2.0) * MAX_NODE_SCORE, 0.0)


def score_load_variation_risk(pod: Pod, state: ClusterState, candidates: np.ndarray,
                              margin: float = LVRB_MARGIN, sensitivity: float = LVRB_SENSITIVITY,
                              cpu_std: np.ndarray | None = None, mem_std: np.ndarray | None = None) -> np.ndarray:
    """LoadVariationRiskBalancing: min over cpu and memory of the risk score, rounded.
    ``cpu_std`` / ``mem_std`` are per-node (n_nodes,) standard deviations of measured usage."""
    c = np.asarray(candidates, dtype=np.int64)
    zeros = np.zeros(len(c))
    cpu = _risk_score(pod.cpu_milli, _cpu_load(state, c), zeros if cpu_std is None else cpu_std[c],
                      state.cpu_cap[c].astype(np.float64), margin, sensitivity)
    mem = _risk_score(pod.memory_mib, _mem_load(state, c), zeros if mem_std is None else mem_std[c],
                      state.mem_cap[c].astype(np.float64), margin, sensitivity)
    return _round(np.minimum(cpu, mem))


def _koord_pod_estimate(pod: Pod, scaling: dict[str, int]) -> dict[str, int]:
    """Koordinator's default estimator: request x scaling factor, defaults for missing requests."""
    cpu = round(pod.cpu_milli * scaling["cpu"] / 100) if pod.cpu_milli > 0 else KOORD_DEFAULT_CPU_MILLI
    mem = round(pod.memory_mib * scaling["memory"] / 100) if pod.memory_mib > 0 else KOORD_DEFAULT_MEMORY_MIB
    return {"cpu": cpu, "memory": mem}


def score_load_aware(pod: Pod, state: ClusterState, candidates: np.ndarray,
                     weights: dict[str, int] = KOORD_WEIGHTS, thresholds: dict[str, int] = KOORD_THRESHOLDS,
                     scaling: dict[str, int] = KOORD_SCALING) -> np.ndarray:
    """Koordinator LoadAware: least-used score on (node usage + pod estimate) per resource, weighted
    and integer-averaged. Node usage is the measured load, or bound requests x scaling factor
    without measurements. A node whose current usage reaches a threshold (rounded %) scores 0:
    the plugin's Filter, expressed as a score because a policy cannot filter."""
    c = np.asarray(candidates, dtype=np.int64)
    est = _koord_pod_estimate(pod, scaling)
    usage = {
        "cpu": state.cpu_load[c] if state.cpu_load is not None else _round(state.cpu_used[c] * scaling["cpu"] / 100),
        "memory": state.mem_load[c] if state.mem_load is not None else _round(state.mem_used[c] * scaling["memory"] / 100),
    }
    cap = {"cpu": state.cpu_cap[c], "memory": state.mem_cap[c]}
    total = np.zeros(len(c), dtype=np.int64)
    wsum = 0
    overloaded = np.zeros(len(c), dtype=bool)
    for res, w in weights.items():
        a = cap[res].astype(np.int64)
        used = np.asarray(usage[res], dtype=np.int64)
        limit = thresholds.get(res, 0)
        if limit > 0:
            pct = _round(used / np.maximum(a, 1) * 100)
            overloaded |= (a > 0) & (pct >= limit)
        r = used + est[res]
        s = np.where((a == 0) | (r > a), 0, (a - r) * MAX_NODE_SCORE // np.maximum(a, 1))
        total += s * w
        wsum += w
    score = total // wsum if wsum else np.zeros(len(c), dtype=np.int64)
    return np.where(overloaded, 0, score).astype(np.float64)


class TargetLoadPackingPolicy(PolicyBase):
    name = "trimaran-tlp"

    def __init__(self, target: int = TLP_TARGET_PERCENT):
        self.target = target

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        return score_target_load_packing(pod, state, candidates, self.target)


class LoadVariationRiskBalancingPolicy(PolicyBase):
    name = "trimaran-lvrb"

    def __init__(self, margin: float = LVRB_MARGIN, sensitivity: float = LVRB_SENSITIVITY):
        self.margin, self.sensitivity = margin, sensitivity

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        return score_load_variation_risk(pod, state, candidates, self.margin, self.sensitivity)


class KoordLoadAwarePolicy(PolicyBase):
    name = "koord-loadaware"

    def __init__(self, weights: dict[str, int] = KOORD_WEIGHTS, thresholds: dict[str, int] = KOORD_THRESHOLDS,
                 scaling: dict[str, int] = KOORD_SCALING):
        self.weights, self.thresholds, self.scaling = dict(weights), dict(thresholds), dict(scaling)

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        return score_load_aware(pod, state, candidates, self.weights, self.thresholds, self.scaling)
