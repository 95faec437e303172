"""The graph cache: the latest cluster state, kept current between snapshots by applying decisions.

Pure bookkeeping over the shared model; the app feeds it messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agmarl_common.cluster.filters import feasible_mask, filter_node
from agmarl_common.cluster.model import ClusterState, Pod, bind, state_from_dict
from agmarl_common.graph import candidate_features


@dataclass
class GraphCache:
    state: ClusterState | None = None
    seq: int = -1
    pods: dict[str, Pod] = field(default_factory=dict)  # pods we built graphs for, by key
    applied: set[str] = field(default_factory=set)  # pod keys bound optimistically since the snapshot
    in_flight: dict[str, tuple[str, float]] = field(default_factory=dict)  # coupled pod key -> (namespace, built at)
    recent: dict[str, tuple[str, tuple[int, ...], float]] = field(default_factory=dict)  # key -> (node, gpus, at)
    seen: dict[str, int] = field(default_factory=dict)  # inference replica -> highest decision seq applied

    def on_snapshot(self, seq: int, state_dict: dict, now: float = 0.0, keep: float = 1.0) -> bool:
        """Replace the cached state with a newer snapshot; False for an old one.

        Decisions from the last ``keep`` seconds that the snapshot does not show yet (the cluster
        binds them a moment later) are applied again, so their resources stay taken.
        """
        if seq <= self.seq:
            return False
        self.state = state_from_dict(state_dict)
        self.seq = seq
        self.applied.clear()
        bound = {p.key for pods in self.state.bound for p in pods}
        for key in list(self.pods):
            if key in bound and key not in self.recent:
                del self.pods[key]
        for key, (node, gpus, at) in list(self.recent.items()):
            if key in bound or now - at > keep:
                del self.recent[key]
                if key in bound:
                    self.pods.pop(key, None)
            else:
                self._apply(key, node, gpus)
        return True

    def waits(self, pod: Pod, now: float, timeout: float) -> bool:
        """Whether ``pod`` must wait for in-flight decisions it is coupled with.

        Pods with pod (anti-)affinity or topology spread depend on where their peers land, so one
        such pod per namespace is decided at a time (the others wait for its decision, at most
        ``timeout`` seconds). This keeps decisions of one graph-builder conflict-free.
        """
        if not coupled(pod):
            return False
        for key, (ns, at) in list(self.in_flight.items()):
            if now - at > timeout:
                del self.in_flight[key]
            elif ns == pod.namespace:
                return True
        return False

    def on_decision(self, pod_key: str, node: str, gpus: tuple[int, ...], now: float = 0.0,
                    origin: str = "", origin_seq: int = 0) -> bool:
        """Apply a decision to the cache so the next pods see its resources taken."""
        self.in_flight.pop(pod_key, None)
        if origin:
            self.seen[origin] = max(self.seen.get(origin, 0), origin_seq)
        if node:
            self.recent[pod_key] = (node, gpus, now)
        return self._apply(pod_key, node, gpus)

    def _apply(self, pod_key: str, node: str, gpus: tuple[int, ...]) -> bool:
        if self.state is None or not node or pod_key in self.applied:
            return False
        pod = self.pods.get(pod_key)
        i = self.state.index.get(node)
        if pod is None or i is None or not filter_node(pod, self.state, i).ok:
            return False
        self.state = bind(self.state, pod, i, gpus)
        self.applied.add(pod_key)
        return True

    def build(self, pod: Pod, max_reasons: int, now: float = 0.0) -> tuple[list[str], dict, dict[str, str]]:
        """(candidate node names, features, filtered-out node -> reason) for one pending pod."""
        assert self.state is not None
        self.pods[pod.key] = pod
        if coupled(pod):
            self.in_flight[pod.key] = (pod.namespace, now)
        mask = feasible_mask(pod, self.state)
        candidates = np.nonzero(mask)[0]
        reasons: dict[str, str] = {}
        for i in np.nonzero(~mask)[0][:max_reasons]:
            status = filter_node(pod, self.state, int(i))
            reasons[self.state.nodes[i].name] = f"{status.plugin}: {status.reason}"
        names = [self.state.nodes[i].name for i in candidates]
        return names, candidate_features(self.state, candidates), reasons


def coupled(pod: Pod) -> bool:
    """A pod whose feasibility depends on where other pods land."""
    return bool(pod.has_pod_affinity or pod.topology_spread)
