"""Hard-filter checks between pods, as whole-cluster arrays (which node fails, and why):
PodTopologySpread (DoNotSchedule) and InterPodAffinity (required terms), with the bulk views they
share (topology domains of the nodes, bound pods matching terms, from the state's ``PodIndex``).
Import these through ``agmarl_common.core.cluster.filters``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod, PodAffinityTerm, labels_key, pod_index
from agmarl_common.core.cluster.node_checks import OK, FilterStatus, _fail
from agmarl_common.core.cluster.selectors import (
    label_value,
    matches_label_selector,
    pod_matches_node_affinity,
    term_matches,
    term_matches_pod,
)

_MAX_INT = 2**31 - 1  # kube-scheduler's initial critical-path count (math.MaxInt32)


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
