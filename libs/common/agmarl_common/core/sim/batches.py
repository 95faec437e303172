"""Batch arrivals: openb pods arriving in groups of 16-128 on an openb sub-cluster, each group placed
before the next arrives (issue 12, item 3 "joint decisions that pay").

Protocol (seeded; the same seed replays the same run):
1. a sub-cluster of ``n_nodes`` nodes is drawn without replacement from the given nodes (openb's GPU
   nodes in the benchmark), kept in their file order;
2. the arrival sequence is the inflation protocol's (``inflation.inflate_workload``): the pod list
   shuffled and tuned until GPU requests reach ``ratio`` x the sub-cluster's GPU capacity;
3. the sequence is cut into consecutive groups whose sizes are drawn uniformly from
   ``min_size..max_size`` (the last group takes what is left);
4. a per-run node order (the inflation protocol's tie order) is drawn last;
5. each group is handed whole to a ``GroupPlacer``, which answers where each pod goes (or nowhere)
   and in which order the pods bind; the harness binds them in that order and re-runs the hard filter
   (``filters.filter_node``) and the device check before every bind, so a placer can never
   over-commit a node: a violation is a bug and raises. Nothing departs; an unplaced pod is dropped.
6. after every group the harness records GPU milli arrived, allocated, pods placed and the cluster's
   FGD fragmentation amount.

``SequentialPlacer`` places a group one pod at a time in arrival order with one ``Policy`` (best score,
ties to the first node in the run's node order), exactly as the inflation protocol does per pod; the
joint placer lives in ``policies.joint``. Pure: no I/O, no clock; randomness from the generator given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from agmarl_common.core.cluster.filters import feasible_mask, filter_node
from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Node, Pod, bind
from agmarl_common.core.policies.base import Policy, admitted, brief, gpu_free_row
from agmarl_common.core.sim.fragmentation import TargetWorkload, state_frag, target_workload
from agmarl_common.core.sim.inflation import inflate_workload, pick_node

OBJECTIVE = "allocation"  # what this protocol measures: GPU allocation
MIN_GROUP, MAX_GROUP = 16, 128

# one bind of a group: (position of the pod in the group, node index, GPU devices)
Bind = tuple[int, int, tuple[int, ...]]


@dataclass(frozen=True)
class BatchPlan:
    """One run's setting: the sub-cluster, the groups in arrival order and the per-node tie rank."""

    nodes: tuple[Node, ...]
    groups: tuple[tuple[Pod, ...], ...]
    rank: np.ndarray  # (n,) tie order: a tied pod goes to the node of lowest rank

    @property
    def total_gpu_milli(self) -> int:
        return sum(nd.gpu_count for nd in self.nodes) * GPU_MILLI

    @property
    def pods(self) -> tuple[Pod, ...]:
        return tuple(p for g in self.groups for p in g)


def sub_cluster(nodes: Sequence[Node], n_nodes: int, rng: np.random.Generator) -> tuple[Node, ...]:
    """``n_nodes`` of ``nodes`` drawn without replacement, in their original order."""
    if not 1 <= n_nodes <= len(nodes):
        raise ValueError(f"sub_cluster: n_nodes must be 1..{len(nodes)}, got {n_nodes}")
    pick = np.sort(rng.choice(len(nodes), size=n_nodes, replace=False))
    return tuple(nodes[int(i)] for i in pick)


def split_groups(pods: Sequence[Pod], rng: np.random.Generator, min_size: int = MIN_GROUP,
                 max_size: int = MAX_GROUP) -> tuple[tuple[Pod, ...], ...]:
    """Consecutive groups of ``pods`` with sizes uniform in min_size..max_size (the last: the rest)."""
    if not 1 <= min_size <= max_size:
        raise ValueError(f"split_groups: need 1 <= min_size <= max_size, got {min_size}, {max_size}")
    out, start = [], 0
    while start < len(pods):
        size = int(rng.integers(min_size, max_size + 1))
        out.append(tuple(pods[start:start + size]))
        start += size
    return tuple(out)


def plan_batches(nodes: Sequence[Node], workload: Sequence[Pod], rng: np.random.Generator, n_nodes: int = 40,
                 ratio: float = 1.3, min_size: int = MIN_GROUP, max_size: int = MAX_GROUP) -> BatchPlan:
    """The run's plan, drawn from ``rng`` in the module docstring's order."""
    sub = sub_cluster(nodes, n_nodes, rng)
    total = sum(nd.gpu_count for nd in sub) * GPU_MILLI
    if total <= 0:
        raise ValueError("plan_batches: the sub-cluster has no GPUs")
    arrivals = inflate_workload(workload, total, rng, ratio)
    groups = split_groups(arrivals, rng, min_size, max_size)
    return BatchPlan(nodes=sub, groups=groups, rank=rng.permutation(len(sub)))


class GroupPlacer(Protocol):
    name: str

    def place_group(self, group: Sequence[Pod], state: ClusterState, rank: np.ndarray) -> list[Bind]:
        """Where the pods of ``group`` go, in bind order; a pod left out is not placed."""
        ...


def place_in_order(policy: Policy, group: Sequence[Pod], order: Sequence[int], state: ClusterState,
                   rank: np.ndarray | None) -> tuple[list[Bind], ClusterState]:
    """Each pod of ``group`` in ``order`` (positions) placed by ``policy`` on the state the earlier pods
    left: hard filter, the policy's admission, best score (ties -> lowest ``rank``), its devices."""
    binds: list[Bind] = []
    for k in order:
        pod = group[k]
        candidates = admitted(policy, pod, state, np.flatnonzero(feasible_mask(pod, state)))
        if candidates.size == 0:
            continue
        scores = np.asarray(policy.score(pod, state, candidates), dtype=np.float64)
        i = pick_node(scores, candidates, rank)
        gpus = policy.choose_gpus(pod, state, i)
        if gpus is None or len(gpus) != pod.num_gpu:
            raise RuntimeError(f"{policy.name}: no devices for {pod.key} on feasible node {i}")
        state = bind(state, pod, i, tuple(gpus))
        binds.append((k, i, tuple(gpus)))
    return binds, state


class SequentialPlacer:
    """One pod at a time in arrival order with ``policy`` (the inflation protocol, per group)."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.name = f"seq:{policy.name}"

    def observe_workload(self, pods: Sequence[Pod]) -> None:
        brief(self.policy, pods, None)

    def set_objective(self, name: str) -> None:
        brief(self.policy, None, name)

    def place_group(self, group: Sequence[Pod], state: ClusterState, rank: np.ndarray) -> list[Bind]:
        return place_in_order(self.policy, group, range(len(group)), state, rank)[0]


@dataclass(frozen=True)
class BatchResult:
    """One run. Per-group arrays have one entry before the first group and one after each group."""

    placer: str
    group_sizes: tuple[int, ...]
    node_index: np.ndarray  # (P,) node of each pod in arrival order, -1 = not placed
    arrived_milli: np.ndarray  # (G+1,) GPU milli requested by the groups arrived so far
    used_milli: np.ndarray  # (G+1,) GPU milli allocated
    placed_pods: np.ndarray  # (G+1,) pods placed
    frag_milli: np.ndarray  # (G+1,) cluster FGD fragmentation amount
    total_gpu_milli: int
    state: ClusterState

    @property
    def allocation(self) -> float:
        """GPU allocation % of capacity after the last group."""
        return 100.0 * float(self.used_milli[-1]) / self.total_gpu_milli

    def allocation_curve(self) -> np.ndarray:
        """(G+1,) GPU allocation % after each group."""
        return 100.0 * self.used_milli / self.total_gpu_milli

    def arrived_pct(self) -> np.ndarray:
        return 100.0 * self.arrived_milli / self.total_gpu_milli


def apply_binds(group: Sequence[Pod], binds: Sequence[Bind], state: ClusterState,
                who: str = "placer") -> ClusterState:
    """``state`` with ``binds`` bound in order, each re-checked first (hard filter, devices free); a
    violation raises (a placer bug), as does a pod bound twice."""
    seen: set[int] = set()
    for k, i, gpus in binds:
        pod = group[k]
        if k in seen:
            raise RuntimeError(f"{who}: pod {pod.key} bound twice in one group")
        seen.add(k)
        status = filter_node(pod, state, i)
        if not status.ok:
            raise RuntimeError(f"{who}: {pod.key} on node {i} fails the hard filter: {status.reason}")
        free = gpu_free_row(state, i)
        share = pod.gpu_milli if pod.is_gpu_share else GPU_MILLI
        if len(gpus) != pod.num_gpu or len(set(gpus)) != len(gpus) or any(free[j] < share for j in gpus):
            raise RuntimeError(f"{who}: {pod.key} on node {i}: devices {gpus} cannot host it")
        state = bind(state, pod, i, tuple(gpus))
    return state


def run_batches(plan: BatchPlan, placer: GroupPlacer, workload: Sequence[Pod],
                target: TargetWorkload | None = None) -> BatchResult:
    """Run the protocol (module docstring) for ``placer`` on an empty sub-cluster. ``workload`` is the pod
    list the placer is briefed with and fragmentation is measured against (``target`` overrides the latter)."""
    state = ClusterState.empty(plan.nodes)
    target = target if target is not None else target_workload(workload)
    access = target.accessible(state.gpu_model)
    brief(placer, workload, OBJECTIVE)
    g = len(plan.groups)
    arrived, used, placed = np.zeros(g + 1, np.int64), np.zeros(g + 1, np.int64), np.zeros(g + 1, np.int64)
    frag = np.zeros(g + 1)
    frag[0] = state_frag(state, target, access).sum()
    node_index: list[np.ndarray] = []
    for e, group in enumerate(plan.groups):
        binds = placer.place_group(group, state, plan.rank)
        state = apply_binds(group, binds, state, placer.name)
        where = np.full(len(group), -1, np.int64)
        for k, i, _ in binds:
            where[k] = i
        node_index.append(where)
        arrived[e + 1] = arrived[e] + sum(p.gpu_milli_total for p in group)
        used[e + 1] = used[e] + sum(group[k].gpu_milli_total for k, _, _ in binds)
        placed[e + 1] = placed[e] + len(binds)
        frag[e + 1] = state_frag(state, target, access).sum()
    return BatchResult(placer=placer.name, group_sizes=tuple(len(gr) for gr in plan.groups),
                       node_index=np.concatenate(node_index) if node_index else np.zeros(0, np.int64),
                       arrived_milli=arrived, used_milli=used, placed_pods=placed, frag_milli=frag,
                       total_gpu_milli=plan.total_gpu_milli, state=state)
