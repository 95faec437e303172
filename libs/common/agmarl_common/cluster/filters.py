"""The hard filter, with kube-scheduler's Filter semantics. One implementation for every caller.

``filter_node`` runs the checks in kube-scheduler's default order (NodeUnschedulable,
TaintToleration, NodeAffinity, NodeResourcesFit incl. GPUs, PodTopologySpread, InterPodAffinity)
and returns the first failure. ``feasible_mask`` computes the same answer for every node at once.
The pod-to-pod checks (spread, affinity) are written once, as whole-cluster arrays (which node
fails, and why) that both use: ``filter_node`` reads one entry, ``feasible_mask`` all of them.

They never scan every bound pod: the state's ``PodIndex`` (model.py, kept current by bind/unbind)
counts bound pods per node by label set and by required anti-affinity term, so a term costs one
selector match per label set that could match, then a few numpy operations over nodes. Topology
domains and node-affinity masks are derived once per ``nodes`` tuple (``_remember``). Results
depend only on the arguments: what is memoised is derived from them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from agmarl_common.cluster.model import (
    GPU_MILLI,
    MAX_GPUS,
    ClusterState,
    Node,
    Pod,
    PodAffinityTerm,
    Taint,
    choose_gpus,
    labels_key,
    pod_index,
    term_key,
)
from agmarl_common.cluster.selectors import (
    NO_EXECUTE,
    NO_SCHEDULE,
    TAINT_NOT_READY,
    TAINT_UNSCHEDULABLE,
    first_untolerated,
    is_tolerated,
    label_value,
    matches_label_selector,
    pod_matches_node_affinity,
    term_matches,
    term_matches_pod,
)

_MAX_INT = 2**31 - 1  # kube-scheduler's initial critical-path count (math.MaxInt32)


@dataclass(frozen=True)
class FilterStatus:
    ok: bool
    plugin: str = ""
    reason: str = ""


OK = FilterStatus(True)


def _fail(plugin: str, reason: str) -> FilterStatus:
    return FilterStatus(False, plugin, reason)


# ---------------------------------------------------------------------------------------------
# Node-only checks


def fits_node_unschedulable(pod: Pod, node: Node) -> FilterStatus:
    """Cordoned nodes need a toleration of ``node.kubernetes.io/unschedulable:NoSchedule``; not-ready
    nodes carry ``node.kubernetes.io/not-ready`` with NoSchedule and NoExecute, both must be tolerated."""
    if node.unschedulable and not is_tolerated(pod.tolerations, Taint(TAINT_UNSCHEDULABLE, "", NO_SCHEDULE)):
        return _fail("NodeUnschedulable", "node(s) were unschedulable")
    if not node.ready:
        for effect in (NO_SCHEDULE, NO_EXECUTE):
            if not is_tolerated(pod.tolerations, Taint(TAINT_NOT_READY, "", effect)):
                return _fail("NodeUnschedulable", "node(s) were not ready")
    return OK


def fits_taints(pod: Pod, node: Node) -> FilterStatus:
    """TaintToleration: an untolerated NoSchedule or NoExecute taint fails; PreferNoSchedule does not."""
    taint = first_untolerated(node.taints, pod.tolerations)
    if taint is not None:
        return _fail("TaintToleration", f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}")
    return OK


def fits_node_selector(pod: Pod, node: Node) -> FilterStatus:
    """NodeAffinity: spec.nodeSelector AND required node affinity (terms ORed)."""
    if not pod_matches_node_affinity(pod, node):
        return _fail("NodeAffinity", "node(s) didn't match Pod's node affinity/selector")
    return OK


# ---------------------------------------------------------------------------------------------
# Resources


def _gpu_free_row(state: ClusterState, i: int) -> np.ndarray:
    exists = np.arange(MAX_GPUS) < state.gpu_count[i]
    return np.where(exists, GPU_MILLI - state.gpu_used[i], 0)


def fits_gpu(pod: Pod, state: ClusterState, i: int) -> FilterStatus:
    """GPU model (``gpu_spec``), then devices: a share needs one device with that much free milli,
    whole GPUs need ``num_gpu`` fully free devices (exactly when ``choose_gpus`` finds devices)."""
    if pod.num_gpu == 0:
        return OK
    if pod.gpu_spec and state.gpu_model[i] not in pod.gpu_spec:
        return _fail("NodeResourcesFit", "node(s) didn't match Pod's gpu_spec")
    if choose_gpus(pod, _gpu_free_row(state, i)) is None:
        return _fail("NodeResourcesFit", "Insufficient nvidia.com/gpu")
    return OK


def fits_resources(pod: Pod, state: ClusterState, i: int) -> FilterStatus:
    """NodeResourcesFit: pod count, then cpu, memory, ephemeral storage (only on nodes that track it),
    then GPUs. A zero request always fits that resource, as in kube-scheduler."""
    if state.pods_used[i] + 1 > state.pods_cap[i]:
        return _fail("NodeResourcesFit", "Too many pods")
    if pod.cpu_milli > 0 and pod.cpu_milli > state.cpu_cap[i] - state.cpu_used[i]:
        return _fail("NodeResourcesFit", "Insufficient cpu")
    if pod.memory_mib > 0 and pod.memory_mib > state.mem_cap[i] - state.mem_used[i]:
        return _fail("NodeResourcesFit", "Insufficient memory")
    if pod.ephemeral_mib > 0 and state.eph_cap[i] > 0 and pod.ephemeral_mib > state.eph_cap[i] - state.eph_used[i]:
        return _fail("NodeResourcesFit", "Insufficient ephemeral-storage")
    return fits_gpu(pod, state, i)


# Row k: the (n, MAX_GPUS) bool "device exists" row of a node with k GPUs, as one uint64 of 0/1 bytes.
_EXISTS_BYTES = (np.arange(MAX_GPUS + 1)[:, None] > np.arange(MAX_GPUS)[None, :])
_EXISTS_U64 = _EXISTS_BYTES.view(np.uint64).ravel() if MAX_GPUS == 8 else None


def _devices_at_most(state: ClusterState, limit: int) -> np.ndarray:
    """(n,) number of existing GPU devices with at most ``limit`` milli used.

    With 8 device slots a node's row of bools is one uint64, so the per-row count is a popcount:
    ~10x faster than a numpy reduction over an axis of length 8."""
    counts = np.minimum(state.gpu_count, MAX_GPUS)
    if _EXISTS_U64 is not None:
        rows = np.ascontiguousarray(state.gpu_used <= limit).view(np.uint64).ravel()
        return np.bitwise_count(rows & _EXISTS_U64[counts]).astype(np.int64)
    return ((state.gpu_used <= limit) & _EXISTS_BYTES[counts]).sum(axis=1)


def _resource_mask(pod: Pod, state: ClusterState) -> np.ndarray:
    mask = state.pods_used + 1 <= state.pods_cap
    if pod.cpu_milli > 0:
        mask &= state.cpu_cap - state.cpu_used >= pod.cpu_milli
    if pod.memory_mib > 0:
        mask &= state.mem_cap - state.mem_used >= pod.memory_mib
    if pod.ephemeral_mib > 0:
        mask &= (state.eph_cap == 0) | (state.eph_cap - state.eph_used >= pod.ephemeral_mib)
    if pod.num_gpu == 0:
        return mask
    limit = GPU_MILLI - pod.gpu_milli if pod.is_gpu_share else 0  # most a device may already use
    need = 1 if pod.is_gpu_share else pod.num_gpu
    mask &= _devices_at_most(state, limit) >= need
    if pod.gpu_spec:
        spec = np.zeros(state.n_nodes, dtype=bool)
        for model in pod.gpu_spec:
            spec |= state.gpu_model == model
        mask &= spec
    return mask


# ---------------------------------------------------------------------------------------------
# Bulk views: topology domains of the nodes, and bound pods matching terms (from the PodIndex)

_CACHE_LIMIT = 4096  # entries of derived node data kept per nodes tuple


def _remember(state: ClusterState, key: tuple, compute):
    """``compute()``, memoised in the state's per-nodes cache (derived data: results never depend on it)."""
    cache = pod_index(state).node_cache
    try:
        return cache[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable selector (e.g. lists from a hand-built pod): compute every time
        return compute()
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    value = cache[key] = compute()
    for array in value if isinstance(value, tuple) else (value,):
        if isinstance(array, np.ndarray):
            array.flags.writeable = False  # shared by every later call: nobody may change it
    return value


def _domains(state: ClusterState, key: str) -> tuple[np.ndarray, dict[str, int]]:
    """(n,) int64 domain of every node for topology ``key`` (-1 = no such label), and value -> domain."""
    def compute():
        ids: dict[str, int] = {}
        values = [label_value(nd, key) for nd in state.nodes]
        codes = np.array([-1 if v is None else ids.setdefault(v, len(ids)) for v in values], dtype=np.int64)
        return codes, ids
    return _remember(state, ("domains", key), compute)


def _node_affinity_mask(pod: Pod, state: ClusterState) -> np.ndarray:
    """(n,) bool: ``pod_matches_node_affinity`` on every node (read-only array)."""
    if not pod.node_selector and not pod.required_node_affinity:
        return np.ones(state.n_nodes, dtype=bool)
    return _remember(state, ("node_affinity", labels_key(pod.node_selector), pod.required_node_affinity),
                     lambda: np.array([pod_matches_node_affinity(pod, nd) for nd in state.nodes], dtype=bool))


def _matching_counts(state: ClusterState, terms: tuple[PodAffinityTerm, ...], owner_ns: str) -> np.ndarray:
    """(n,) bound pods per node matching every one of ``terms`` (owned by a pod in ``owner_ns``)."""
    idx = pod_index(state)
    candidates = None  # groups holding a matchLabels pair that every match must carry: the fewest found
    for t in terms:
        for pair in t.label_selector.match_labels.items():
            bucket = idx.group_pairs.get(pair, frozenset())
            if candidates is None or len(bucket) < len(candidates):
                candidates = bucket
    total = None
    for gk in idx.groups if candidates is None else candidates:
        labels, counts = idx.groups[gk]
        if all(term_matches(t, owner_ns, gk[0], labels) for t in terms):
            total = counts if total is None else total + counts
    return np.zeros(state.n_nodes, dtype=np.int64) if total is None else total  # read-only when one group matched


def _hit_domains(codes: np.ndarray, counts: np.ndarray, n_domains: int) -> np.ndarray:
    """(n_domains + 1,) bool: domains holding a counted pod; the extra last entry (False) is where code -1 reads."""
    has = codes >= 0
    per = np.bincount(codes[has], weights=counts[has], minlength=n_domains)
    return np.append(per > 0, False)


# ---------------------------------------------------------------------------------------------
# PodTopologySpread (DoNotSchedule)

_SPREAD_REASONS = ("", "node(s) didn't match pod topology spread constraints (missing required label)",
                   "node(s) didn't match pod topology spread constraints")


def _hard_constraints(pod: Pod) -> tuple:
    return tuple(c for c in pod.topology_spread if c.when_unsatisfiable == "DoNotSchedule")


def _spread_domain_counts(pod: Pod, state: ClusterState, constraints: tuple) -> list[tuple[np.ndarray, ...]]:
    """Per constraint: (node domains, matching pods per domain, domain is eligible), over eligible nodes:
    nodes that pass the pod's nodeSelector/required affinity and carry every constraint's topology key.
    Matching pods: same namespace as the pod, labels matching the constraint's selector."""
    codes = [_domains(state, c.topology_key)[0] for c in constraints]
    eligible = _node_affinity_mask(pod, state).copy()
    for cd in codes:
        eligible &= cd >= 0
    out = []
    for c, cd in zip(constraints, codes):
        n_domains = len(_domains(state, c.topology_key)[1])
        matching = _matching_counts(state, (PodAffinityTerm(c.label_selector, c.topology_key),), pod.namespace)
        where = cd[eligible]
        counts = np.bincount(where, weights=matching[eligible], minlength=n_domains).astype(np.int64)
        out.append((cd, counts, np.bincount(where, minlength=n_domains) > 0))
    return out


def spread_counts(pod: Pod, state: ClusterState, constraints: tuple) -> tuple[Counter, ...]:
    """Matching pods per domain of each constraint, over eligible nodes (see ``_spread_domain_counts``).
    Every eligible domain is present (possibly with 0)."""
    out = []
    for c, (_, counts, eligible) in zip(constraints, _spread_domain_counts(pod, state, constraints)):
        ids = _domains(state, c.topology_key)[1]
        out.append(Counter({v: int(counts[d]) for v, d in ids.items() if eligible[d]}))
    return tuple(out)


def _spread_failures(pod: Pod, state: ClusterState) -> np.ndarray | None:
    """(n,) int8 index into ``_SPREAD_REASONS`` of each node's first failing constraint (0 = fits);
    None when the pod has no DoNotSchedule constraint."""
    constraints = _hard_constraints(pod)
    if not constraints:
        return None
    fail = np.zeros(state.n_nodes, dtype=np.int8)
    per = _spread_domain_counts(pod, state, constraints)
    for c, (cd, counts, eligible) in reversed(list(zip(constraints, per))):  # the first failure wins
        n_eligible = int(eligible.sum())
        if n_eligible < c.min_domains:
            low = 0
        else:
            low = int(counts[eligible].min()) if n_eligible else _MAX_INT
        self_match = 1 if matches_label_selector(c.label_selector, pod.labels) else 0
        skew = np.append(counts, 0)[cd] + self_match - low > c.max_skew
        this = np.where(cd < 0, 1, np.where(skew, 2, 0))
        fail = np.where(this > 0, this, fail).astype(np.int8)
    return fail


def fits_topology_spread(pod: Pod, state: ClusterState, i: int) -> FilterStatus:
    """PodTopologySpread with whenUnsatisfiable=DoNotSchedule: matching + self - global min <= maxSkew."""
    fail = _spread_failures(pod, state)
    if fail is None or fail[i] == 0:
        return OK
    return _fail("PodTopologySpread", _SPREAD_REASONS[fail[i]])


# ---------------------------------------------------------------------------------------------
# InterPodAffinity (required terms)

_AFFINITY_REASONS = ("", "node(s) didn't match pod affinity rules", "node(s) didn't match pod anti-affinity rules",
                     "node(s) didn't satisfy existing pods anti-affinity rules")


def _existing_anti(pod: Pod, state: ClusterState) -> np.ndarray | None:
    """(n,) bool: nodes in a domain where a bound pod's required anti-affinity term matches ``pod``;
    None when there is none."""
    idx = pod_index(state)
    if not idx.anti:
        return None
    keys = set(idx.anti_pairs.get(None, ()))
    for pair in pod.labels.items():
        keys.update(idx.anti_pairs.get(pair, ()))
    per_key: dict[str, np.ndarray] = {}
    for ak in keys:
        term, _, counts = idx.anti[ak]
        if term_matches(term, ak[0], pod.namespace, pod.labels):
            k = term.topology_key
            per_key[k] = per_key[k] + counts if k in per_key else counts
    if not per_key:
        return None
    bad = np.zeros(state.n_nodes, dtype=bool)
    for key, counts in per_key.items():
        cd, ids = _domains(state, key)
        bad |= _hit_domains(cd, counts, len(ids))[cd]
    return bad if bad.any() else None


def _affinity_failures(pod: Pod, state: ClusterState) -> np.ndarray | None:
    """(n,) int8 index into ``_AFFINITY_REASONS`` (0 = fits; affinity, then the pod's anti-affinity, then
    existing pods' anti-affinity); None when nothing can fail."""
    existing = _existing_anti(pod, state)
    if not pod.pod_affinity and not pod.pod_anti_affinity and existing is None:
        return None
    fail = np.zeros(state.n_nodes, dtype=np.int8)
    if existing is not None:
        fail[existing] = 3
    for t in pod.pod_anti_affinity:
        cd, ids = _domains(state, t.topology_key)
        fail[_hit_domains(cd, _matching_counts(state, (t,), pod.namespace), len(ids))[cd]] = 2
    if pod.pod_affinity:
        matching = _matching_counts(state, pod.pod_affinity, pod.namespace)  # pods matching ALL terms
        missing = np.zeros(state.n_nodes, dtype=bool)
        exist = np.ones(state.n_nodes, dtype=bool)
        any_match = False
        for t in pod.pod_affinity:
            cd, ids = _domains(state, t.topology_key)
            hit = _hit_domains(cd, matching, len(ids))
            any_match = any_match or bool(hit.any())
            missing |= cd < 0
            exist &= hit[cd]
        # the first pod of a self-affine group may go anywhere that has the topology keys
        self_match = all(term_matches_pod(t, pod.namespace, pod) for t in pod.pod_affinity)
        fail[missing | (~exist & (any_match or not self_match))] = 1
    return fail


def fits_pod_affinity(pod: Pod, state: ClusterState, i: int) -> FilterStatus:
    """InterPodAffinity filter: the pod's required affinity and anti-affinity, and existing pods'
    required anti-affinity against this pod, each per topology domain."""
    fail = _affinity_failures(pod, state)
    if fail is None or fail[i] == 0:
        return OK
    return _fail("InterPodAffinity", _AFFINITY_REASONS[fail[i]])


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
    mask = _resource_mask(pod, state)
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
