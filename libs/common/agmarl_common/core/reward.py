"""The reward, defined once: components in [0, 1] computed from cluster state and outcome counts,
and three weighting schemes that turn them into one number in [0, 1].

Used by the reward-calculator service, the simulator-based evaluation and the trainer, so training
and serving optimise the same thing. Pure functions over plain data.

Components (all in [0, 1], higher is better):
- ``utilisation``: mean requested/allocatable, rising to 1 at 80 % and falling to 0.5 at 100 %;
- ``balance``: 1 - 2 * std of per-node utilisation (variance across nodes);
- ``sla``: mean of ``pending`` (share of pods seen in the window not left waiting), ``wait``
  (1 / (1 + mean pending time / 30 s)), ``failed`` (share not failed: failed pods, evicted ones not
  restarted among them, pending timeouts, refused binds; ``outcomes_from_stats``) and ``ls_ok`` (share of
  latency-sensitive pods, qos LS, not on a node whose cpu pressure exceeds 80 %);
- ``constraints``: 1 - hard-constraint violations per bound pod (0 when there are as many as pods);
- ``business``: mean of ``io_locality`` (share of IO-heavy pods, label ``agmarl.io/io-heavy=true``,
  on local-SSD nodes, label ``agmarl.io/local-ssd=true``) and ``net_locality`` (network-heavy pods,
  label ``agmarl.io/network-heavy=true``: mean share of their peers, same namespace and service,
  in their zone); a term with no pod to judge is 1.

Schemes (``SCHEMES``): ``fixed`` weights; ``load_conditional`` (balance weighted up below the load
threshold, utilisation above it); ``lexicographic`` (stress-aware ordered tiers: constraints, then
SLA, then utilisation/balance/business; SLA joins the last tier when the cluster is not stressed).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import Mapping

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Pod
from agmarl_common.core.cluster.metrics import node_cpu_pressure, sla_violators
from agmarl_common.core.cluster.specs import LS_QOS
UTILISATION_KNEE = 0.8  # above this, utilisation is penalised (overload risk)
HOT_NODE_THRESHOLD = 0.8  # cpu pressure above which a node is overloaded for LS pods
PENDING_TIME_REF_S = 30.0  # mean pending time that halves the wait score
LOCAL_SSD_LABEL = "agmarl.io/local-ssd"
IO_HEAVY_LABEL = "agmarl.io/io-heavy"
NETWORK_HEAVY_LABEL = "agmarl.io/network-heavy"
SCHEMES = ("fixed", "load_conditional", "lexicographic")
COMPONENTS = ("utilisation", "balance", "sla", "constraints", "business")


@dataclass(frozen=True, slots=True)
class RewardWeights:
    """Weights of the components; ``pending`` and ``failed`` are part of ``sla`` (0 by default)."""

    utilisation: float = 0.25
    balance: float = 0.20
    pending: float = 0.0
    failed: float = 0.0
    constraints: float = 0.20
    sla: float = 0.25
    business: float = 0.10

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Counts over the window the reward covers."""

    pending: int = 0  # pods still waiting at the end of the window
    scheduled: int = 0  # pods bound in the window
    failed: int = 0  # pods gone for good: failed (evicted, not restarted), unschedulable timeouts, refused binds
    violations: int = 0  # hard-constraint violations found in the state
    pending_time_s: float = 0.0  # mean time the waiting pods have waited


def utilisation_by_resource(state: ClusterState) -> dict[str, float]:
    """Cluster-wide requested / allocatable per resource (schedulable nodes only)."""
    return _utilisation(state, state.cpu_used, state.mem_used, state.gpu_used.sum(axis=1))


def _utilisation(state: ClusterState, cpu_used: np.ndarray, mem_used: np.ndarray,
                 gpu_used: np.ndarray) -> dict[str, float]:
    """``utilisation_by_resource`` of ``state``'s nodes with these per-node requests (gpu: milli per node)."""
    m = state.schedulable
    out = {}
    for name, used, cap in (("cpu", cpu_used, state.cpu_cap), ("memory", mem_used, state.mem_cap),
                            ("gpu", gpu_used, state.gpu_count * 1000)):
        total = float(cap[m].sum())
        out[name] = float(used[m].sum()) / total if total > 0 else 0.0
    return out


def cluster_load(state: ClusterState) -> float:
    """Mean of cpu and memory utilisation (and gpu when the cluster has GPUs): the scheme's load."""
    return _load(state, utilisation_by_resource(state))


def _load(state: ClusterState, util: Mapping[str, float]) -> float:
    used = [util["cpu"], util["memory"]] + ([util["gpu"]] if state.gpu_count.sum() > 0 else [])
    return float(np.mean(used))


def score_utilisation(util: float) -> float:
    """Rises linearly to 1 at the knee, then falls linearly to 0.5 at 100 % (overload penalty)."""
    util = min(max(util, 0.0), 1.0)
    if util <= UTILISATION_KNEE:
        return util / UTILISATION_KNEE
    return 1.0 - 0.5 * (util - UTILISATION_KNEE) / (1.0 - UTILISATION_KNEE)


def balance_std(state: ClusterState) -> float:
    """Std of per-node mean(cpu, memory) utilisation across schedulable nodes."""
    return _balance_std(state, state.cpu_used, state.mem_used)


def _balance_std(state: ClusterState, cpu_used: np.ndarray, mem_used: np.ndarray) -> float:
    """``balance_std`` of ``state``'s nodes with these per-node requests."""
    if state.n_nodes == 0:
        return 0.0
    cpu = cpu_used / np.maximum(state.cpu_cap, 1)
    mem = mem_used / np.maximum(state.mem_cap, 1)
    u = np.stack([cpu, mem], axis=1)[state.schedulable]
    if len(u) == 0:
        return 0.0
    return float(np.std(u.mean(axis=1)))


def score_balance(std: float) -> float:
    """1 for perfectly even nodes, 0 at std >= 0.5 (the maximum for values in [0, 1])."""
    return float(max(0.0, 1.0 - 2.0 * std))


def score_wait(mean_pending_s: float) -> float:
    """1 / (1 + t / 30 s): 1 with no wait, 0.5 at 30 s, -> 0 as waits grow."""
    return 1.0 / (1.0 + max(mean_pending_s, 0.0) / PENDING_TIME_REF_S)


def score_ls_placement(state: ClusterState, threshold: float = HOT_NODE_THRESHOLD) -> float:
    """Share of running LS pods not on an overloaded node (1 when none runs)."""
    bad, total = sla_violators(state, threshold)
    return 1.0 - len(bad) / total if total else 1.0


def score_constraints(violations: int, n_bound: int) -> float:
    """1 - violations per bound pod, clipped to [0, 1] (0 violations -> 1)."""
    if violations <= 0:
        return 1.0
    return max(0.0, 1.0 - violations / max(n_bound, 1))


def _locality_walk(state: ClusterState) -> tuple[int, int, dict[tuple[str, str], dict[str, int]],
                                                  list[tuple[tuple[str, str], str]]]:
    """One pass over the bound pods: (IO-heavy pods, those on local SSD, (namespace, service) -> zone -> pods,
    the network-heavy pods' (service, zone) in order)."""
    io_total = io_ok = 0
    zones: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    net: list[tuple[tuple[str, str], str]] = []
    for node, pods in zip(state.nodes, state.bound):
        ssd = node.labels.get(LOCAL_SSD_LABEL) == "true"
        zone = node.zone
        for p in pods:
            if p.labels.get(IO_HEAVY_LABEL) == "true":
                io_total += 1
                io_ok += ssd
            if p.service:
                key = (p.namespace, p.service)
                zones[key][zone] += 1
                if p.labels.get(NETWORK_HEAVY_LABEL) == "true":
                    net.append((key, zone))
    return io_total, io_ok, zones, net


def business_terms(state: ClusterState) -> dict[str, float]:
    """``io_locality`` and ``net_locality`` (see the module docstring); 1 when no pod is concerned."""
    io_total, io_ok, zones, net = _locality_walk(state)
    shares = []
    for key, zone in net:
        peers = sum(zones[key].values()) - 1
        if peers > 0:
            shares.append((zones[key][zone] - 1) / peers)
    return {"io_locality": io_ok / io_total if io_total else 1.0,
            "net_locality": float(np.mean(shares)) if shares else 1.0}


def reward_components(state: ClusterState, outcomes: Outcomes) -> dict[str, float]:
    """Every component in [0, 1], higher is better (the five of ``COMPONENTS`` and their sub-terms)."""
    return _components(cluster_load(state), balance_std(state), score_ls_placement(state), business_terms(state),
                       int(state.pods_used.sum()), outcomes)


def _components(load: float, std: float, ls_ok: float, business: Mapping[str, float], n_bound: int,
                outcomes: Outcomes) -> dict[str, float]:
    seen = outcomes.pending + outcomes.scheduled + outcomes.failed
    pending = 1.0 - outcomes.pending / seen if seen else 1.0
    failed = 1.0 - outcomes.failed / seen if seen else 1.0
    wait = score_wait(outcomes.pending_time_s)
    return {
        "utilisation": score_utilisation(load),
        "balance": score_balance(std),
        "pending": pending, "failed": failed, "wait": wait, "ls_ok": ls_ok,
        "sla": (pending + failed + wait + ls_ok) / 4.0,
        "constraints": score_constraints(outcomes.violations, n_bound),
        **business,
        "business": (business["io_locality"] + business["net_locality"]) / 2.0,
    }


# ---------------------------------------------------------------------------------------------
# The components after one more placement, without rebuilding the cluster (credit per decision)


@dataclass(frozen=True)
class PlacementBase:
    """What the components of every placement of one more pod on ``state`` share, computed once: the loops
    over bound pods (LS pods per node and which nodes are hot, the locality counts). ``placement_base``
    builds it; ``components_after`` uses it."""

    state: ClusterState
    hot: np.ndarray  # (n,) cpu pressure over HOT_NODE_THRESHOLD
    ls_on: np.ndarray  # (n,) LS pods per node
    ls_bad: int  # LS pods on hot nodes
    ls_total: int
    io_total: int
    io_ok: int
    zones: Mapping[tuple[str, str], Mapping[str, int]]  # (namespace, service) -> zone -> pods
    heavy: Mapping[tuple[str, str], Mapping[str, int]]  # the network-heavy ones among them
    net_sum: float  # sum of the network-heavy pods' peer shares (``business_terms``)
    net_count: int


def _net_part(zones: Mapping[str, int], heavy: Mapping[str, int]) -> tuple[float, int]:
    """(sum of peer shares, how many) of one service's network-heavy pods (none count without peers)."""
    peers = sum(zones.values()) - 1
    if peers <= 0:
        return 0.0, 0
    return sum(n * (zones.get(z, 0) - 1) / peers for z, n in heavy.items()), sum(heavy.values())


def placement_base(state: ClusterState) -> PlacementBase:
    """The shared part of ``components_after`` for ``state`` (one pass over its bound pods)."""
    hot = node_cpu_pressure(state) > HOT_NODE_THRESHOLD
    ls_on = np.array([sum(1 for p in pods if p.qos == LS_QOS) for pods in state.bound], dtype=np.int64)
    io_total, io_ok, zones, net = _locality_walk(state)
    heavy: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for key, zone in net:
        heavy[key][zone] += 1
    parts = [_net_part(zones[key], h) for key, h in heavy.items()]
    return PlacementBase(state, hot, ls_on, int(ls_on[hot].sum()) if len(ls_on) else 0, int(ls_on.sum()),
                         io_total, io_ok, zones, heavy, float(sum(p[0] for p in parts)), sum(p[1] for p in parts))


def components_after(base: PlacementBase, pod: Pod, node: int, gpus: tuple[int, ...],
                     outcomes: Outcomes) -> dict[str, float]:
    """``reward_components(bind(base.state, pod, node, gpus), outcomes)``, computed from ``base``: the
    arrays of one node change, the loops over bound pods are not run again (equal up to float rounding)."""
    state, i = base.state, int(node)
    cpu, mem = state.cpu_used.astype(np.float64), state.mem_used.astype(np.float64)
    cpu[i] += pod.cpu_milli
    mem[i] += pod.memory_mib
    gpu = state.gpu_used.sum(axis=1).astype(np.float64)
    gpu[i] += (pod.gpu_milli if pod.is_gpu_share else GPU_MILLI) * len(gpus)
    # LS pods on hot nodes: only node i's pressure moves
    used_i = float(cpu[i]) if state.cpu_load is None else max(float(cpu[i]), float(state.cpu_load[i]))
    cap_i = float(state.cpu_cap[i])
    hot_i = (used_i / cap_i if cap_i > 0 else 0.0) > HOT_NODE_THRESHOLD
    ls = int(pod.qos == LS_QOS)
    bad = base.ls_bad - (int(base.ls_on[i]) if base.hot[i] else 0) + ((int(base.ls_on[i]) + ls) if hot_i else 0)
    total = base.ls_total + ls
    ls_ok = 1.0 - bad / total if total else 1.0
    # locality: the pod's own service is the only one whose shares move
    io_heavy = pod.labels.get(IO_HEAVY_LABEL) == "true"
    io_total = base.io_total + io_heavy
    io_ok = base.io_ok + (io_heavy and state.nodes[i].labels.get(LOCAL_SSD_LABEL) == "true")
    net_sum, net_count = base.net_sum, base.net_count
    if pod.service:
        key, zone = (pod.namespace, pod.service), state.nodes[i].zone
        zones, heavy = dict(base.zones.get(key, {})), dict(base.heavy.get(key, {}))
        old = _net_part(zones, heavy) if heavy else (0.0, 0)
        zones[zone] = zones.get(zone, 0) + 1
        if pod.labels.get(NETWORK_HEAVY_LABEL) == "true":
            heavy[zone] = heavy.get(zone, 0) + 1
        new = _net_part(zones, heavy) if heavy else (0.0, 0)
        net_sum, net_count = net_sum - old[0] + new[0], net_count - old[1] + new[1]
    business = {"io_locality": io_ok / io_total if io_total else 1.0,
                "net_locality": net_sum / net_count if net_count else 1.0}
    return _components(_load(state, _utilisation(state, cpu, mem, gpu)), _balance_std(state, cpu, mem), ls_ok,
                       business, int(state.pods_used.sum()) + 1, outcomes)


def total_reward(components: Mapping[str, float], weights: RewardWeights = RewardWeights()) -> float:
    """Weighted mean of the components (a missing component counts 0), in [0, 1]."""
    w = weights.as_dict()
    norm = sum(w.values())
    return float(sum(v * components.get(k, 0.0) for k, v in w.items()) / norm) if norm > 0 else 0.0


# ---------------------------------------------------------------------------------------------
# Weighting schemes


@dataclass(frozen=True)
class RewardScheme:
    """How components become one number; ``name`` is one of ``SCHEMES``.

    - fixed: ``total_reward(components, weights)``;
    - load_conditional: ``low_load_weights`` (balance up) when load < ``load_threshold``, else
      ``high_load_weights`` (utilisation up);
    - lexicographic: tiers scored with ``weights`` inside each tier, then combined with base
      ``base``: every tier but the last is quantised to ``base`` levels, so one level of a higher
      tier outweighs everything below it. Stressed (load >= ``stress_load`` or sla <
      ``stress_sla``): constraints > sla > rest; otherwise constraints > (sla and rest).
    """

    name: str = "fixed"
    weights: RewardWeights = RewardWeights()
    low_load_weights: RewardWeights = RewardWeights(utilisation=0.10, balance=0.35)
    high_load_weights: RewardWeights = RewardWeights(utilisation=0.35, balance=0.10)
    load_threshold: float = 0.6
    stress_load: float = 0.75
    stress_sla: float = 0.9
    base: int = 100
    tiers_stressed: tuple[tuple[str, ...], ...] = field(default=(
        ("constraints",), ("sla",), ("utilisation", "balance", "business")))
    tiers_calm: tuple[tuple[str, ...], ...] = field(default=(
        ("constraints",), ("sla", "utilisation", "balance", "business")))

    def __post_init__(self) -> None:
        if self.name not in SCHEMES:
            raise ValueError(f"unknown reward scheme {self.name!r}; known: {', '.join(SCHEMES)}")
        if self.base < 2:
            raise ValueError("base must be >= 2")


def scheme_weights(scheme: RewardScheme, load: float) -> RewardWeights:
    """The weights a weighted scheme uses at cluster load ``load``."""
    if scheme.name == "load_conditional":
        return scheme.low_load_weights if load < scheme.load_threshold else scheme.high_load_weights
    return scheme.weights


def is_stressed(scheme: RewardScheme, components: Mapping[str, float], load: float) -> bool:
    return load >= scheme.stress_load or components.get("sla", 1.0) < scheme.stress_sla


def tier_score(components: Mapping[str, float], names: tuple[str, ...], weights: RewardWeights) -> float:
    """Weighted mean of ``names`` inside one tier (equal weights when all are 0)."""
    w = weights.as_dict()
    ws = [w.get(n, 0.0) for n in names]
    if sum(ws) <= 0:
        ws = [1.0] * len(names)
    return float(sum(wi * components.get(n, 0.0) for wi, n in zip(ws, names)) / sum(ws))


def lexicographic_total(tier_scores: list[float], base: int = 100) -> float:
    """Ordered tier scores in [0, 1] -> [0, 1]; higher tiers dominate (quantised to ``base`` levels)."""
    k = len(tier_scores)
    if k == 0:
        return 0.0
    total = 0.0
    for i, s in enumerate(tier_scores):
        s = min(max(float(s), 0.0), 1.0)
        digit = s * (base - 1) if i == k - 1 else float(np.floor(s * (base - 1) + 1e-9))
        total += digit * float(base) ** (k - 1 - i)
    return total / (float(base) ** k - 1.0)


def scheme_total(components: Mapping[str, float], scheme: RewardScheme, load: float) -> float:
    """The total reward of ``components`` under ``scheme`` at cluster load ``load``."""
    if scheme.name == "lexicographic":
        tiers = scheme.tiers_stressed if is_stressed(scheme, components, load) else scheme.tiers_calm
        return lexicographic_total([tier_score(components, t, scheme.weights) for t in tiers], scheme.base)
    return total_reward(components, scheme_weights(scheme, load))


def scheme_reward(state: ClusterState, outcomes: Outcomes, scheme: RewardScheme) -> tuple[dict[str, float], float]:
    """(components, total) of a state and window outcomes under ``scheme``."""
    components = reward_components(state, outcomes)
    return components, scheme_total(components, scheme, cluster_load(state))


def outcomes_from_stats(before: Mapping[str, float], after: Mapping[str, float],
                        pending_time_s: float = 0.0) -> Outcomes:
    """Window outcomes from two cumulative counter snapshots (simulator ``snapshot_stats`` names), the one
    definition (the reward-calculator, the trainer and the simulator's ``window_outcomes``): ``failed`` counts
    the pods that failed (an evicted pod that is not restarted: ``failed``), timed out pending
    (``unschedulable``) or were refused at bind (``bind_rejected``). An evicted pod that is queued again
    (``restarted``) is not failed: it is pending again, then bound, or failed if it times out, and counted
    then; counting the eviction too would count it twice in ``pending + scheduled + failed``. A refused bind is
    different on purpose: it is a *decision* that failed (made on a stale view, so the policy's doing), counted
    although its pod is pending again and may be bound, and counted as scheduled, later; the simulator's windows
    have none (it binds what it decides)."""
    def delta(key: str) -> int:
        return max(0, int(after.get(key, 0)) - int(before.get(key, 0)))

    return Outcomes(pending=int(after.get("pending", 0)), scheduled=delta("bound"),
                    failed=delta("failed") + delta("unschedulable") + delta("bind_rejected"),
                    violations=int(after.get("violations", 0)), pending_time_s=pending_time_s)
