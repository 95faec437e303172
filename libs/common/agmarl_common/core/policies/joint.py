"""Joint placement of a group of pending pods: a small search over placement orders (``JointPlacer``,
work-conserving) and scenario placement (``ScenarioPlacer``, ``place_jointly``: which pods of the group to
place and where, judged on imagined futures; it may leave a pod that fits out).

The batch arbiter of the inference service walks a batch once, largest request first, granting each
pod its best proposal scored against the batch's starting state. ``JointPlacer`` starts there and
searches: it places the whole group with a base policy (FGD by default) once per candidate order,
each pod scored against the state the earlier pods of that order left, and keeps the order whose
result is best for the cluster:

    key(order) = (GPU milli placed,
                  GPU milli an imagined next group would still place on the resulting cluster,
                  -FGD fragmentation amount of the resulting cluster,
                  pods placed)

compared lexicographically. The imagined next group (``lookahead`` pods drawn from the pod list the
placer was briefed with, the same draw for every order of a group: common random numbers) is placed in
its own order by the base policy; it is a one-group rollout, the simulator used as a model of what comes
next, and it is what pays: on the batch-arrival protocol ordering alone, judged by fragmentation, gains
nothing over FGD (docs/evaluation.md). Candidate orders: the arrival order (so a group never places less
GPU milli than the base policy placing it pod by pod), largest GPU request first (first-fit-decreasing:
multi-GPU pods before shares, shares in decreasing milli), largest CPU request first, most constrained
first (fewest feasible nodes now), then random perturbations of the largest-first order (neighbouring
pods swapped). Every pod is still placed through the hard filter by the base policy, so a joint
placement passes the filter by construction (the harness re-checks it). The placer never holds a pod
back to keep room: in the chosen order every pod that fits at its turn is placed.

Cost: ``orders`` x (group + lookahead) pod placements; 8 orders of a 128-pod group with a 64-pod
lookahead on 40 nodes: ~0.5-1 s of CPU with FGD. Pure: randomness from ``seed``, no I/O, no clock.

``SwitchPlacer`` runs that choice only in a group that overflows (the cluster cannot take all of it) and
places every other group whole, so it never leaves a pod out while everything pending fits; with ``exact``
(``knapsack:fgd``) the overflowing group's candidates include the exact knapsack (``policies.packing``, one
MIP: the most GPU milli of the group the cluster can take as it is).

With ``fit`` (``WholePlanning``, the ``planned:`` placer) a group that fits is planned too, still placed
whole: ``place_whole`` tries, besides FGD's sequential placement, MIPs that place every pod of the group
together with the most GPU milli of an imagined future (``plan_whole``), and keeps the candidate after
which other imagined futures pack the most GPU milli; a candidate that leaves room for fewer multi-GPU pods
than the sequential placement (``whole_room``) is refused. Without that guard (``judge_all``: judged on futures
with the multi-GPU pods instead) the plans spend the nodes FGD keeps whole and a large pod arriving later can
find none; ``pod_floor`` keeps a few nodes for each multi-GPU pod shape (``pod_room``).

``ScenarioPlacer`` (its docstring) answers the question the order search cannot: on the batch-arrival
protocol the idle GPU left at the end is mostly 190-milli slivers beside 810-milli shares, and no order
avoids them when every pod that fits is placed. It plans the group together with imagined pods drawn
from the briefed workload and judges each candidate by what further imagined pods still place after it.
Cost: (2 + ``plans``) candidates x ``evals`` packings of ~free-capacity-sized futures plus ``plans``
packings; 4 + 4 on 40 nodes: ~1 s of CPU per group with FGD (4.5 s per run of 4-6 groups).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from agmarl_common.core.cluster.filters import feasible_mask, filter_node
from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Pod, bind
from agmarl_common.core.policies.base import Policy, brief, gpu_free_row
from agmarl_common.core.policies.packing import modelled, pack_group
from agmarl_common.core.sim.batches import Bind, place_in_order
from agmarl_common.core.sim.fragmentation import TargetWorkload, state_frag, target_workload

DEFAULT_ORDERS = 8
DEFAULT_LOOKAHEAD = 64


def largest_first(group: Sequence[Pod]) -> list[int]:
    """Positions by GPU milli requested, then GPUs, CPU, memory, all decreasing; ties keep arrival order."""
    return sorted(range(len(group)), key=lambda k: (-group[k].gpu_milli_total, -group[k].num_gpu,
                                                    -group[k].cpu_milli, -group[k].memory_mib, k))


def cpu_first(group: Sequence[Pod]) -> list[int]:
    return sorted(range(len(group)), key=lambda k: (-group[k].cpu_milli, -group[k].gpu_milli_total, k))


def constrained_first(group: Sequence[Pod], state: ClusterState) -> list[int]:
    """Positions by how few nodes pass the hard filter now, then largest first."""
    n_ok = [int(feasible_mask(p, state).sum()) for p in group]
    big = {k: r for r, k in enumerate(largest_first(group))}
    return sorted(range(len(group)), key=lambda k: (n_ok[k], big[k]))


def perturbed(order: Sequence[int], rng: np.random.Generator, swaps: int) -> list[int]:
    """``order`` with ``swaps`` random neighbouring pairs exchanged."""
    out = list(order)
    if len(out) < 2:
        return out
    for j in rng.integers(0, len(out) - 1, size=swaps):
        out[j], out[j + 1] = out[j + 1], out[j]
    return out


def candidate_orders(group: Sequence[Pod], state: ClusterState, rng: np.random.Generator,
                     orders: int = DEFAULT_ORDERS) -> list[list[int]]:
    """The orders the search tries (module docstring), duplicates removed, at most ``orders``."""
    base = largest_first(group)
    fixed = [list(range(len(group))), base, cpu_first(group), constrained_first(group, state)]
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for order in fixed + [perturbed(base, rng, max(1, len(group) // 4)) for _ in range(max(0, orders - 4))]:
        key = tuple(order)
        if key not in seen and len(out) < max(orders, 1):
            seen.add(key)
            out.append(order)
    return out


class JointPlacer:
    """Places a whole group at once: the best of ``orders`` candidate orders under ``policy`` (module
    docstring), judged by GPU milli placed, then by what ``samples`` imagined next groups of ``lookahead``
    pods drawn from the briefed workload would still place (0: no lookahead), then fragmentation.
    ``helpers``: more base policies, each tried on the arrival and largest-first orders."""

    def __init__(self, policy: Policy, orders: int = DEFAULT_ORDERS, seed: int = 0,
                 lookahead: int = DEFAULT_LOOKAHEAD, samples: int = 1, helpers: Sequence[Policy] = ()):
        self.policy = policy
        self.orders, self.lookahead, self.samples = orders, lookahead, samples
        self.helpers = tuple(helpers)
        self.rng = np.random.default_rng(seed)
        self.target: TargetWorkload | None = None
        self.workload: tuple[Pod, ...] = ()
        self.name = f"joint:{policy.name}"

    def observe_workload(self, pods: Sequence[Pod]) -> None:
        self.target = target_workload(pods)
        self.workload = tuple(sorted(pods, key=lambda p: p.key))
        for p in (self.policy,) + self.helpers:
            brief(p, pods, None)

    def set_objective(self, name: str) -> None:
        for p in (self.policy,) + self.helpers:
            brief(p, None, name)

    def imagined(self) -> list[Pod]:
        """One imagined next group: ``lookahead`` pods drawn uniformly from the briefed workload."""
        if not self.workload or self.lookahead <= 0:
            return []
        return [self.workload[int(j)] for j in self.rng.integers(0, len(self.workload), size=self.lookahead)]

    def place_group(self, group: Sequence[Pod], state: ClusterState, rank: np.ndarray) -> list[Bind]:
        target = self.target if self.target is not None else target_workload(group)
        access = target.accessible(state.gpu_model)
        futures = [f for f in (self.imagined() for _ in range(self.samples)) if f]  # the same for every order
        orders = candidate_orders(group, state, self.rng, self.orders)
        tries = [(self.policy, o) for o in orders] + [(h, o) for h in self.helpers for o in orders[:2]]
        best_key, best = None, []
        for policy, order in tries:
            binds, end = place_in_order(policy, group, order, state, rank)
            milli = sum(group[k].gpu_milli_total for k, _, _ in binds)
            ahead = 0
            for future in futures:
                more, _ = place_in_order(self.policy, future, range(len(future)), end, rank)
                ahead += sum(future[k].gpu_milli_total for k, _, _ in more)
            key = (milli, ahead, -float(state_frag(end, target, access).sum()), len(binds))
            if best_key is None or key > best_key:
                best_key, best = key, binds
        return best


# --- Scenario placement: which pods of a group to place, judged on imagined futures -------------------------

DEFAULT_PLANS = 4  # imagined futures a candidate placement is planned against
DEFAULT_EVALS = 4  # imagined futures every candidate is judged on (the same ones for all: common random numbers)
DEFAULT_PLAN_FILL = 0.8  # a planning future requests this x the GPU milli free before the group
DEFAULT_EVAL_FILL = 1.0  # a judging future requests this x the GPU milli free before the group
IMAGINED_MAX_GPUS = 1  # imagined pods ask at most this many GPUs (rare 2-8 GPU pods make the plans gamble)
MAX_IMAGINED = 4096  # bound on the pods of one imagined future


def imagine(pool: Sequence[Pod], milli: float, rng: np.random.Generator) -> list[Pod]:
    """Pods drawn uniformly (with replacement) from ``pool`` until they request ``milli`` GPU milli (at most
    ``MAX_IMAGINED`` pods; none when the pool requests no GPU)."""
    out: list[Pod] = []
    if milli <= 0 or not any(p.gpu_milli_total > 0 for p in pool):
        return out
    got = 0
    while got < milli and len(out) < MAX_IMAGINED:
        p = pool[int(rng.integers(len(pool)))]
        out.append(p)
        got += p.gpu_milli_total
    return out


def packing_order(pods: Sequence[Pod], n_real: int) -> list[int]:
    """First-fit-decreasing over real and imagined pods: most GPU milli first, then more GPUs; among equal
    requests the real pods (positions < ``n_real``) before the imagined ones, then more CPU first."""
    return sorted(range(len(pods)), key=lambda k: (-pods[k].gpu_milli_total, -pods[k].num_gpu, k >= n_real,
                                                    -pods[k].cpu_milli, k))


def commit(group: Sequence[Pod], binds: Sequence[Bind], state: ClusterState) -> tuple[list[Bind], ClusterState]:
    """``binds`` re-checked in order on ``state`` (hard filter, devices free), those that fail left out: a plan
    made next to imagined pods is kept only where it holds without them."""
    kept: list[Bind] = []
    for k, i, gpus in binds:
        pod = group[k]
        free = gpu_free_row(state, i)
        share = pod.gpu_milli if pod.is_gpu_share else GPU_MILLI
        if not filter_node(pod, state, i).ok or len(gpus) != pod.num_gpu or any(free[j] < share for j in gpus):
            continue
        state = bind(state, pod, i, tuple(gpus))
        kept.append((k, i, tuple(gpus)))
    return kept, state


def plan_against(policy: Policy, group: Sequence[Pod], future: Sequence[Pod], state: ClusterState,
                 rank: np.ndarray | None) -> list[Bind]:
    """The group's part of one first-fit-decreasing packing of the group and an imagined future together:
    the real pods that packing places, where it places them."""
    pods = list(group) + list(future)
    binds, _ = place_in_order(policy, pods, packing_order(pods, len(group)), state, rank)
    return [b for b in binds if b[0] < len(group)]


def future_milli(policy: Policy, future: Sequence[Pod], state: ClusterState, rank: np.ndarray | None) -> int:
    """GPU milli a first-fit-decreasing packing of ``future`` places on ``state``."""
    binds, _ = place_in_order(policy, future, packing_order(future, 0), state, rank)
    return sum(future[k].gpu_milli_total for k, _, _ in binds)


def place_jointly(policy: Policy, group: Sequence[Pod], state: ClusterState, rank: np.ndarray | None,
                  pool: Sequence[Pod], rng: np.random.Generator, plans: int = DEFAULT_PLANS,
                  evals: int = DEFAULT_EVALS, plan_fill: float = DEFAULT_PLAN_FILL,
                  eval_fill: float = DEFAULT_EVAL_FILL, ahead_weight: float = 1.0,
                  extra: Sequence[Sequence[Bind]] = ()) -> list[Bind]:
    """The scenario placement of ``group`` on ``state`` (``ScenarioPlacer``'s docstring). ``ahead_weight``: the
    weight of the imagined futures' GPU milli against the group's (0: the group's GPU milli first, the futures
    only break ties); ``extra``: more candidate placements. Pure: the imagined futures come from ``pool`` and
    ``rng``; the answer passes the hard filter on ``state`` in its order."""
    free = float(state.gpu_free().sum())
    judges = [imagine(pool, eval_fill * free, rng) for _ in range(evals)]
    arrival, _ = place_in_order(policy, group, range(len(group)), state, rank)
    largest, _ = place_in_order(policy, group, largest_first(group), state, rank)
    candidates = [arrival, largest] + [plan_against(policy, group, imagine(pool, plan_fill * free, rng), state, rank)
                                       for _ in range(plans)] + [list(b) for b in extra]
    best_key, best = None, []
    seen: set[tuple] = set()
    for binds in candidates:
        binds, end = commit(group, binds, state)
        if tuple(binds) in seen:
            continue
        seen.add(tuple(binds))
        placed = sum(group[k].gpu_milli_total for k, _, _ in binds)
        ahead = sum(future_milli(policy, f, end, rank) for f in judges) / max(len(judges), 1)
        key = (placed + ahead_weight * ahead, placed, ahead, len(binds))  # ties: more GPU milli in hand, more pods
        if best_key is None or key > best_key:
            best_key, best = key, binds
    return best


class ScenarioPlacer:
    """Places a whole group at once, choosing *which* of its pods to place and where, for the cluster's
    GPU allocation once more pods like the briefed workload's have arrived.

    Candidates: the group placed by ``policy`` one by one in arrival order (the sequential placement), the
    group largest first, and ``plans`` scenario plans: the group packed first-fit-decreasing together with
    an imagined future (pods drawn from the briefed workload, at most ``IMAGINED_MAX_GPUS`` GPUs each,
    requesting ``plan_fill`` x the GPU milli free now), keeping the group's pods that packing places where
    it places them. A plan leaves out a pod whose room the imagined pods fill better (an 810-milli share
    that strands 190 milli on its device where a whole-GPU pod would leave none), and puts the others
    where the imagined pods leave room. Every candidate is judged by the GPU milli it places plus the mean
    GPU milli a first-fit-decreasing packing of ``evals`` other imagined futures (``eval_fill`` x the free
    GPU milli each; the same futures for every candidate) still places after it; the best is bound.

    This is admission control: a pod that fits may be left out (the batch-arrival protocol drops it), on
    the assumption that more GPU demand than free capacity is coming. Where that is false (an under-loaded
    cluster) leaving pods out only loses (docs/evaluation.md). Pure: randomness from ``seed``; the hard
    filter is applied to every bind (``commit``), so the answer never violates it.
    """

    def __init__(self, policy: Policy, seed: int = 0, plans: int = DEFAULT_PLANS, evals: int = DEFAULT_EVALS,
                 plan_fill: float = DEFAULT_PLAN_FILL, eval_fill: float = DEFAULT_EVAL_FILL,
                 max_gpus: int = IMAGINED_MAX_GPUS):
        self.policy = policy
        self.plans, self.evals, self.plan_fill, self.eval_fill = plans, evals, plan_fill, eval_fill
        self.max_gpus = max_gpus
        self.rng = np.random.default_rng(seed)
        self.pool: tuple[Pod, ...] = ()
        self.name = f"scenario:{policy.name}"

    def observe_workload(self, pods: Sequence[Pod]) -> None:
        self.pool = tuple(sorted((p for p in pods if p.num_gpu <= self.max_gpus), key=lambda p: p.key))
        brief(self.policy, pods, None)

    def set_objective(self, name: str) -> None:
        brief(self.policy, None, name)

    def place_group(self, group: Sequence[Pod], state: ClusterState, rank: np.ndarray) -> list[Bind]:
        return place_jointly(self.policy, group, state, rank, self.pool, self.rng, self.plans, self.evals,
                             self.plan_fill, self.eval_fill)


# --- The switch: hold pods back only when the pending demand overflows the free capacity --------------------

DEFAULT_HOLD_FACTOR = 0.0  # 0: hold back only when the group does not fit whole (the overflow test alone)


def fits_whole(policy: Policy, group: Sequence[Pod], state: ClusterState, rank: np.ndarray | None) -> bool:
    """Whether ``policy`` placing ``group`` one by one in arrival order on ``state`` places every pod that
    fits ``state`` on its own (a pod no node can take now never will: nothing departs, so it is not demand
    the cluster could take)."""
    binds, _ = place_in_order(policy, group, range(len(group)), state, rank)
    if len(binds) == len(group):
        return True
    placed = {k for k, _, _ in binds}
    return not any(k not in placed and feasible_mask(group[k], state).any() for k in range(len(group)))


def typical(pool: Sequence[Pod]) -> dict[tuple[int, int], Pod]:
    """Per (GPUs, milli per GPU) of ``pool``: its most common pod by (CPU, memory), the first such in ``pool``'s
    order. Imagined pods reduced to these few shapes keep a planning MIP small."""
    counts: dict[tuple[int, int], dict[tuple[int, int], int]] = defaultdict(lambda: defaultdict(int))
    first: dict[tuple[int, int, int, int], Pod] = {}
    for p in pool:
        counts[p.num_gpu, p.gpu_milli][p.cpu_milli, p.memory_mib] += 1
        first.setdefault((p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib), p)
    return {c: first[c + max(v, key=lambda r: (v[r], r))] for c, v in counts.items()}


@dataclass(frozen=True)
class WholePlanning:
    """How ``place_whole`` plans a group that fits (``SwitchPlacer``'s ``fit``; ``plans`` 0: not planned)."""

    plans: int = 0  # plans tried besides the sequential placement
    evals: int = DEFAULT_EVALS  # imagined futures every candidate is judged on (the same for all)
    fill: float = 1.0  # a planning future requests this x the GPU milli free after the group
    eval_fill: float = 1.0  # a judging future requests this x the GPU milli free after the group
    max_nodes: int = 200  # branch-and-bound nodes of one plan's MIP
    max_sols: int = 2  # a plan's MIP stops at its second improving solution (0: no such stop)
    keep_room: bool = True  # refuse a plan leaving room for fewer multi-GPU pods than FGD's placement
    judge_all: bool = False  # judging futures drawn from the whole briefed workload (multi-GPU pods too)
    plan_all: bool = False  # planning futures drawn from the whole briefed workload (multi-GPU pods too)
    pod_floor: int = 0  # refuse a plan after which fewer nodes than min(this, before the group) take a multi-GPU pod


def whole_room(state: ClusterState, sizes: Sequence[int] = (2, 4, 8)) -> tuple[int, ...]:
    """Per size k in ``sizes``: how many k-GPU pods the wholly free devices of ``state`` could take, node by node
    (CPU and memory ignored). A plan keeps at least the sequential placement's (``place_whole``): the imagined
    pods ask at most one GPU, so nothing else keeps room for the rare multi-GPU pods."""
    whole = (state.gpu_free() >= GPU_MILLI).sum(axis=1)
    return tuple(int((whole // k).sum()) for k in sizes)


def pod_room(state: ClusterState, pods: Sequence[Pod]) -> tuple[int, ...]:
    """Per pod of ``pods``: the nodes of ``state`` that pass its hard filter now (CPU, memory and devices
    included, unlike ``whole_room``)."""
    return tuple(int(feasible_mask(p, state).sum()) for p in pods)


def multi_gpu_shapes(pods: Sequence[Pod]) -> tuple[Pod, ...]:
    """One pod per distinct request of ``pods`` asking several GPUs (GPUs, milli, CPU, memory, GPU models), the
    first in ``pods``' order: the pods ``WholePlanning.pod_floor`` keeps room for (13 in openb:default)."""
    out: dict[tuple, Pod] = {}
    for p in pods:
        if p.num_gpu >= 2:
            out.setdefault((p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib, p.gpu_spec), p)
    return tuple(out.values())


def plan_whole(group: Sequence[Pod], future: Sequence[Pod], state: ClusterState,
               how: WholePlanning = WholePlanning()) -> list[Bind] | None:
    """Every pod of ``group`` placed where one MIP (``packing.pack_group``) that must place all of them also
    places the most GPU milli of an imagined ``future`` beside them: the group's binds of that packing (None
    when the MIP finds none, or a pod is not modelled)."""
    pods = list(group) + list(future)
    packed = pack_group(pods, state, mandatory=[True] * len(group) + [False] * len(future),
                        max_nodes=how.max_nodes, max_sols=how.max_sols)
    return None if packed is None else [b for b in packed.binds if b[0] < len(group)]


def place_whole(policy: Policy, group: Sequence[Pod], state: ClusterState, rank: np.ndarray | None,
                sequential: Sequence[Bind], pool: Sequence[Pod], shapes: dict[tuple[int, int], Pod],
                rng: np.random.Generator, how: WholePlanning, judge_pool: Sequence[Pod] = (),
                plan_pool: Sequence[Pod] = (), big: Sequence[Pod] = ()) -> list[Bind]:
    """A group that fits placed whole: ``sequential`` (``policy``'s placement, one by one) or one of ``how.plans``
    ``plan_whole`` placements, each against an imagined future drawn from ``pool`` (``how.fill`` x the GPU milli
    free after the group; its pods reduced to ``shapes``, ``typical``), whichever leaves the cluster where a
    first-fit-decreasing packing of ``how.evals`` other imagined futures (``how.eval_fill`` x that free milli;
    the same for every candidate) places the most GPU milli; ties to ``sequential``. A candidate that places
    fewer pods than ``sequential`` is dropped, so every pod ``sequential`` places is placed, as is (``how.keep_room``)
    one that leaves room for fewer multi-GPU pods (``whole_room``) than ``sequential``,
    and, with ``how.pod_floor`` > 0, a plan after which fewer nodes than min(``how.pod_floor``, the nodes before
    the group) can take one of the multi-GPU pods ``big`` (``pod_room``: CPU and memory left beside the free
    devices count; ``sequential`` is never refused by it, so only FGD's own placements use up the last nodes a
    large pod fits, as in ``knapsack:``). ``judge_pool`` (when not
    empty): the pods the judging futures are drawn from instead (``how.judge_all``: the whole briefed workload,
    multi-GPU pods included, so the judges rather than the guard weigh a node opened for shares); ``plan_pool``
    (when not empty): the pods the planning futures are drawn from instead (``how.plan_all``; ``shapes`` must
    cover them)."""
    after = float(state.gpu_free().sum()) - sum(p.gpu_milli_total for p in group)
    judges = [imagine(judge_pool or pool, how.eval_fill * after, rng) for _ in range(how.evals)]
    candidates = [list(sequential)]
    for _ in range(how.plans):
        future = [shapes[p.num_gpu, p.gpu_milli] for p in imagine(plan_pool or pool, how.fill * after, rng)]
        binds = plan_whole(group, future, state, how)
        if binds is not None:
            candidates.append(binds)
    big = big if how.pod_floor > 0 else ()
    floor = tuple(min(c, how.pod_floor) for c in pod_room(state, big))
    best_key, best, room = None, list(sequential), None
    for binds in candidates:
        binds, end = commit(group, binds, state)
        plan = room is not None
        room = whole_room(end) if room is None else room  # the sequential placement's, the first candidate
        if len(binds) < len(sequential) or (how.keep_room and any(a < b for a, b in zip(whole_room(end), room))) \
                or (plan and any(a < b for a, b in zip(pod_room(end, big), floor))):
            continue
        key = sum(future_milli(policy, f, end, rank) for f in judges)
        if best_key is None or key > best_key:
            best_key, best = key, binds
    return best


class SwitchPlacer:
    """Pods held back only where the pending demand overflows the free capacity; work-conserving otherwise.

    The group is the pending demand the scheduler knows (in the batch-arrival protocol nothing else is
    waiting). If the sequential placement of the whole group on a copy of the cluster places every pod that
    fits the cluster on its own (``fits_whole``), the cluster can take everything pending and nothing is held
    back: the group is placed sequentially (``search``: by the order search, ``JointPlacer``, kept only if it
    too places every pod). Otherwise the group overflows and ``place_jointly`` chooses which pods to place,
    judged by the group's GPU milli placed first (``overflow_weight`` x the imagined futures' GPU milli added:
    0 by default, so the futures only break ties); its candidates are the sequential and largest-first
    placements, the scenario plans and (``overflow_search``) the order search's placement, so it never places
    less GPU milli of the group than the sequential placement. ``hold_factor`` > 0 also holds back (scenario
    placement as ``ScenarioPlacer``) where the group asks more than ``hold_factor`` x the free GPU milli: that
    breaks the rule above and loses where no more demand comes (docs/evaluation.md); off by default.
    ``exact`` (the ``knapsack:`` placer) adds to an overflowing group's candidates the placement that
    provably (or within 0.1 %) places the most GPU milli of the group on the cluster as it is: the knapsack
    of ``packing.pack_group``, one MIP; since the candidate placing the most GPU milli wins, it never places
    less of the group than the other candidates. ``pack_fitting`` (off; it lost to FGD, docs/evaluation.md)
    places a group that fits by ``pack_group`` with every pod mandatory (fewest wholly free devices opened
    for shares, CPU kept beside the whole GPUs left), kept only if every pod is placed. ``fit`` with
    ``plans`` > 0 (the ``planned:`` placer) places a group that fits by ``place_whole`` instead: the
    sequential placement or a plan that places every pod as well, whichever leaves more room for imagined
    futures (its docstring).
    Pure: randomness from ``seed``; every bind passes the hard filter by construction.
    """

    def __init__(self, policy: Policy, seed: int = 0, hold_factor: float = DEFAULT_HOLD_FACTOR,
                 orders: int = DEFAULT_ORDERS, lookahead: int = DEFAULT_LOOKAHEAD, plans: int = DEFAULT_PLANS,
                 evals: int = DEFAULT_EVALS, plan_fill: float = DEFAULT_PLAN_FILL,
                 eval_fill: float = DEFAULT_EVAL_FILL, search: bool = False, overflow_search: bool = True,
                 overflow_weight: float = 0.0, exact: bool = False, pack_fitting: bool = False,
                 fit: WholePlanning = WholePlanning()):
        self.policy, self.exact, self.pack_fitting = policy, exact, pack_fitting
        self.fit, self.fit_rng = fit, np.random.default_rng(seed + 2)
        self.shapes: dict[tuple[int, int], Pod] = {}  # ``typical`` of the briefed pool (``fit``)
        self.plan_pool: tuple[Pod, ...] = ()  # the briefed workload's modelled pods (``fit.plan_all``)
        self.big: tuple[Pod, ...] = ()  # the briefed workload's multi-GPU pod shapes (``fit.pod_floor``)
        self.cpu_per_gpu = 0.0  # CPU milli per GPU of the briefed workload's GPU pods (``pack_fitting``)
        self.overflow_weight, self.overflow_search = overflow_weight, overflow_search
        self.hold_factor, self.search = hold_factor, search
        self.joint = JointPlacer(policy, orders=orders, seed=seed, lookahead=lookahead)
        self.scenario = ScenarioPlacer(policy, seed=seed + 1, plans=plans, evals=evals, plan_fill=plan_fill,
                                       eval_fill=eval_fill)
        self.held_groups = 0  # groups placed by choosing which pods to place (overflowing, or over hold_factor)
        self.name = f"{'planned' if fit.plans > 0 else 'knapsack' if exact else 'switch'}:{policy.name}"

    def observe_workload(self, pods: Sequence[Pod]) -> None:
        self.joint.observe_workload(pods)
        self.scenario.observe_workload(pods)
        self.plan_pool = tuple(p for p in self.joint.workload if modelled(p)) if self.fit.plan_all else ()
        self.shapes = typical(self.plan_pool or self.scenario.pool)
        self.big = multi_gpu_shapes(self.joint.workload)
        gpus = sum(p.gpu_milli_total for p in pods) / GPU_MILLI
        self.cpu_per_gpu = sum(p.cpu_milli for p in pods if p.num_gpu) / gpus if gpus else 0.0

    def set_objective(self, name: str) -> None:
        brief(self.policy, None, name)

    def place_group(self, group: Sequence[Pod], state: ClusterState, rank: np.ndarray) -> list[Bind]:
        if not fits_whole(self.policy, group, state, rank):
            # overflow: the group alone asks more than the cluster takes; place the most GPU milli of it
            self.held_groups += 1
            sc = self.scenario
            extra = [self.joint.place_group(group, state, rank)] if self.overflow_search else []
            if self.exact:
                packed = pack_group(group, state, mandatory=[False] * len(group))
                extra += [list(packed.binds)] if packed is not None else []
            return place_jointly(self.policy, group, state, rank, sc.pool, sc.rng, sc.plans, sc.evals, sc.plan_fill,
                                 sc.eval_fill, ahead_weight=self.overflow_weight, extra=extra)
        if self.hold_factor > 0 and sum(p.gpu_milli_total for p in group) > self.hold_factor * float(
                state.gpu_free().sum()):
            self.held_groups += 1
            return self.scenario.place_group(group, state, rank)
        if self.search:
            binds = self.joint.place_group(group, state, rank)
            if len(binds) == len(group):
                return binds
        sequential = place_in_order(self.policy, group, range(len(group)), state, rank)[0]
        if self.fit.plans > 0 and self.scenario.pool:
            return place_whole(self.policy, group, state, rank, sequential, self.scenario.pool, self.shapes,
                               self.fit_rng, self.fit, self.joint.workload if self.fit.judge_all else (),
                               self.plan_pool, self.big)
        if self.pack_fitting and len(sequential) == len(group) and self.cpu_per_gpu > 0:
            packed = pack_group(group, state, open_cost=1.0, cpu_per_gpu=self.cpu_per_gpu,
                                short_cost=1.0 / self.cpu_per_gpu)
            binds = commit(group, list(packed.binds), state)[0] if packed is not None else []
            if len(binds) == len(group):
                return binds
        return sequential
