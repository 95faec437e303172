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
components it changed. Totals use ``weights`` (the fixed scheme), or a ``RewardScheme`` when one is
given (its weights for the cluster's load, as the reward-calculator's window reward).

``reference_credit`` picks the reference placement itself (a policy's best admitted feasible node and
its devices): the one definition the trainer's rollouts and the reward-calculator's live experience
both use. Pure functions over plain data: no simulator, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, Pod, bind
from agmarl_common.core.policies.base import Policy, select_node
from agmarl_common.core.reward import Outcomes, PlacementBase, RewardScheme, RewardWeights, cluster_load, \
    components_after, placement_base, reward_components, scheme_total, total_reward

PLACED = Outcomes(scheduled=1)
WAITING = Outcomes(pending=1)


@dataclass(frozen=True)
class DecisionCredit:
    """A difference reward (``total``) and the component changes behind it (only those that moved)."""

    total: float
    components: Mapping[str, float] = field(default_factory=dict)


def placement_components(state: ClusterState, pod: Pod, node: int | None, gpus: tuple[int, ...] = (),
                         base: PlacementBase | None = None) -> dict[str, float]:
    """Reward components of ``state`` with ``pod`` bound to ``node`` (scheduled), or left waiting (None).
    With ``base`` (``reward.placement_base(state)``, shared by every placement on ``state``) the loops over
    the bound pods are not run again: what a decision's credit costs on a large cluster."""
    if node is None:
        return reward_components(state, WAITING)
    if base is not None:
        return components_after(base, pod, int(node), tuple(gpus), PLACED)
    return reward_components(bind(state, pod, int(node), tuple(gpus)), PLACED)


def difference_reward(state: ClusterState, pod: Pod, node: int | None, gpus: tuple[int, ...] = (),
                      reference: int | None = None, reference_gpus: tuple[int, ...] = (),
                      weights: RewardWeights = RewardWeights(), tol: float = 1e-12,
                      scheme: RewardScheme | None = None, base: PlacementBase | None = None) -> DecisionCredit:
    """The credit of placing ``pod`` on ``node`` (devices ``gpus``) rather than on ``reference``
    (``reference_gpus``), both on ``state`` (the cluster at decision time, the pod not bound yet). ``base``:
    ``placement_base(state)`` when the caller has it (computed here otherwise)."""
    if node == reference and tuple(gpus) == tuple(reference_gpus):
        return DecisionCredit(0.0)
    base = base if base is not None else placement_base(state)
    mine = placement_components(state, pod, node, gpus, base)
    ref = placement_components(state, pod, reference, reference_gpus, base)
    moved = {k: mine[k] - ref[k] for k in mine if abs(mine[k] - ref.get(k, 0.0)) > tol}
    if scheme is None:
        return DecisionCredit(total_reward(mine, weights) - total_reward(ref, weights), moved)
    load = cluster_load(state)
    return DecisionCredit(scheme_total(mine, scheme, load) - scheme_total(ref, scheme, load), moved)


GpuChooser = Callable[[Pod, ClusterState, int], "tuple[int, ...] | None"]


def reference_placement(state: ClusterState, pod: Pod, reference: Policy, candidates: np.ndarray | None = None,
                        gpus_for: GpuChooser | None = None) -> tuple[int | None, tuple[int, ...]]:
    """(node, devices) ``reference`` would place ``pod`` on in ``state`` (its best admitted feasible node;
    devices from ``gpus_for``, by default the policy's own ``choose_gpus``), or (None, ()) when it would leave
    the pod waiting."""
    cands = feasible_nodes(pod, state) if candidates is None else candidates
    node = select_node(reference, pod, state, cands)
    if node is None:
        return None, ()
    if not pod.num_gpu:
        return node, ()
    devices = (gpus_for or reference.choose_gpus)(pod, state, node)
    return (None, ()) if devices is None else (node, tuple(devices))


def reference_credit(state: ClusterState, pod: Pod, node: int | None, gpus: tuple[int, ...], reference: Policy,
                     candidates: np.ndarray | None = None, gpus_for: GpuChooser | None = None,
                     scheme: RewardScheme | None = None, base: PlacementBase | None = None
                     ) -> tuple[DecisionCredit, int | None]:
    """(the credit of placing ``pod`` on ``node`` rather than where ``reference`` would, that node)."""
    ref, ref_gpus = reference_placement(state, pod, reference, candidates, gpus_for)
    return difference_reward(state, pod, node, gpus, ref, ref_gpus, scheme=scheme, base=base), ref
