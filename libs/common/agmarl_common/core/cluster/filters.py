"""The hard filter, with kube-scheduler's Filter semantics. One implementation for every caller.

``filter_node`` runs the checks in kube-scheduler's default order (NodeUnschedulable,
TaintToleration, NodeAffinity, NodeResourcesFit incl. GPUs, PodTopologySpread, InterPodAffinity)
and returns the first failure. ``feasible_mask`` computes the same answer for every node at once.
The pod-to-pod checks (spread, affinity) are written once, as whole-cluster arrays (which node
fails, and why) that both use: ``filter_node`` reads one entry, ``feasible_mask`` all of them.

They never scan every bound pod: the state's ``PodIndex`` (podindex.py, kept current by bind/unbind)
counts bound pods per node by label set and by required anti-affinity term, so a term costs one
selector match per label set that could match, then a few numpy operations over nodes. Topology
domains and node-affinity masks are derived once per ``nodes`` tuple (``_remember``). Results
depend only on the arguments: what is memoised is derived from them.

The checks live in ``node_checks.py`` (one node: unschedulable, taints, node affinity, resources
and GPUs) and ``topology_checks.py`` (pod-to-pod: topology spread, inter-pod affinity); this
module combines them and re-exports them, so callers import everything from here.
"""

from __future__ import annotations

import numpy as np

from agmarl_common.core.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState, Pod, pod_index, term_key
from agmarl_common.core.cluster.node_checks import (
    OK,
    FilterStatus,
    fits_gpu,
    fits_node_selector,
    fits_node_unschedulable,
    fits_resources,
    fits_resources_mask,
    fits_taints,
)
from agmarl_common.core.cluster.selectors import first_untolerated, label_value, term_matches, term_matches_pod
from agmarl_common.core.cluster.topology_checks import (
    _affinity_failures,
    _domains,
    _hard_constraints,
    _matching_counts,
    _node_affinity_mask,
    _remember,
    _spread_failures,
    fits_pod_affinity,
    fits_topology_spread,
    spread_counts,
)

__all__ = [
    "OK", "FilterStatus", "fits_gpu", "fits_node_selector", "fits_node_unschedulable", "fits_resources",
    "fits_resources_mask", "fits_taints", "fits_pod_affinity", "fits_topology_spread", "spread_counts",
    "filter_node", "feasible_mask", "feasible_nodes", "violations",
]


# ---------------------------------------------------------------------------------------------
# Whole filter


def filter_node(pod: Pod, state: ClusterState, i: int) -> FilterStatus:
    """Every check on node i in kube-scheduler's order; the first failure wins."""
    node = state.nodes[i]
    for status in (fits_node_unschedulable(pod, node), fits_taints(pod, node), fits_node_selector(pod, node)):
        if not status.ok:
            return status
    for check in (fits_resources, fits_topology_spread, fits_pod_affinity):
        status = check(pod, state, i)
        if not status.ok:
            return status
    return OK


def _tainted(state: ClusterState) -> np.ndarray:
    if state.tainted.shape[0] == state.n_nodes:
        return state.tainted
    return np.array([bool(n.taints) for n in state.nodes], dtype=bool)


def _refine(mask: np.ndarray, candidates: np.ndarray, ok) -> None:
    for i in candidates:
        if not ok(int(i)):
            mask[i] = False


def feasible_mask(pod: Pod, state: ClusterState) -> np.ndarray:
    """(n_nodes,) bool: ``filter_node(pod, state, i).ok`` for every node, computed in bulk."""
    nodes = state.nodes
    mask = fits_resources_mask(pod, state)
    if pod.tolerations:
        _refine(mask, np.flatnonzero(mask & ~state.schedulable),
                lambda i: fits_node_unschedulable(pod, nodes[i]).ok)
    else:
        mask &= state.schedulable
    tainted = _tainted(state)
    if tainted.any() and (mask & tainted).any():
        mask &= _remember(state, ("tolerated", pod.tolerations), lambda: np.array(
            [first_untolerated(nd.taints, pod.tolerations) is None for nd in nodes], dtype=bool))
    if pod.node_selector or pod.required_node_affinity:
        mask &= _node_affinity_mask(pod, state)
    if _hard_constraints(pod) and mask.any():
        mask &= _spread_failures(pod, state) == 0
    if mask.any():
        fail = _affinity_failures(pod, state)
        if fail is not None:
            mask &= fail == 0
    return mask


def feasible_nodes(pod: Pod, state: ClusterState) -> np.ndarray:
    """int64 indexes of the nodes that pass the hard filter, ascending."""
    return np.flatnonzero(feasible_mask(pod, state)).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Legality of a whole state


def _capacity_flags(state: ClusterState) -> np.ndarray:
    """(n,) bool: nodes for which ``_capacity_violations`` reports something."""
    bad = (state.cpu_used > state.cpu_cap) | (state.mem_used > state.mem_cap) | (state.pods_used > state.pods_cap)
    bad |= (state.eph_cap > 0) & (state.eph_used > state.eph_cap)
    gpu = (~state.gpu_exists() & (state.gpu_used != 0)) | (state.gpu_used > GPU_MILLI)
    return bad | gpu.any(axis=1)


def _capacity_violations(state: ClusterState, i: int) -> list[str]:
    name, out = state.nodes[i].name, []
    for what, used, cap, tracked in (("cpu", state.cpu_used, state.cpu_cap, True),
                                     ("memory", state.mem_used, state.mem_cap, True),
                                     ("ephemeral-storage", state.eph_used, state.eph_cap, state.eph_cap[i] > 0),
                                     ("pods", state.pods_used, state.pods_cap, True)):
        if tracked and used[i] > cap[i]:
            out.append(f"{name}: {what} used {int(used[i])} > capacity {int(cap[i])}")
    for j in range(MAX_GPUS):
        used = int(state.gpu_used[i, j])
        if j >= state.gpu_count[i] and used:
            out.append(f"{name}: gpu device {j} does not exist but has {used} milli used")
        elif used > GPU_MILLI:
            out.append(f"{name}: gpu device {j} used {used} > {GPU_MILLI} milli")
    return out


def _anti_suspects(state: ClusterState) -> np.ndarray:
    """(n,) bool: nodes holding a pod with a required anti-affinity term that some other pod in the
    term's domain matches, by the counts of the PodIndex; a pod on any other node violates none.

    One row per anti-affinity entry of the index (term and carrier labels), one pass per topology key."""
    idx = pod_index(state)
    rows: dict[str, tuple[list, list, list]] = {}  # topology key -> carriers, matching pods, carrier matches term
    matching: dict[tuple, np.ndarray] = {}
    for (ns, tkey, _), (term, labels, carriers) in idx.anti.items():
        if (ns, tkey) not in matching:
            matching[ns, tkey] = _matching_counts(state, (term,), ns)
        row = rows.setdefault(term.topology_key, ([], [], []))
        row[0].append(carriers)
        row[1].append(matching[ns, tkey])
        row[2].append(1 if term_matches(term, ns, ns, labels) else 0)
    suspects = np.zeros(state.n_nodes, dtype=bool)
    for key, (carriers, matched, self_match) in rows.items():
        cd, ids = _domains(state, key)
        width = len(ids) + 1  # the last column collects nodes without the key
        col = np.where(cd >= 0, cd, width - 1)
        m = np.array(matched)  # (entries, n)
        cells = (np.arange(m.shape[0])[:, None] * width + col[None, :]).ravel()
        per_domain = np.bincount(cells, weights=m.ravel(), minlength=m.shape[0] * width).reshape(-1, width)
        others = per_domain[:, col] - np.array(self_match)[:, None]  # matching pods in the domain, but the carrier
        suspects |= ((np.array(carriers) > 0) & (others > 0)).any(axis=0) & (cd >= 0)
    return suspects


def _anti_violations(state: ClusterState, i: int, p: Pod, memo: dict) -> list[str]:
    """Pods other than ``p`` (on node i) in one of its required anti-affinity domains that match the term."""
    node, out = state.nodes[i], []
    for term in p.pod_anti_affinity:
        cd, _ = _domains(state, term.topology_key)
        if cd[i] < 0:
            continue
        key = (p.namespace, term_key(term))
        if key not in memo:
            memo[key] = _matching_counts(state, (term,), p.namespace)
        mine = label_value(node, term.topology_key)
        for j in np.flatnonzero((cd == cd[i]) & (memo[key] > 0)).tolist():
            for q in state.bound[j]:
                if q.key != p.key and term_matches_pod(term, p.namespace, q):
                    out.append(f"{p.key} on {node.name}: anti-affinity ({term.topology_key}={mine}) "
                               f"violated by {q.key} on {state.nodes[j].name}")
    return out


def _pod_violations(state: ClusterState, i: int, p: Pod, anti: bool, memo: dict) -> list[str]:
    node, out = state.nodes[i], []
    where = f"{p.key} on {node.name}"
    if p.num_gpu and p.gpu_spec and state.gpu_model[i] not in p.gpu_spec:
        out.append(f"{where}: gpu model {state.gpu_model[i]!r} not in gpu_spec {list(p.gpu_spec)}")
    checks = ((fits_node_selector,) if p.node_selector or p.required_node_affinity else ()) + (
        (fits_taints,) if node.taints else ())  # without selector or taints these checks pass
    for check in checks:
        status = check(p, node)
        if not status.ok:
            out.append(f"{where}: {status.plugin}: {status.reason}")
    if anti and p.pod_anti_affinity:
        out.extend(_anti_violations(state, i, p, memo))
    return out


def violations(state: ClusterState) -> list[str]:
    """Re-check every bound pod against its node: capacity (cpu, memory, tracked ephemeral storage,
    pod count, GPU devices), gpu_spec, nodeSelector/required node affinity, NoSchedule/NoExecute
    taints, and required anti-affinity. [] when the state is legal.

    Not re-checked, as Kubernetes ignores them during execution: cordons, required pod affinity
    and topology spread (they depend on pods that may have left since the bind).
    """
    out: list[str] = []
    capacity = _capacity_flags(state)
    suspects = _anti_suspects(state).tolist()
    memo: dict = {}  # (namespace, term key) -> pods matching the term per node
    for i in range(state.n_nodes):
        if capacity[i]:
            out.extend(_capacity_violations(state, i))
        anti, tainted = suspects[i], bool(state.nodes[i].taints)
        for p in state.bound[i]:
            if anti or tainted or (p.num_gpu and p.gpu_spec) or p.node_selector or p.required_node_affinity:
                out.extend(_pod_violations(state, i, p, anti, memo))
    return out
