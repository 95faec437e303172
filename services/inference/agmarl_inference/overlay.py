"""In-flight decisions: what this inference replica decided that the graph it is scoring does not
show yet. Pipelined pods would otherwise all see the same free node (the arbiter's job).

graph-builder tells, per replica, the highest decision sequence its features reflect; the overlay
applies this replica's later decisions to the candidate state before scoring. Pure bookkeeping.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from agmarl_common.cluster.model import ClusterState, Pod, bind


@dataclass
class InFlight:
    max_entries: int = 4096
    max_age: float = 2.0  # seconds; older decisions are assumed applied or refused
    seq: int = 0
    entries: OrderedDict[int, tuple[Pod, str, tuple[int, ...], float]] = field(default_factory=OrderedDict)

    def record(self, pod: Pod, node: str, gpus: tuple[int, ...], now: float) -> int:
        """Remember a decision; returns its sequence number."""
        self.seq += 1
        if node:
            self.entries[self.seq] = (pod, node, gpus, now)
            while len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)
        return self.seq

    def apply(self, state: ClusterState, seen: int, now: float) -> ClusterState:
        """``state`` with every decision newer than ``seen`` (and not too old) bound on its node."""
        for s in [s for s, e in self.entries.items() if s <= seen or now - e[3] > self.max_age]:
            del self.entries[s]
        for pod, node, gpus, _ in self.entries.values():
            i = state.index.get(node)
            if i is not None:
                state = bind(state, pod, i, gpus)
        return state
