"""The shared cluster model: plain, immutable data for nodes, pods and cluster usage.

Everything that reasons about a cluster (hard filter, scorers, simulator, graph features,
reward) works on these types. No I/O, no clocks, no randomness in here.

GPU semantics follow the Alibaba openb trace and the FGD paper (USENIX ATC'23):
- a node has ``gpu_count`` physical GPUs of one ``gpu_model``; each device has 1000 milli;
- a pod asks ``num_gpu`` GPUs and ``gpu_milli`` per GPU: ``num_gpu == 1`` with
  ``gpu_milli < 1000`` is a fractional share of one device; ``num_gpu >= 1`` with
  ``gpu_milli == 1000`` takes whole devices; ``num_gpu == 0`` asks for no GPU;
- ``gpu_spec`` lists the GPU models a pod may run on (empty = any).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

GPU_MILLI = 1000
MAX_GPUS = 8
ZONE_LABEL = "topology.kubernetes.io/zone"
RACK_LABEL = "topology.agmarl.io/rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_SCHEDULER = "default-scheduler"
AGMARL_SCHEDULER = "agmarl-scheduler"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty key with operator Exists tolerates everything
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty = every effect


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """A node-selector or label-selector requirement (matchExpressions entry)."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Requirements ANDed together; the terms of a node affinity are ORed."""

    match_expressions: tuple[LabelRequirement, ...] = ()
    match_fields: tuple[LabelRequirement, ...] = ()  # only metadata.name is supported


@dataclass(frozen=True, slots=True)
class PreferredSchedulingTerm:
    weight: int
    preference: NodeSelectorTerm


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[LabelRequirement, ...] = ()


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    label_selector: LabelSelector
    topology_key: str
    namespaces: tuple[str, ...] = ()  # empty = the pod's own namespace


@dataclass(frozen=True, slots=True)
class WeightedPodAffinityTerm:
    weight: int
    term: PodAffinityTerm


@dataclass(frozen=True, slots=True)
class TopologySpreadConstraint:
    max_skew: int
    topology_key: str
    when_unsatisfiable: str = "DoNotSchedule"  # DoNotSchedule | ScheduleAnyway
    label_selector: LabelSelector = field(default_factory=LabelSelector)
    min_domains: int = 1


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_model: str = ""
    max_pods: int = 110
    ephemeral_mib: int = 0  # 0 = not tracked
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True

    @property
    def zone(self) -> str:
        return self.labels.get(ZONE_LABEL, "")

    @property
    def rack(self) -> str:
        return self.labels.get(RACK_LABEL, "")


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    cpu_milli: int
    memory_mib: int
    namespace: str = "default"
    uid: str = ""
    num_gpu: int = 0
    gpu_milli: int = 0  # per GPU; 1..999 = a share of one device, 1000 = whole devices
    gpu_spec: tuple[str, ...] = ()  # allowed GPU models, empty = any
    ephemeral_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_node_affinity: tuple[NodeSelectorTerm, ...] = ()
    preferred_node_affinity: tuple[PreferredSchedulingTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_pod_affinity: tuple[WeightedPodAffinityTerm, ...] = ()
    preferred_pod_anti_affinity: tuple[WeightedPodAffinityTerm, ...] = ()
    topology_spread: tuple[TopologySpreadConstraint, ...] = ()
    qos: str = ""  # LS | BE | Burstable | Guaranteed (openb) or the Kubernetes QoS class
    priority: int = 0
    scheduler_name: str = DEFAULT_SCHEDULER
    service: str = ""  # logical service / job the pod belongs to (pod->pod edges)
    creation_time: float = 0.0
    duration: float = 0.0  # seconds the pod runs once bound; 0 = forever
    node_name: str = ""  # set once bound
    gpu_devices: tuple[int, ...] = ()  # device indexes on node_name, set once bound

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def is_gpu_share(self) -> bool:
        return self.num_gpu == 1 and 0 < self.gpu_milli < GPU_MILLI

    @property
    def has_pod_affinity(self) -> bool:
        """Any pod affinity or anti-affinity term, required or preferred."""
        return bool(self.pod_affinity or self.pod_anti_affinity or self.preferred_pod_affinity
                    or self.preferred_pod_anti_affinity)


@dataclass(frozen=True)
class ClusterState:
    """Nodes, what is bound to them, and what that uses.

    Arrays are indexed by node position in ``nodes``. ``gpu_used`` is (n_nodes, MAX_GPUS) milli
    used per device; a device j exists on node i iff j < nodes[i].gpu_count.
    Treat instances as immutable: ``bind`` / ``unbind`` return new states.
    """

    nodes: tuple[Node, ...]
    cpu_used: np.ndarray  # (n,) int64 milli
    mem_used: np.ndarray  # (n,) int64 MiB
    pods_used: np.ndarray  # (n,) int64
    eph_used: np.ndarray  # (n,) int64 MiB
    gpu_used: np.ndarray  # (n, MAX_GPUS) int64 milli per device
    bound: tuple[tuple[Pod, ...], ...]  # pods on each node
    index: Mapping[str, int] = field(default_factory=dict)
    # static capacity arrays, filled by ``empty`` from ``nodes`` (kept by ``replace``)
    cpu_cap: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mem_cap: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pods_cap: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    eph_cap: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gpu_count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gpu_model: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    schedulable: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # ready and not cordoned
    # measured load (for load-aware policies); None = use requests
    cpu_load: np.ndarray | None = None  # (n,) milli actually used
    mem_load: np.ndarray | None = None  # (n,) MiB actually used
    # derived indexes that let the hard filter skip work (filled by ``empty``, kept by bind/unbind)
    tainted: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # (n,) node has any taint
    affinity_pods: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (n,) bound pods with has_pod_affinity
    # bound pods grouped by labels and anti-affinity terms (see ``PodIndex``); kept by bind/unbind/unbind_at,
    # rebuilt by ``pod_index`` when absent or stale (a state made with ``replace(bound=...)``)
    pods_by_label: "PodIndex | None" = field(default=None, compare=False, repr=False)

    @staticmethod
    def empty(nodes: tuple[Node, ...] | list[Node]) -> "ClusterState":
        nodes = tuple(nodes)
        n = len(nodes)
        z = np.zeros(n, dtype=np.int64)
        bound: tuple[tuple[Pod, ...], ...] = tuple(() for _ in range(n))
        return ClusterState(
            nodes=nodes,
            cpu_used=z.copy(),
            mem_used=z.copy(),
            pods_used=z.copy(),
            eph_used=z.copy(),
            gpu_used=np.zeros((n, MAX_GPUS), dtype=np.int64),
            bound=bound,
            index={node.name: i for i, node in enumerate(nodes)},
            cpu_cap=np.array([nd.cpu_milli for nd in nodes], dtype=np.int64),
            mem_cap=np.array([nd.memory_mib for nd in nodes], dtype=np.int64),
            pods_cap=np.array([nd.max_pods for nd in nodes], dtype=np.int64),
            eph_cap=np.array([nd.ephemeral_mib for nd in nodes], dtype=np.int64),
            gpu_count=np.array([nd.gpu_count for nd in nodes], dtype=np.int64),
            gpu_model=np.array([nd.gpu_model for nd in nodes], dtype=object),
            schedulable=np.array([nd.ready and not nd.unschedulable for nd in nodes], dtype=bool),
            tainted=np.array([bool(nd.taints) for nd in nodes], dtype=bool),
            affinity_pods=z.copy(),
            pods_by_label=PodIndex.build(nodes, bound),
        )

    def with_nodes(self, nodes: tuple[Node, ...] | list[Node]) -> "ClusterState":
        """Same bound pods (matched by node name), new node specs; pods on vanished nodes are dropped."""
        fresh = ClusterState.empty(nodes)
        state = fresh
        for pods in self.bound:
            for p in pods:
                if p.node_name in fresh.index:
                    state = bind(state, p, fresh.index[p.node_name], p.gpu_devices)
        return state

    def node_index(self, name: str) -> int:
        return self.index[name]

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    def gpu_exists(self) -> np.ndarray:
        """(n, MAX_GPUS) bool: which device slots are real GPUs."""
        return np.arange(MAX_GPUS)[None, :] < self.gpu_count[:, None]

    def gpu_free(self) -> np.ndarray:
        """(n, MAX_GPUS) milli free per device (0 for slots that are not GPUs)."""
        return np.where(self.gpu_exists(), GPU_MILLI - self.gpu_used, 0)

    def all_pods(self) -> list[Pod]:
        return [p for pods in self.bound for p in pods]


def choose_gpus(pod: Pod, gpu_free_row: np.ndarray) -> tuple[int, ...] | None:
    """Default device choice on one node: best fit for a share, lowest free devices for whole GPUs.

    Returns device indexes, () for a pod without GPUs, or None when the node cannot host it.
    """
    if pod.num_gpu == 0:
        return ()
    if pod.is_gpu_share:
        ok = np.nonzero(gpu_free_row >= pod.gpu_milli)[0]
        if ok.size == 0:
            return None
        # tightest device that fits; ties -> lowest index
        best = ok[np.argmin(gpu_free_row[ok])]
        return (int(best),)
    whole = np.nonzero(gpu_free_row >= GPU_MILLI)[0]
    if whole.size < pod.num_gpu:
        return None
    return tuple(int(j) for j in whole[: pod.num_gpu])


# ---------------------------------------------------------------------------------------------
# Index of bound pods by labels and by required anti-affinity term, for the hard filter


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
    node_cache: dict = field(default_factory=dict, compare=False)

    @staticmethod
    def build(nodes: tuple[Node, ...], bound: tuple[tuple[Pod, ...], ...]) -> "PodIndex":
        """The index of ``bound`` from scratch, in one pass over the pods."""
        n = len(bound)
        where: dict[tuple, list[int]] = {}  # group or anti key -> node of each pod
        first: dict[tuple, tuple] = {}  # key -> what the index stores next to the counts
        zero_cpu, zero_mem = np.zeros(n, np.int64), np.zeros(n, np.int64)
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
        zero_cpu.flags.writeable = zero_mem.flags.writeable = False
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
                        {k: frozenset(v) for k, v in anti_pairs.items()}, zero_cpu, zero_mem)

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
        cache = self.node_cache if nodes is self.nodes else {}
        return PodIndex(bound, nodes, groups, group_pairs, anti, anti_pairs, zero_cpu, zero_mem, cache)


def _bumped(counts: np.ndarray | None, n: int, i: int, delta: int, keep_zero: bool = False) -> np.ndarray | None:
    """A copy of ``counts`` (zeros when None) with ``delta`` added at i; None when nothing is left."""
    out = np.zeros(n, np.int64) if counts is None else counts.copy()
    out[i] += delta
    out.flags.writeable = False  # shared by later indexes
    return out if keep_zero or out.any() else None


def pod_index(state: ClusterState) -> PodIndex:
    """The state's ``PodIndex``, built (once per state object) when it is absent or describes other tuples."""
    idx = state.pods_by_label
    if idx is not None and idx.bound is state.bound and idx.nodes is state.nodes:
        return idx
    if idx is not None and idx.bound is state.bound:
        idx = replace(idx, nodes=state.nodes, node_cache={})
    else:
        idx = PodIndex.build(state.nodes, state.bound)
    object.__setattr__(state, "pods_by_label", idx)  # memo of derived data: the state's value is unchanged
    return idx


def _next_index(state: ClusterState, i: int, pod: Pod, bound: tuple, delta: int) -> PodIndex | None:
    """The index after a bind/unbind when the state's index is current, else None (rebuilt on demand)."""
    idx = state.pods_by_label
    if idx is None or idx.bound is not state.bound or len(bound) != len(state.bound):
        return None
    return idx._change(i, pod, bound, state.nodes, delta)


def bind(state: ClusterState, pod: Pod, node_index: int, gpus: tuple[int, ...] = ()) -> ClusterState:
    """A new state with ``pod`` bound to node ``node_index`` on GPU devices ``gpus``."""
    i = node_index
    cpu, mem, cnt, eph = (a.copy() for a in (state.cpu_used, state.mem_used, state.pods_used, state.eph_used))
    gpu = state.gpu_used.copy()
    cpu[i] += pod.cpu_milli
    mem[i] += pod.memory_mib
    cnt[i] += 1
    eph[i] += pod.ephemeral_mib
    share = pod.gpu_milli if pod.is_gpu_share else GPU_MILLI
    for j in gpus:
        gpu[i, j] += share
    placed = replace(pod, node_name=state.nodes[i].name, gpu_devices=tuple(gpus))
    bound = state.bound[:i] + (state.bound[i] + (placed,),) + state.bound[i + 1 :]
    return replace(state, cpu_used=cpu, mem_used=mem, pods_used=cnt, eph_used=eph, gpu_used=gpu, bound=bound,
                   affinity_pods=_count_affinity(state.affinity_pods, i, pod, +1),
                   pods_by_label=_next_index(state, i, placed, bound, +1))


def unbind(state: ClusterState, pod_key: str) -> ClusterState:
    """A new state without the bound pod ``pod_key`` (namespace/name); unknown keys are a no-op."""
    for i, pods in enumerate(state.bound):
        for p in pods:
            if p.key == pod_key:
                return unbind_at(state, i, pod_key)
    return state


def unbind_at(state: ClusterState, node_index: int, pod_key: str) -> ClusterState:
    """``unbind`` for a pod known to be on node ``node_index``: looks at that node's pods only.

    The same state as ``unbind(state, pod_key)`` when the pod is there; a no-op when it is not."""
    i = node_index
    pods = state.bound[i]
    for k, p in enumerate(pods):
        if p.key == pod_key:
            cpu, mem, cnt, eph = (a.copy() for a in (state.cpu_used, state.mem_used, state.pods_used, state.eph_used))
            gpu = state.gpu_used.copy()
            cpu[i] -= p.cpu_milli
            mem[i] -= p.memory_mib
            cnt[i] -= 1
            eph[i] -= p.ephemeral_mib
            share = p.gpu_milli if p.is_gpu_share else GPU_MILLI
            for j in p.gpu_devices:
                gpu[i, j] -= share
            bound = state.bound[:i] + (pods[:k] + pods[k + 1 :],) + state.bound[i + 1 :]
            return replace(state, cpu_used=cpu, mem_used=mem, pods_used=cnt, eph_used=eph, gpu_used=gpu, bound=bound,
                           affinity_pods=_count_affinity(state.affinity_pods, i, p, -1),
                           pods_by_label=_next_index(state, i, p, bound, -1))
    return state


def _count_affinity(counts: np.ndarray, i: int, pod: Pod, delta: int) -> np.ndarray:
    """``affinity_pods`` after adding/removing ``pod`` on node i (unchanged array when it has no terms)."""
    if not pod.has_pod_affinity or i >= counts.shape[0]:
        return counts
    out = counts.copy()
    out[i] += delta
    return out


# ---------------------------------------------------------------------------------------------
# Plain-dict conversion (for the wire). Tuples of dataclasses and mappings round-trip exactly.

_TYPES: dict[str, type] = {}


def _register(*classes: type) -> None:
    for c in classes:
        _TYPES[c.__name__] = c


_register(Taint, Toleration, LabelRequirement, NodeSelectorTerm, PreferredSchedulingTerm, LabelSelector,
          PodAffinityTerm, WeightedPodAffinityTerm, TopologySpreadConstraint, Node, Pod)

_NESTED: dict[tuple[str, str], type] = {
    ("Node", "taints"): Taint,
    ("Pod", "tolerations"): Toleration,
    ("Pod", "required_node_affinity"): NodeSelectorTerm,
    ("Pod", "preferred_node_affinity"): PreferredSchedulingTerm,
    ("Pod", "pod_affinity"): PodAffinityTerm,
    ("Pod", "pod_anti_affinity"): PodAffinityTerm,
    ("Pod", "preferred_pod_affinity"): WeightedPodAffinityTerm,
    ("Pod", "preferred_pod_anti_affinity"): WeightedPodAffinityTerm,
    ("Pod", "topology_spread"): TopologySpreadConstraint,
    ("NodeSelectorTerm", "match_expressions"): LabelRequirement,
    ("NodeSelectorTerm", "match_fields"): LabelRequirement,
    ("PreferredSchedulingTerm", "preference"): NodeSelectorTerm,
    ("LabelSelector", "match_expressions"): LabelRequirement,
    ("PodAffinityTerm", "label_selector"): LabelSelector,
    ("WeightedPodAffinityTerm", "term"): PodAffinityTerm,
    ("TopologySpreadConstraint", "label_selector"): LabelSelector,
}


def to_dict(obj: Any) -> Any:
    """Dataclass -> plain dict/list/scalars, omitting fields equal to their defaults."""
    if is_dataclass(obj):
        out = {}
        for f in fields(obj):
            v = getattr(obj, f.name)
            if f.default is not MISSING:
                default = f.default
            elif f.default_factory is not MISSING:
                default = f.default_factory()
            else:
                default = MISSING
            if default is not MISSING and v == default:
                continue
            out[f.name] = to_dict(v)
        return out
    if isinstance(obj, (tuple, list)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


def from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """Inverse of ``to_dict``; raises TypeError/ValueError on unknown fields or bad shapes."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}: expected a mapping, got {type(data).__name__}")
    names = {f.name: f for f in fields(cls)}
    unknown = set(data) - set(names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        nested = _NESTED.get((cls.__name__, key))
        f = names[key]
        if nested is not None:
            if isinstance(value, Mapping):
                kwargs[key] = from_dict(nested, value)
            else:
                kwargs[key] = tuple(from_dict(nested, v) for v in value)
        elif isinstance(value, list):
            kwargs[key] = tuple(value)
        else:
            kwargs[key] = value
        if "Mapping" in str(f.type) and not isinstance(kwargs[key], Mapping):
            raise TypeError(f"{cls.__name__}.{key}: expected a mapping")
    return cls(**kwargs)


def node_from_dict(data: Mapping[str, Any]) -> Node:
    return from_dict(Node, data)


def pod_from_dict(data: Mapping[str, Any]) -> Pod:
    return from_dict(Pod, data)


def state_to_dict(state: ClusterState) -> dict[str, Any]:
    """Nodes and bound pods (with their GPU devices); usage is recomputed on load."""
    return {"nodes": [to_dict(n) for n in state.nodes],
            "bound": [[to_dict(p) for p in pods] for pods in state.bound]}


def state_from_dict(data: Mapping[str, Any]) -> ClusterState:
    """Inverse of ``state_to_dict``; also decodes the compact forms of ``cluster.compact`` (a ``"format"`` key):
    a compact snapshot exactly, a compact experience state without pod identity (its pending pods dropped)."""
    if "format" in data:
        from agmarl_common.cluster import compact  # compact builds on this module
        if compact.is_snapshot(data):
            return compact.state_from_snapshot(data)
        if compact.is_compact(data):
            return compact.state_from_compact(data)[0]
        raise ValueError(f"unknown cluster state format {data['format']!r}")
    nodes = tuple(node_from_dict(n) for n in data["nodes"])
    bound = [tuple(pod_from_dict(p) for p in pods) for pods in data.get("bound", [[] for _ in nodes])]
    return state_with_bound(nodes, bound)


def state_with_bound(nodes: Sequence[Node], bound: Sequence[Sequence[Pod]]) -> ClusterState:
    """The state of ``nodes`` holding ``bound[i]`` on node i (pods as given, ``gpu_devices`` included),
    usage arrays summed from those pods in one pass; the ``PodIndex`` is built on demand (``pod_index``)."""
    state = ClusterState.empty(tuple(nodes))
    cpu, mem, cnt, eph, aff = (a.copy() for a in (state.cpu_used, state.mem_used, state.pods_used, state.eph_used,
                                                  state.affinity_pods))
    gpu = state.gpu_used.copy()
    for i, pods in enumerate(bound):
        for p in pods:
            cpu[i] += p.cpu_milli
            mem[i] += p.memory_mib
            cnt[i] += 1
            eph[i] += p.ephemeral_mib
            aff[i] += p.has_pod_affinity
            for j in p.gpu_devices:
                gpu[i, j] += p.gpu_milli if p.is_gpu_share else GPU_MILLI
    return replace(state, cpu_used=cpu, mem_used=mem, pods_used=cnt, eph_used=eph, gpu_used=gpu,
                   bound=tuple(tuple(pods) for pods in bound), affinity_pods=aff, pods_by_label=None)
