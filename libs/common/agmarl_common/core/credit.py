"""Credit per agent: each placement's own reward signal, computed on the cluster at decision time.

A window's composite reward (``core.reward``) is one number for every decision in the window, so no
agent learns what its own choice did. The difference reward here isolates one decision:

    credit = R(state + pod on the chosen node) - R(state + pod on the reference node)

``R`` is ``reward.total_reward`` of ``reward.reward_components`` of the cluster after the placement,
with the window's outcomes of this one pod (``Outcomes(scheduled=1)``; a pod left waiting counts
``Outcomes(pending=1)`` on the state without it). The reference is the placement a default or teacher
policy would have made of the same pod on the same state; ``None`` on either side means "left
pending" (no candidate, or a pick the arbiter refused). Everything else is held equal, so the credit
is 0 when the agent does what the reference does, and its sign says whether this decision, alone,
did better or worse than the reference. ``components`` holds the change of every reward component
(and sub-term) the decision moved, in that component's own units: the per-decision term of the
components it changed.

Pure functions over plain data: no simulator, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from agmarl_common.core.cluster.model import ClusterState, Pod, bind
from agmarl_common.core.reward import Outcomes, RewardWeights, reward_components, total_reward

PLACED = Outcomes(scheduled=1)
WAITING = Outcomes(pending=1)


@dataclass(frozen=True)
class DecisionCredit:
    """A difference reward (``total``) and the component changes behind it (only those that moved)."""

    total: float
    components: Mapping[str, float] = field(default_factory=dict)


def placement_components(state: ClusterState, pod: Pod, node: int | None, gpus: tuple[int, ...] = ()
                         ) -> dict[str, float]:
    """Reward components of ``state`` with ``pod`` bound to ``node`` (scheduled), or left waiting (None)."""
    if node is None:
        return reward_components(state, WAITING)
    return reward_components(bind(state, pod, int(node), tuple(gpus)), PLACED)


def difference_reward(state: ClusterState, pod: Pod, node: int | None, gpus: tuple[int, ...] = (),
                      reference: int | None = None, reference_gpus: tuple[int, ...] = (),
                      weights: RewardWeights = RewardWeights(), tol: float = 1e-12) -> DecisionCredit:
    """The credit of placing ``pod`` on ``node`` (devices ``gpus``) rather than on ``reference``
    (``reference_gpus``), both on ``state`` (the cluster at decision time, the pod not bound yet)."""
    if node == reference and tuple(gpus) == tuple(reference_gpus):
        return DecisionCredit(0.0)
    mine = placement_components(state, pod, node, gpus)
    ref = placement_components(state, pod, reference, reference_gpus)
    moved = {k: mine[k] - ref[k] for k in mine if abs(mine[k] - ref.get(k, 0.0)) > tol}
    return DecisionCredit(total_reward(mine, weights) - total_reward(ref, weights), moved)
