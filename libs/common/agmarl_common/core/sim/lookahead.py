"""The lookahead reference: each decision tried with short simulator rollouts, the best by composite reward.

An upper reference for the dynamic protocol, not a scheduler to serve: for a pending pod, the ``top_k``
candidates of a base policy (reward-aware) are each tried on a copy of the simulator state: the pod is
bound there, the next ``queue_agents`` pods of the queue are placed by the base policy at the same time,
then the copy is advanced ``horizon_ticks`` ticks, the base policy placing up to ``queue_agents`` pending
pods each tick. Each rollout is scored by the composite reward (``core.reward``) of the window from the
decision to its end: the cluster at the end, pods bound, still pending, timed out, evicted or refused
in the window. The candidate with the best rollout wins (ties -> the base policy's order).

The rollouts see what the simulator will do next: arrivals, durations, node failures of the next few
ticks (the same seeded draws for every candidate, so the comparison is paired). That is what makes it a
reference and not a policy a live cluster could run. It needs the simulator state: ``dynamic.schedule_pending``
shows it through ``observe_sim(state, config)`` before each decision; anywhere else (no state, or a cluster
that is not the observed state's) it scores as its base policy. Cost: about ``top_k * horizon_ticks``
simulator ticks per decision. ``rollout_bases`` adds rollout policies: a candidate is then worth the best of
its rollouts, one per policy. Registered: ``lookahead`` (3 candidates, 2 ticks) and, stronger and slower,
``lookahead-wide`` (8 candidates, 2 ticks) and ``lookahead-deep`` (3 candidates, 8 ticks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.policies.base import Policy, PolicyBase, select_node
from agmarl_common.core.policies.registry import get_policy, register_policy
from agmarl_common.core.reward import reward_components, total_reward
from agmarl_common.core.sim import dynamic


@dataclass(frozen=True)
class LookaheadConfig:
    top_k: int = 3  # candidates tried, the base policy's best first
    horizon_ticks: int = 2  # simulator ticks each rollout runs after the decision
    queue_agents: int = 4  # pending pods the base policy places per rollout step
    base: str = "reward-aware"  # the policy that ranks candidates and places the others in a rollout
    rollout_bases: tuple[str, ...] = ()  # more rollout policies: a candidate is worth its best rollout

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.horizon_ticks < 0 or self.queue_agents < 0:
            raise ValueError("top_k must be >= 1, horizon_ticks and queue_agents >= 0")


def _candidates(pod: Pod, state: dynamic.SimState) -> np.ndarray:
    c = feasible_nodes(pod, state.cluster)
    if state.down:
        c = np.array([x for x in c.tolist() if x not in state.down], dtype=np.int64)
    return c


def base_pass(policy: Policy, state: dynamic.SimState, limit: int, skip: str = "") -> dynamic.SimState:
    """The base policy places up to ``limit`` pending pods (queue order; ``skip`` left alone) on ``state``."""
    for key in [k for k in state.pending if k != skip][:limit]:
        pod = state.pending[key].pod
        node = select_node(policy, pod, state.cluster, _candidates(pod, state))
        gpus = policy.choose_gpus(pod, state.cluster, node) if node is not None else None
        if gpus is not None:
            state, _ = dynamic.bind(state, key, state.cluster.nodes[node].name, tuple(gpus))
    return state


def window_value(state: dynamic.SimState, before: dynamic.SimCounters) -> float:
    """Composite reward (fixed weights) of the window since the counters ``before``, as ``agmarl eval`` scores one."""
    return total_reward(reward_components(state.cluster, dynamic.window_outcomes(state, before)))


def rollout(state: dynamic.SimState, config: dynamic.SimConfig, pod: Pod, node: int, gpus: tuple[int, ...],
            base: Policy, look: LookaheadConfig) -> float:
    """The composite reward of the window after binding ``pod`` to ``node`` and running the base policy."""
    before = state.counters
    s, outcome = dynamic.bind(state, pod.key, state.cluster.nodes[node].name, gpus)
    if not outcome.ok:
        return -np.inf
    s = base_pass(base, s, look.queue_agents)
    for _ in range(look.horizon_ticks):
        s, _ = dynamic.advance(s, config.tick_s, config)
        s = base_pass(base, s, look.queue_agents)
    return window_value(s, before)


class LookaheadPolicy(PolicyBase):
    """Top-k candidates of the base policy, each judged by a short simulator rollout (module docstring)."""

    name = "lookahead"

    def __init__(self, config: LookaheadConfig = LookaheadConfig(), base: Policy | None = None, name: str = "lookahead"):
        self.config, self.name = config, name
        self.base = base if base is not None else get_policy(config.base)
        self.rollout_policies = (self.base,) + tuple(get_policy(b) for b in config.rollout_bases)
        self._sim: dynamic.SimState | None = None
        self._sim_config = dynamic.SimConfig()

    def observe_sim(self, state: dynamic.SimState, config: dynamic.SimConfig) -> None:
        self._sim, self._sim_config = state, config

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        c = np.asarray(candidates, dtype=np.int64)
        base = np.asarray(self.base.score(pod, state, c), dtype=np.float64)
        sim = self._sim
        if len(c) <= 1 or sim is None or sim.cluster is not state or pod.key not in sim.pending:
            return base
        order = np.argsort(-base, kind="stable")[: self.config.top_k]
        values = np.full(len(c), -np.inf)
        for j in order.tolist():
            gpus = self.choose_gpus(pod, state, int(c[j]))
            if gpus is not None:
                values[j] = max(rollout(sim, self._sim_config, pod, int(c[j]), tuple(gpus), p, self.config)
                                for p in self.rollout_policies)
        if not np.isfinite(values).any():
            return base
        # the best rollout first; among equal rollouts the base policy's order; untried candidates last
        rank = np.zeros(len(c))
        rank[order] = np.arange(len(order), 0, -1) * 1e-9
        return np.where(np.isfinite(values), values + rank, -1e9 + base * 1e-12)

    def choose_gpus(self, pod: Pod, state: ClusterState, node_index: int) -> tuple[int, ...] | None:
        return self.base.choose_gpus(pod, state, node_index)


# stronger (costlier) references of the pressure suite: every candidate (up to 8) tried, or 8-tick rollouts
STRONGER = {"lookahead-wide": LookaheadConfig(top_k=8), "lookahead-deep": LookaheadConfig(horizon_ticks=8)}
register_policy(LookaheadPolicy.name, lambda seed: LookaheadPolicy())
for _name, _config in STRONGER.items():
    register_policy(_name, lambda seed, _c=_config, _n=_name: LookaheadPolicy(_c, name=_n))
