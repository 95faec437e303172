"""Index of bound pods by labels and by required anti-affinity term, for the hard filter.

``ClusterState`` (state.py) carries a ``PodIndex`` that bind/unbind keep current; ``state.pod_index``
returns it, rebuilding it on demand. This module knows nodes and pods only, not the state. Import these
through ``agmarl_common.core.cluster.model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from agmarl_common.core.cluster.specs import LS_QOS, Node, Pod, PodAffinityTerm


def labels_key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def term_key(term: PodAffinityTerm) -> tuple:
    """A hashable key equal for equal terms (selectors hold dicts, so terms themselves do not hash)."""
    sel = term.label_selector
    return labels_key(sel.match_labels), sel.match_expressions, term.topology_key, term.namespaces


def _with(mapping: Mapping, key: Any, value: Any) -> dict:
    out = dict(mapping)
    if value is None:
        out.pop(key, None)
    else:
        out[key] = value
    return out


def _bucket(buckets: Mapping, pair: Any, key: Any, add: bool) -> Mapping:
    """``buckets`` with ``key`` added to / removed from the set under ``pair``."""
    old = buckets.get(pair, frozenset())
    new = old | {key} if add else old - {key}
    return _with(buckets, pair, new or None)


def _anti_pair(term: PodAffinityTerm) -> tuple[str, str] | None:
    """A label pair every pod matching ``term`` carries (its first matchLabels pair), None when it has none."""
    items = labels_key(term.label_selector.match_labels)
    return items[0] if items else None


@dataclass(frozen=True, eq=False)
class PodIndex:
    """Bound pods summarised so that the hard filter need not scan them all (derived from ``bound``).

    - ``groups``: (namespace, sorted label items) -> (labels, (n,) bound pods with exactly those labels per node);
    - ``group_pairs``: label (key, value) -> keys of the groups whose labels hold that pair;
    - ``anti``: (owner namespace, ``term_key``, owner label items) -> (term, owner labels, (n,) bound pods per
      node with those labels carrying that required anti-affinity term);
    - ``anti_pairs``: ``_anti_pair(term)`` (a pair every matching pod carries; None when the selector has no
      matchLabels) -> keys of ``anti``;
    - ``zero_cpu`` / ``zero_mem``: (n,) bound pods per node without a cpu / memory request;
    - ``ls``: (n,) bound latency-sensitive pods (QoS ``LS_QOS``) per node (the reward's SLA term reads it);
    - ``node_cache``: derived data of ``nodes`` (topology domains, node-affinity masks) that the hard filter
      fills lazily; shared by the indexes of every state with the same ``nodes`` tuple.
    ``bound`` and ``nodes`` are the very tuples of the state described: ``pod_index`` rebuilds on mismatch.
    Count arrays are never modified after construction; groups and terms with no pod left are dropped.
    """

    bound: tuple
    nodes: tuple
    groups: Mapping[tuple, tuple[Mapping[str, str], np.ndarray]]
    group_pairs: Mapping[tuple[str, str], frozenset]
    anti: Mapping[tuple, tuple[PodAffinityTerm, Mapping[str, str], np.ndarray]]
    anti_pairs: Mapping[tuple[str, str] | None, frozenset]
    zero_cpu: np.ndarray
    zero_mem: np.ndarray
    ls: np.ndarray
    node_cache: dict = field(default_factory=dict, compare=False)

    @staticmethod
    def build(nodes: tuple[Node, ...], bound: tuple[tuple[Pod, ...], ...]) -> "PodIndex":
        """The index of ``bound`` from scratch, in one pass over the pods."""
        n = len(bound)
        where: dict[tuple, list[int]] = {}  # group or anti key -> node of each pod
        first: dict[tuple, tuple] = {}  # key -> what the index stores next to the counts
        zero_cpu, zero_mem, ls = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i, pods in enumerate(bound):
            for p in pods:
                items = labels_key(p.labels)
                gk = (p.namespace, items)
                if gk not in where:
                    where[gk], first[gk] = [], (p.labels,)
                where[gk].append(i)
                for term in p.pod_anti_affinity:
                    ak = ("anti", p.namespace, term_key(term), items)
                    if ak not in where:
                        where[ak], first[ak] = [], (term, p.labels)
                    where[ak].append(i)
                zero_cpu[i] += p.cpu_milli == 0
                zero_mem[i] += p.memory_mib == 0
                ls[i] += p.qos == LS_QOS
        zero_cpu.flags.writeable = zero_mem.flags.writeable = ls.flags.writeable = False
        groups, anti = {}, {}
        for key, nodes_of in where.items():
            counts = np.bincount(np.array(nodes_of, dtype=np.int64), minlength=n)
            counts.flags.writeable = False
            if key[0] == "anti":
                anti[key[1:]] = first[key] + (counts,)
            else:
                groups[key] = first[key] + (counts,)
        group_pairs: dict[tuple[str, str], set] = {}
        for gk in groups:
            for pair in gk[1]:
                group_pairs.setdefault(pair, set()).add(gk)
        anti_pairs: dict[tuple[str, str] | None, set] = {}
        for ak, (term, _, _) in anti.items():
            anti_pairs.setdefault(_anti_pair(term), set()).add(ak)
        return PodIndex(bound, nodes, groups, {k: frozenset(v) for k, v in group_pairs.items()}, anti,
                        {k: frozenset(v) for k, v in anti_pairs.items()}, zero_cpu, zero_mem, ls)

    def add(self, i: int, pod: Pod, bound: tuple, nodes: tuple) -> "PodIndex":
        """The index of ``bound`` = this index's bound plus ``pod`` on node i."""
        return self._change(i, pod, bound, nodes, +1)

    def remove(self, i: int, pod: Pod, bound: tuple, nodes: tuple) -> "PodIndex":
        """The index of ``bound`` = this index's bound less ``pod`` on node i."""
        return self._change(i, pod, bound, nodes, -1)

    def _change(self, i: int, pod: Pod, bound: tuple, nodes: tuple, delta: int) -> "PodIndex":
        n = len(bound)
        items = labels_key(pod.labels)
        gk = (pod.namespace, items)
        labels, counts = self.groups.get(gk, (pod.labels, None))
        counts = _bumped(counts, n, i, delta)
        groups, group_pairs = _with(self.groups, gk, (labels, counts) if counts is not None else None), self.group_pairs
        if (gk in self.groups) != (counts is not None):  # a group appeared or vanished
            for pair in gk[1]:
                group_pairs = _bucket(group_pairs, pair, gk, counts is not None)
        anti, anti_pairs = self.anti, self.anti_pairs
        for term in pod.pod_anti_affinity:
            ak = (pod.namespace, term_key(term), items)
            had = ak in anti
            term_, labels, counts = anti[ak] if had else (term, pod.labels, None)
            counts = _bumped(counts, n, i, delta)
            anti = _with(anti, ak, (term_, labels, counts) if counts is not None else None)
            if had != (counts is not None):
                anti_pairs = _bucket(anti_pairs, _anti_pair(term), ak, counts is not None)
        zero_cpu, zero_mem = self.zero_cpu, self.zero_mem
        if pod.cpu_milli == 0:
            zero_cpu = _bumped(zero_cpu, n, i, delta, keep_zero=True)
        if pod.memory_mib == 0:
            zero_mem = _bumped(zero_mem, n, i, delta, keep_zero=True)
        ls = _bumped(self.ls, n, i, delta, keep_zero=True) if pod.qos == LS_QOS else self.ls
        cache = self.node_cache if nodes is self.nodes else {}
        return PodIndex(bound, nodes, groups, group_pairs, anti, anti_pairs, zero_cpu, zero_mem, ls, cache)


def _bumped(counts: np.ndarray | None, n: int, i: int, delta: int, keep_zero: bool = False) -> np.ndarray | None:
    """A copy of ``counts`` (zeros when None) with ``delta`` added at i; None when nothing is left."""
    out = np.zeros(n, np.int64) if counts is None else counts.copy()
    out[i] += delta
    out.flags.writeable = False  # shared by later indexes
    return out if keep_zero or out.any() else None
