"""The reward-aware score of a candidate node: what placing the pod there does to the reward.

Each ``score_*_gain`` is a pure function ``(pod, state, candidates) -> (len(candidates),) float``:
the change of one component of ``agmarl_common.core.reward`` (in that component's own [0, 1] units)
if ``pod`` were bound to the candidate, all else equal. Terms that move the same way wherever the
pod goes (the cluster-wide utilisation below the knee, pending counts) are left out: they cannot
change the choice. The terms:

- ``balance``: 1 - 2 * std of per-node mean(cpu, memory) utilisation, recomputed exactly with the
  pod's request added to the candidate (schedulable nodes only, as the reward does);
- ``utilisation`` (knee): the reward scores utilisation linearly up to 80 % and penalises above it;
  only the penalty depends on where the pod goes, so the term is the change of the mean per-node
  overload loss ``u / 0.8 - score_utilisation(u)``, negated;
- ``ls_ok``: the change of the share of LS pods not on a node whose cpu pressure exceeds 80 %:
  a candidate the pod would push over the threshold turns its LS pods bad, an LS pod on a node
  that is (or becomes) hot is bad itself;
- ``io_locality``: an IO-heavy pod gains on a local-SSD node;
- ``net_locality``: a network-heavy pod gains in the zone holding most of its service peers (and
  its network-heavy peers gain from it), up to a candidate-independent shift.

``score_reward_aware`` adds the gains with the reward scheme's weights (``sla`` split over its four
sub-terms, ``business`` over its two), scaled by the number of schedulable nodes so that one node's worth
of change is O(1), then kube-default's preference plugins (preferred node affinity, inter-pod
(anti-)affinity, topology spread, taint toleration: ``scoring.kube_profile.score_preferences``) with
their default weights, scaled to ``preference_weight`` (0.1, tuned on held-out seeds: it keeps
kube-default's preferences as tie-breakers without outweighing a real balance gain). ``factors``
can re-weight single gains (1 each by default: the reward's own weights tuned best). The score
depends only on the pod and the cluster state: no history, no randomness, so a learned expert can
imitate it from pod and node features. ``policies.rewardaware`` ranks nodes with it; the learned
policy's ``reward_gain`` input (``features.pairs.objective_gains``) is it for a whole batch of pending
pods (``score_reward_aware_batch``), rescaled within each pod.

One implementation computes the balance, utilisation, ls_ok and io_locality gains: ``reward_gains_batch``,
for many pods against one state at once (``score_*_gain`` and ``reward_gains`` are it for a batch of one).
The per-state terms (per-node utilisation, the balance sums, cpu pressure, LS pods per node, IO-heavy count,
local-SSD nodes) are computed once per batch and the gains vectorised over every (pod, candidate) pair,
pod-major; the first four once per state object (``state_terms``, a memo of the last state: the live loop
computes them between pods, so that a decision only reads them). ``net_locality`` walks the bound pods of the pod's service, so it stays per pod
(``score_net_gain``), for pods with a service only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from agmarl_common.core.cluster.metrics import node_cpu_pressure
from agmarl_common.core.cluster.model import ClusterState, Pod, pod_index
from agmarl_common.core.cluster.specs import LS_QOS
from agmarl_common.core.reward import (
    HOT_NODE_THRESHOLD,
    IO_HEAVY_LABEL,
    LOCAL_SSD_LABEL,
    NETWORK_HEAVY_LABEL,
    SCHEMES,
    UTILISATION_KNEE,
    RewardScheme,
    RewardWeights,
    cluster_load,
    scheme_weights,
)
from agmarl_common.core.scoring.kube_profile import score_preferences
from agmarl_common.core.scoring.kube_resources import MAX_NODE_SCORE

GAINS = ("balance", "utilisation", "ls_ok", "io_locality", "net_locality")


# ---------------------------------------------------------------------------------------------
# Per-node quantities


def node_mean_utilisation(state: ClusterState) -> np.ndarray:
    """(n,) mean of cpu and memory requested / capacity per node (the reward's balance input)."""
    cpu = state.cpu_used / np.maximum(state.cpu_cap, 1)
    mem = state.mem_used / np.maximum(state.mem_cap, 1)
    return (cpu + mem) / 2.0


def pod_utilisation_delta(pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """(k,) how much the pod raises each candidate's mean(cpu, memory) utilisation."""
    c = np.asarray(candidates, dtype=np.int64)
    return (pod.cpu_milli / np.maximum(state.cpu_cap[c], 1) + pod.memory_mib / np.maximum(state.mem_cap[c], 1)) / 2.0


def overload_loss(u: np.ndarray) -> np.ndarray:
    """What the utilisation score loses to the knee at utilisation ``u``: u / 0.8 - score(u) (0 below it)."""
    u = np.clip(u, 0.0, 1.0)
    over = np.maximum(u - UTILISATION_KNEE, 0.0)
    return over / UTILISATION_KNEE + 0.5 * over / (1.0 - UTILISATION_KNEE)


# ---------------------------------------------------------------------------------------------
# Gains, each in its reward component's units


def _one(pod: Pod, state: ClusterState, candidates: np.ndarray, threshold: float = HOT_NODE_THRESHOLD
         ) -> dict[str, np.ndarray]:
    """Every gain of one pod: the batch computation (``reward_gains_batch``) for a batch of one."""
    return reward_gains_batch([pod], state, [np.asarray(candidates, dtype=np.int64)], threshold)


def score_balance_gain(pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """Change of 1 - 2 * std(per-node utilisation) over schedulable nodes with the pod on each candidate."""
    return _one(pod, state, candidates)["balance"]


def score_utilisation_gain(pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """Minus the change of the mean per-node overload loss (the knee part of the utilisation score)."""
    return _one(pod, state, candidates)["utilisation"]


def score_ls_gain(pod: Pod, state: ClusterState, candidates: np.ndarray,
                  threshold: float = HOT_NODE_THRESHOLD) -> np.ndarray:
    """Change of the share of LS pods not on a hot node (cpu pressure > ``threshold``): the LS pods
    of a candidate the pod pushes over the threshold turn bad, and so does an LS pod put on a node
    that is hot after placement."""
    return _one(pod, state, candidates, threshold)["ls_ok"]


def _label_count(state: ClusterState, label: str) -> int:
    """Bound pods carrying ``label=true`` (from the pod index, no scan)."""
    idx = pod_index(state)
    return int(sum(idx.groups[g][1].sum() for g in idx.group_pairs.get((label, "true"), ())))


def score_io_gain(pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """Change of the share of IO-heavy pods on local-SSD nodes (0 for a pod that is not IO-heavy), up to
    a candidate-independent shift."""
    return _one(pod, state, candidates)["io_locality"]


def score_net_gain(pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """Change (up to a candidate-independent shift) of the mean share of a network-heavy pod's
    service peers in its zone, over network-heavy pods, with the pod in each candidate's zone."""
    c = np.asarray(candidates, dtype=np.int64)
    if not pod.service:
        return np.zeros(len(c))
    me_net = pod.labels.get(NETWORK_HEAVY_LABEL) == "true"
    heavy_groups = pod_index(state).group_pairs.get((NETWORK_HEAVY_LABEL, "true"), frozenset())
    if not me_net and not any(ns == pod.namespace for ns, _ in heavy_groups):
        return np.zeros(len(c))  # no network-heavy peer can gain from it
    peers: dict[str, int] = {}  # zone -> pods of the service
    heavy: dict[str, int] = {}  # zone -> network-heavy pods of the service
    for node, pods in zip(state.nodes, state.bound):
        for q in pods:
            if q.service == pod.service and q.namespace == pod.namespace:
                peers[node.zone] = peers.get(node.zone, 0) + 1
                if q.labels.get(NETWORK_HEAVY_LABEL) == "true":
                    heavy[node.zone] = heavy.get(node.zone, 0) + 1
    total = sum(peers.values())  # the pod's peers; each heavy pod's peer count becomes ``total`` too
    if total == 0 or not (me_net or heavy):
        return np.zeros(len(c))
    n_heavy = _label_count(state, NETWORK_HEAVY_LABEL) + me_net
    zones = [state.nodes[i].zone for i in c]
    gain = {}
    for z in set(zones):
        own = me_net * peers.get(z, 0) / total  # the pod's share of peers in its zone
        others = heavy.get(z, 0) / total  # each heavy peer in z gains one peer in zone
        gain[z] = (own + others) / max(n_heavy, 1)
    return np.array([gain[z] for z in zones], dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The gains of many pods against one state at once


@dataclass(frozen=True)
class StateTerms:
    """What the gains read of the state alone, whatever the pod: the per-node utilisation and the balance sums
    over schedulable nodes, the cpu pressure, and the LS pods per node (``state_terms``)."""

    util: np.ndarray  # (n,) node_mean_utilisation
    n_up: int  # schedulable nodes
    util_sum: float  # sum of util over schedulable nodes
    util_sq: float  # sum of util ** 2 over them
    pressure: np.ndarray  # (n,) node_cpu_pressure
    ls_nodes: np.ndarray  # (n,) float LS pods per node
    ls_total: float
    ls_hot: float  # LS pods on nodes hotter than HOT_NODE_THRESHOLD


_TERMS: tuple[ClusterState, StateTerms] | None = None  # the last state's terms (states are immutable)


def state_terms(state: ClusterState) -> StateTerms:
    """The ``StateTerms`` of ``state``, computed once per state object: the live loop computes them between
    pods (the learned policy's ``prepare``), so that a decision on that state only reads them. Memo of derived
    data, like ``pod_index``: the same values as computing them again."""
    global _TERMS
    memo = _TERMS
    if memo is not None and memo[0] is state:
        return memo[1]
    u_all = node_mean_utilisation(state)
    up = state.schedulable
    n_up = int(up.sum())
    s, q = (float(u_all[up].sum()), float((u_all[up] ** 2).sum())) if n_up else (0.0, 0.0)
    pressure = node_cpu_pressure(state)
    ls_nodes = pod_index(state).ls.astype(np.float64)
    terms = StateTerms(util=u_all, n_up=n_up, util_sum=s, util_sq=q, pressure=pressure, ls_nodes=ls_nodes,
                       ls_total=float(ls_nodes.sum()), ls_hot=float(ls_nodes[pressure > HOT_NODE_THRESHOLD].sum()))
    _TERMS = (state, terms)
    return terms


def pairs(candidates: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sizes (P,), node index per pair (E,), pod position per pair (E,)), pod-major."""
    cands = [np.asarray(c, dtype=np.int64) for c in candidates]
    sizes = np.array([c.size for c in cands], dtype=np.int64)
    if len(cands) == 1:  # one pod (the live loop): the same arrays without a concatenation and a repeat
        return sizes, cands[0], np.zeros(cands[0].size, dtype=np.int64)
    idx = np.concatenate(cands) if cands else np.zeros(0, np.int64)
    return sizes, idx, np.repeat(np.arange(len(cands)), sizes)


def reward_gains_batch(pods: Sequence[Pod], state: ClusterState, candidates: Sequence[np.ndarray],
                       threshold: float = HOT_NODE_THRESHOLD) -> dict[str, np.ndarray]:
    """Every gain of ``rewardaware.GAINS`` per (pod, candidate) pair, concatenated pod-major."""
    return _gains_of_pairs(pods, state, *pairs(candidates), threshold)


def _gains_of_pairs(pods: Sequence[Pod], state: ClusterState, sizes: np.ndarray, idx: np.ndarray,
                    pod_of: np.ndarray, threshold: float) -> dict[str, np.ndarray]:
    """``reward_gains_batch`` of the pairs ``pairs(candidates)`` gave. A per-pod value enters the pair
    arithmetic as a per-pair array, or as a numpy scalar when there is one pod (the same values, one
    gather less each); a term that is zero for every pair is not computed (the live path: one pod at a
    time, mostly below the knee and not LS)."""
    e = idx.size
    zeros = np.zeros(e)
    if e == 0:
        return {"balance": zeros, "utilisation": zeros, "ls_ok": zeros, "io_locality": zeros,
                "net_locality": zeros}

    def per_pair(values: list, dtype) -> np.ndarray:
        a = np.array(values, dtype=dtype)
        return a[0] if len(values) == 1 else a[pod_of]

    cpu = per_pair([p.cpu_milli for p in pods], np.float64)
    mem = per_pair([p.memory_mib for p in pods], np.float64)
    cpu_cap = np.maximum(state.cpu_cap[idx], 1)
    d = (cpu / cpu_cap + mem / np.maximum(state.mem_cap[idx], 1)) / 2.0  # pod_utilisation_delta
    terms = state_terms(state)
    u = terms.util[idx]
    # balance (score_balance_gain)
    up = state.schedulable
    n_up = terms.n_up
    if n_up:
        s, q = terms.util_sum, terms.util_sq
        std0 = np.sqrt(max(q / n_up - (s / n_up) ** 2, 0.0))
        du = np.where(up[idx], d, 0.0)
        q1 = q + 2.0 * u * du + du ** 2
        balance = -2.0 * (np.sqrt(np.maximum(q1 / n_up - ((s + du) / n_up) ** 2, 0.0)) - std0)
    else:
        balance = zeros
    # utilisation knee (score_utilisation_gain): overload_loss is exactly 0 at or below the knee, so with
    # every u and u + d there the gain is -(0.0 - 0.0) / n = -0.0 everywhere
    ud = u + d
    if max(float(ud.max()), float(u.max())) <= UTILISATION_KNEE:
        utilisation = np.full(e, -0.0)
    else:
        utilisation = -(overload_loss(ud) - overload_loss(u)) / max(n_up, 1)
    # ls_ok (score_ls_gain): zero for a pod with no crossing candidate and no own hot placement
    ls_flags = [p.qos == LS_QOS for p in pods]
    is_ls = per_pair(ls_flags, bool)
    pressure = terms.pressure
    pressure_c = pressure[idx]
    after = pressure_c + cpu / cpu_cap
    crossing = (pressure_c <= threshold) & (after > threshold)
    own = ((after > threshold) & is_ls).astype(np.float64) if any(ls_flags) else zeros
    ls_ok = zeros
    if crossing.any() or own.any():
        moved = np.bincount(pod_of, weights=(crossing | (own > 0)).astype(np.float64), minlength=len(pods)) > 0
        ls_nodes = terms.ls_nodes
        total0 = terms.ls_total
        total1 = total0 + is_ls
        bad0 = terms.ls_hot if threshold == HOT_NODE_THRESHOLD else float(ls_nodes[pressure > threshold].sum())
        before = 1.0 - bad0 / total0 if total0 else 1.0
        safe = np.where(total1 > 0, total1, 1.0)
        gain = 1.0 - (bad0 + np.where(crossing, ls_nodes[idx], 0.0) + own) / safe - before
        ls_ok = np.where(moved[pod_of] & (total1 > 0), gain, 0.0)
    # io_locality (score_io_gain)
    io_flags = [p.labels.get(IO_HEAVY_LABEL) == "true" for p in pods]
    io_locality = zeros
    if any(io_flags):
        io = per_pair(io_flags, bool)
        ssd = np.array([n.labels.get(LOCAL_SSD_LABEL) == "true" for n in state.nodes], dtype=np.float64)
        io_locality = np.where(io, ssd[idx], 0.0) / (_label_count(state, IO_HEAVY_LABEL) + 1)
    # net_locality (score_net_gain), per pod with a service
    net = np.zeros(e)
    starts = None
    for k, pod in enumerate(pods):
        if pod.service and sizes[k]:
            starts = np.concatenate([[0], np.cumsum(sizes)]) if starts is None else starts
            net[starts[k]:starts[k + 1]] = score_net_gain(pod, state, idx[starts[k]:starts[k + 1]])
    return {"balance": balance, "utilisation": utilisation, "ls_ok": ls_ok, "io_locality": io_locality,
            "net_locality": net}


def reward_gains(pod: Pod, state: ClusterState, candidates: np.ndarray,
                 threshold: float = HOT_NODE_THRESHOLD) -> dict[str, np.ndarray]:
    """Every gain of ``GAINS`` per candidate (for the score and for explanations)."""
    return _one(pod, state, candidates, threshold)


# ---------------------------------------------------------------------------------------------
# The score


def gain_weights(weights: RewardWeights) -> dict[str, float]:
    """Reward weights -> weight of each gain (sla over its 4 sub-terms, business over its 2), sum-normalised."""
    norm = sum(weights.as_dict().values()) or 1.0
    return {"balance": weights.balance / norm, "utilisation": weights.utilisation / norm,
            "ls_ok": weights.sla / 4.0 / norm, "io_locality": weights.business / 2.0 / norm,
            "net_locality": weights.business / 2.0 / norm}


@dataclass(frozen=True)
class RewardAwareConfig:
    scheme: str = "fixed"  # one of reward.SCHEMES: where the gain weights come from
    preference_weight: float = 0.1  # score points of a candidate with every preference plugin at 100
    threshold: float = HOT_NODE_THRESHOLD  # cpu pressure above which a node is hot for LS pods
    factors: Mapping[str, float] = field(default_factory=dict)  # gain name -> multiplier of its weight (1)

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown reward scheme {self.scheme!r}; known: {', '.join(SCHEMES)}")
        if self.preference_weight < 0:
            raise ValueError("preference_weight must be >= 0")
        unknown = set(self.factors) - set(GAINS)
        if unknown or any(f < 0 for f in self.factors.values()):
            raise ValueError(f"factors must be >= 0 and name gains of {GAINS}, got {dict(self.factors)}")


def scheme_gain_weights(scheme: RewardScheme, load: float) -> dict[str, float]:
    """Gain weights of ``scheme`` at cluster load ``load``. Lexicographic: its tiers become weights,
    constraints (never at stake: candidates are feasible) aside, sla first when the load is stressful."""
    w = gain_weights(scheme_weights(scheme, load))
    if scheme.name == "lexicographic" and load >= scheme.stress_load:
        w["ls_ok"] *= scheme.base
    return w


@lru_cache(maxsize=None)
def _scheme(name: str) -> RewardScheme:
    """The default ``RewardScheme`` of each name, built once (frozen)."""
    return RewardScheme(name)


_FIXED_WEIGHTS = MappingProxyType(scheme_gain_weights(RewardScheme("fixed"), 0.0))  # the fixed scheme's, load-free


def combine_gains(gains: Mapping[str, np.ndarray], state: ClusterState, config: RewardAwareConfig) -> np.ndarray:
    """The scheme-weighted sum of the gains (each times its ``config.factors`` entry), times the
    schedulable nodes."""
    scheme = _scheme(config.scheme)
    weights = _FIXED_WEIGHTS if scheme.name == "fixed" else scheme_gain_weights(scheme, cluster_load(state))
    n = max(state_terms(state).n_up, 1)
    return sum(weights[k] * config.factors.get(k, 1.0) * g for k, g in gains.items()) * n


def score_reward_aware(pod: Pod, state: ClusterState, candidates: np.ndarray,
                       config: RewardAwareConfig = RewardAwareConfig()) -> np.ndarray:
    """Sum over ``GAINS`` of weight * gain * schedulable nodes, plus ``preference_weight`` x the preference
    plugins (0..1) per candidate."""
    c = np.asarray(candidates, dtype=np.int64)
    if len(c) == 0:
        return np.zeros(0)
    total = combine_gains(reward_gains(pod, state, c, config.threshold), state, config)
    if config.preference_weight > 0:
        total = total + config.preference_weight * score_preferences(pod, state, c) / MAX_NODE_SCORE
    return np.asarray(total, dtype=np.float64)


def score_reward_aware_batch(pods: Sequence[Pod], state: ClusterState, candidates: Sequence[np.ndarray],
                             config: RewardAwareConfig = RewardAwareConfig()) -> list[np.ndarray]:
    """``score_reward_aware`` of every pod against the same ``state`` (one array per pod), the gains
    computed for all pairs at once (``reward_gains_batch``)."""
    sizes, idx, pod_of = pairs(candidates)
    if idx.size == 0:
        return [np.zeros(int(k)) for k in sizes]
    gains = _gains_of_pairs(pods, state, sizes, idx, pod_of, config.threshold)
    total = np.asarray(combine_gains(gains, state, config), dtype=np.float64)
    out = [total] if len(sizes) == 1 else np.split(total, np.cumsum(sizes)[:-1])
    if config.preference_weight > 0:
        out = [t + config.preference_weight * score_preferences(p, state, c) / MAX_NODE_SCORE if len(c) else t
               for p, c, t in zip(pods, candidates, out)]
    return out
