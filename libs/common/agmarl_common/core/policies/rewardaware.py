"""Reward-aware expert: rank candidate nodes by what placing the pod there does to the reward.

The score is ``scoring.rewardaware.score_reward_aware`` (the one-step change of the composite reward's
components, weighted by the reward scheme, plus kube-default's preference plugins as tie-breakers; the
terms and their weights are described there). It depends only on the pod and the cluster state: no
history, no randomness, so a learned expert can imitate it from pod and node features (the learned
policy's ``reward_gain`` input is the same score, ``features.pairs.objective_gains``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.policies.base import PolicyBase
from agmarl_common.core.scoring.rewardaware import RewardAwareConfig, score_reward_aware, score_reward_aware_batch


class RewardAwarePolicy(PolicyBase):
    """Sum over ``scoring.rewardaware.GAINS`` of weight * gain * schedulable nodes, plus the preference plugins."""

    name = "reward-aware"

    def __init__(self, config: RewardAwareConfig = RewardAwareConfig()):
        self.config = config
        if config.scheme != "fixed":
            self.name = f"reward-aware-{config.scheme.replace('_', '-')}"

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        return score_reward_aware(pod, state, candidates, self.config)

    def score_batch(self, pods: Sequence[Pod], state: ClusterState, candidates: Sequence[np.ndarray]
                    ) -> list[np.ndarray]:
        """``score`` of every pod against the same ``state`` (one array per pod), the gains computed for
        all pairs at once (``score_reward_aware_batch``); a subclass that adds to ``score`` is scored pod by pod."""
        if type(self).score is not RewardAwarePolicy.score:
            return [self.score(p, state, c) for p, c in zip(pods, candidates)]
        return score_reward_aware_batch(pods, state, candidates, self.config)
