"""The cluster view every decider reads: nodes, bound pods and *assumed* pods, modelled on
kube-scheduler's scheduler cache (``pkg/scheduler/backend/cache``: AssumePod, FinishBinding, ForgetPod,
AddPod, RemovePod, UpdateSnapshot).

- *Observed* changes come from the producer (the state-collector, through graph-builder) in order: a
  full state (``apply_snapshot``) or one change (``observe_bound`` / ``observe_removed`` /
  ``observe_node_ready`` / ``observe_load``), each stamped with the producer's ``(epoch, seq)``.
  ``accept`` decides whether a stamp is next, stale or a reset: a new epoch (a restarted producer) or a
  sequence number far out of range resets the view to the next full state instead of freezing it.
- *Assumed* pods are this decider's own decisions the producer has not reported yet (``assume``); they
  hold their resources at once, so pods decided back to back never see the same free node. An observed
  binding of the pod confirms it; a refused bind forgets it (``forget``); one never confirmed expires
  after ``assume_ttl`` seconds (``expire``).

``state`` is the whole cluster (observed + assumed) as the simulator sees it: the same ``ClusterState``
the hard filter, the features and every policy read. The structure is plain bookkeeping: no clock (times
come in as arguments), no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from agmarl_common.core.cluster.state import ClusterState, bind, unbind_at
from agmarl_common.core.cluster.specs import Pod

MAX_SEQ_JUMP = 1_000_000  # a stamp this far from the current sequence is a reset, not a step
Position = Literal["next", "gap", "stale", "reset"]


@dataclass(frozen=True)
class Assumed:
    pod: Pod
    node: str
    gpus: tuple[int, ...]
    at: float  # when it was assumed (caller's clock)


class ClusterView:
    """Observed + assumed cluster state (module docstring). Not thread-safe: one event loop owns it."""

    def __init__(self, assume_ttl: float = 30.0):
        self.assume_ttl = assume_ttl
        self.epoch = ""
        self.seq = -1
        self.state: ClusterState | None = None  # observed + assumed
        self.where: dict[str, int] = {}  # pod key -> node index, for every pod in ``state``
        self.assumed: dict[str, Assumed] = {}  # assumed, not yet observed (insertion order = decision order)
        self.version = 0  # bumped on every change (caches key on it)
        self.resets = 0
        self.gaps = 0

    # --- ordering -------------------------------------------------------------------------------

    @property
    def warm(self) -> bool:
        return self.state is not None

    def schedulers(self) -> dict[str, str]:
        """Pod key -> scheduler name of every pod the view holds bound."""
        return {} if self.state is None else {p.key: p.scheduler_name for row in self.state.bound for p in row}

    def position(self, epoch: str, seq: int) -> Position:
        """Where a producer stamp falls: the next change, after a gap, already applied, or a reset."""
        if self.state is None or epoch != self.epoch or abs(seq - self.seq) > MAX_SEQ_JUMP:
            return "reset"
        if seq <= self.seq:
            return "stale"
        return "next" if seq == self.seq + 1 else "gap"

    def accept(self, epoch: str, seq: int) -> bool:
        """For one observed change: True when it should be applied (next, or after a gap, which is
        counted: the next full state repairs what was missed); False when stale or when only a full state
        can start the view (a reset)."""
        pos = self.position(epoch, seq)
        if pos in ("stale", "reset"):
            return False
        if pos == "gap":
            self.gaps += 1
        self.seq = seq
        return True

    # --- observed -------------------------------------------------------------------------------

    def apply_snapshot(self, epoch: str, seq: int, state: ClusterState) -> bool:
        """Replace the observed state with a full one unless it is older than what the view holds.
        Assumed pods the snapshot does not show yet are placed again where they still fit."""
        pos = self.position(epoch, seq)
        if pos == "stale":
            return False
        if pos == "reset":
            self.resets += 1
        self.epoch, self.seq = epoch, seq
        self.state = state
        self.where = {p.key: i for i, pods in enumerate(state.bound) for p in pods}
        for key, a in list(self.assumed.items()):
            if key in self.where:
                del self.assumed[key]  # observed: confirmed (or placed elsewhere by someone else)
            elif not self._place(a.pod, a.node, a.gpus):
                del self.assumed[key]
        self.version += 1
        return True

    def observe_bound(self, pod: Pod, node: str, gpus: tuple[int, ...] = ()) -> None:
        """The producer saw ``pod`` bound to ``node``: confirms an assumed pod, or places it."""
        a = self.assumed.pop(pod.key, None)
        i = self.where.get(pod.key)
        if a is not None and i is not None and a.node == node and tuple(a.gpus) == tuple(gpus):
            return  # the assumption was right: the state already holds it
        if i is not None:
            self._remove(pod.key)
        self._place(pod, node, gpus)
        self.version += 1

    def observe_removed(self, pod_key: str) -> None:
        """The pod left its node (completed, deleted, evicted, failed)."""
        self.assumed.pop(pod_key, None)
        if self._remove(pod_key):
            self.version += 1

    def observe_node_ready(self, name: str, ready: bool) -> None:
        """A node failed or recovered (a not-ready node takes no new pods)."""
        state = self.state
        if state is None or name not in state.index:
            return
        i = state.index[name]
        node = state.nodes[i]
        if node.ready == ready:
            return
        nodes = state.nodes[:i] + (replace(node, ready=ready),) + state.nodes[i + 1:]
        sched = state.schedulable.copy()
        sched[i] = ready and not node.unschedulable
        self.state = replace(state, nodes=nodes, schedulable=sched)
        self.version += 1

    def observe_load(self, cpu_load: np.ndarray | None, mem_load: np.ndarray | None) -> None:
        """Measured load per node (load-aware policies read it); None = use requests."""
        if self.state is None:
            return
        n = self.state.n_nodes
        if (cpu_load is not None and len(cpu_load) != n) or (mem_load is not None and len(mem_load) != n):
            raise ValueError(f"load arrays must have one value per node ({n})")
        self.state = replace(self.state, cpu_load=cpu_load, mem_load=mem_load)
        self.version += 1

    # --- assumed --------------------------------------------------------------------------------

    def assume(self, pod: Pod, node: str, gpus: tuple[int, ...], now: float) -> bool:
        """This decider placed ``pod`` on ``node``: its resources are taken now. False when the node is
        unknown or the pod is already in the view."""
        if self.state is None or pod.key in self.where or not self._place(pod, node, gpus):
            return False
        self.assumed[pod.key] = Assumed(pod, node, tuple(gpus), now)
        self.version += 1
        return True

    def assume_decided(self, before: ClusterState, after: ClusterState,
                       placed: list[tuple[Pod, str, tuple[int, ...]]], now: float) -> bool:
        """A joint decision made on ``before`` whose result ``after`` is ``before`` with each of ``placed``
        (pod, node, gpus) bound in that order (``batchcore.decide_batch``'s final state): take ``after`` and
        assume them all, the same view as ``assume`` one by one without binding each pod again. False, and
        nothing changed, when the view is no longer at ``before`` or a pod is in the view already or its node
        unknown (then ``assume`` them one by one)."""
        if self.state is None or self.state is not before or len(after.nodes) != len(before.nodes):
            return False
        if any(pod.key in self.where or node not in before.index for pod, node, _ in placed):
            return False
        self.state = after
        for pod, node, gpus in placed:
            self.where[pod.key] = before.index[node]
            self.assumed[pod.key] = Assumed(pod, node, tuple(gpus), now)
        self.version += 1
        return True

    def forget(self, pod_key: str, node: str = "") -> bool:
        """An assumed pod's bind (to ``node``; "" = wherever) failed: give its resources back. Observed pods,
        and a pod assumed on another node than the refused one, are left alone."""
        a = self.assumed.get(pod_key)
        if a is None or (node and a.node != node):
            return False
        del self.assumed[pod_key]
        self._remove(pod_key)
        self.version += 1
        return True

    def expire(self, now: float) -> list[str]:
        """Forget assumed pods older than ``assume_ttl`` (their binding was never observed)."""
        old = [k for k, a in self.assumed.items() if now - a.at > self.assume_ttl]
        for key in old:
            self.forget(key)
        return old

    def is_assumed(self, pod_key: str) -> bool:
        return pod_key in self.assumed

    def node_of(self, pod_key: str) -> str:
        i = self.where.get(pod_key)
        return "" if i is None or self.state is None else self.state.nodes[i].name

    # --- internals ------------------------------------------------------------------------------

    def _place(self, pod: Pod, node: str, gpus: tuple[int, ...]) -> bool:
        state = self.state
        if state is None or node not in state.index:
            return False
        i = state.index[node]
        clean = replace(pod, node_name="", gpu_devices=()) if pod.node_name or pod.gpu_devices else pod
        self.state = bind(state, clean, i, tuple(gpus))
        self.where[pod.key] = i
        return True

    def _remove(self, pod_key: str) -> bool:
        i = self.where.pop(pod_key, None)
        if i is None or self.state is None:
            return False
        self.state = unbind_at(self.state, i, pod_key)
        return True

