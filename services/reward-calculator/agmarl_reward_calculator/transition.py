"""Experience transitions: what the trainer needs to learn from one decision. Pure (no I/O, no clock).

A decision is paired with the last snapshot received before it (the cluster it was made on) and the
first snapshot after it (the one it is rewarded on). The transition carries:

    state       {"cluster": deflated compact state (``agmarl_common.core.cluster.compact.deflated``) of the
                 snapshot before, the decided pod left out (it was still pending), "snapshot_seq", "time", "stats"}
    action      {"pod": the decided pod (``to_dict`` form, as pending), "pod_key", "node", "gpus", "policy",
                 "score"}
    reward      the total reward
    next_state  a reference to the snapshot after: {"snapshot_seq", "time", "stats"}; its cluster is the
                ``state`` of the transitions decided on it

    credit      the decision's own reward signal (``decision_credit``): ``core.credit``'s difference reward of
                its placement against where a reference policy (``AGMARL_CREDIT_REFERENCE``, kube-default) would
                have placed the same pod on the same cluster, {"total", "reference", "reference_node",
                "components"}; {"missing": why} when it could not be computed; {} when credit is off

The pod comes from the snapshot before (pending, or already bound when that snapshot raced ahead of the
decision), else from the snapshot after. What could not be included is named in ``state["missing"]``
(no_snapshot | late | invalid_state | oversized | unknown_pod) and the action has no ``pod`` when none was
found: the trainer counts such transitions as unusable instead of guessing. ``late``: the decision reached this
process after the snapshots from before it were gone (a redelivery after a restart), so the cluster it was made
on is not known; the transition has the action, the reward and the next state, and no cluster.
"""

from __future__ import annotations

from typing import Any

from agmarl_common.runtime import messages as m
from agmarl_common.core.cluster.compact import bound_pod_dicts, compact_dict, deflate_shared, deflated, drop_pending, \
    is_snapshot, pod_key_of, state_from_dict
from agmarl_common.core.cluster.model import ClusterState, pod_from_dict, to_dict
from agmarl_common.core.credit import reference_credit
from agmarl_common.core.policies.base import Policy
from agmarl_common.core.reward import PlacementBase, RewardScheme, placement_base

_BOUND = -1  # position of a pod found bound, not pending


class SnapshotView:
    """One snapshot with what transitions need from it, computed once: its pods by key, its compact state."""

    def __init__(self, msg: m.ClusterSnapshot):
        self.msg = msg
        self.received = 0.0  # wall time this process received it (set by the reward-calculator)
        self._pending: dict[str, int] | None = None  # pending pod key -> position in msg.pending
        self._bound: dict[str, tuple[int, int]] = {}  # bound pod key -> (node row, position in the row)
        self._raw: list[list[dict[str, Any]]] | None = None  # bound pod dicts of a state_to_dict state
        self._names: list[str] | None = None
        self._compact: dict[str, Any] | None = None
        self._shared: bytes | None = None
        self._state: ClusterState | None = None
        self._base: PlacementBase | None = None

    @property
    def seq(self) -> int:
        return self.msg.seq

    def reference(self) -> dict[str, Any]:
        return {"snapshot_seq": self.msg.seq, "time": self.msg.time, "stats": dict(self.msg.stats)}

    @property
    def epoch(self) -> str:
        return self.msg.epoch

    def placement(self, key: str) -> str | None:
        """Where pod ``key`` is in this snapshot: its node's name when bound, "" when pending, None when
        absent (never announced, departed, dropped)."""
        self._index()
        if key in self._pending:
            return ""
        where = self._bound.get(key)
        if where is None:
            return None
        if self._names is None:
            self._names = [nd.name for nd in self.cluster_state().nodes]
        return self._names[where[0]]

    def pod(self, key: str) -> tuple[dict[str, Any], int] | None:
        """(pod dict, position among pending or -1 when bound) of pod ``key``; None when absent."""
        self._index()
        k = self._pending.get(key)
        if k is not None:
            return self.msg.pending[k], k
        where = self._bound.get(key)
        if where is None:
            return None
        i, j = where
        found = self._raw[i][j] if self._raw is not None else to_dict(self.cluster_state().bound[i][j])
        return found, _BOUND

    def _index(self) -> None:
        """Where each pod is, by key: pending pods by position, bound pods by (node row, position in it). A
        compact snapshot's bound pods are read from its parsed ``cluster_state`` (shared with the reward), and
        only a pod asked for is turned into a dict."""
        if self._pending is not None:
            return
        bound: dict[str, tuple[int, int]] = {}
        if is_snapshot(self.msg.state):
            for i, row in enumerate(self.cluster_state().bound):
                for j, p in enumerate(row):
                    bound[p.key] = (i, j)
        else:
            self._raw = bound_pod_dicts(self.msg.state)
            for i, row in enumerate(self._raw):
                for j, p in enumerate(row):
                    bound[pod_key_of(p)] = (i, j)
        self._bound, self._pending = bound, {pod_key_of(p): k for k, p in enumerate(self.msg.pending)}

    def cluster_state(self) -> ClusterState:
        """The snapshot's cluster as a ``ClusterState`` (parsed once)."""
        if self._state is None:
            self._state = state_from_dict(self.msg.state)
        return self._state

    def placement_base(self) -> PlacementBase:
        """``reward.placement_base`` of its cluster (computed once: shared by the credit of every decision made
        on this snapshot)."""
        if self._base is None:
            self._base = placement_base(self.cluster_state())
        return self._base

    def shared(self) -> bytes:
        """``compact.deflate_shared`` of its compact state: the nodes, pod templates and bound pods every transition
        decided on it carries (only the pending list differs), packed and compressed once."""
        if self._shared is None:
            self._shared = deflate_shared(self._compact_state())
        return self._shared

    def _nodes(self):
        """The parsed nodes of a compact snapshot (the reward's ``cluster_state``: not parsed twice), else None."""
        return self.cluster_state().nodes if is_snapshot(self.msg.state) else None

    def _compact_state(self) -> dict[str, Any]:
        if self._compact is None:
            self._compact = compact_dict(self.msg.state, self.msg.pending, nodes=self._nodes())
        return self._compact

    def compact_without(self, key: str) -> dict[str, Any]:
        """The deflated compact state of this snapshot with pod ``key`` left out (as it was before being placed)."""
        found = self.pod(key)
        if found is None:
            return deflated(self._compact_state(), self.shared())
        if found[1] == _BOUND:  # the snapshot already shows the pod bound: rebuild without it (rare)
            return deflated(compact_dict(self.msg.state, self.msg.pending, without=key, nodes=self._nodes()))
        return deflated(drop_pending(self._compact_state(), found[1]), self.shared())


def placed_pod(key: str, before: SnapshotView | None, after: SnapshotView | None,
               bound: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The decided pod as it was while pending (no node, no devices), from the snapshot before or after, else
    from ``bound`` (the pod as a ``pod_bound`` event carried it: a pod that left before any snapshot showed it)."""
    for view in (before, after):
        found = view.pod(key) if view is not None else None
        if found is not None:
            return {k: v for k, v in found[0].items() if k not in ("node_name", "gpu_devices")}
    if bound:
        return {k: v for k, v in bound.items() if k not in ("node_name", "gpu_devices")}
    return None


def decision_credit(d: m.Decision, before: SnapshotView | None, reference: Policy,
                    scheme: RewardScheme | None = None, after: SnapshotView | None = None,
                    bound_pod: dict[str, Any] | None = None) -> dict[str, Any]:
    """The credit of decision ``d`` on the cluster it was made on (``before``), against ``reference``'s
    placement of the same pod there; ``{"missing": why}`` when it cannot be computed: no_snapshot, unschedulable
    (no node chosen), raced (the snapshot already shows the pod bound), unknown_pod, unknown_node,
    invalid_state. A pod that arrived after ``before`` was taken (in no snapshot while pending) is credited on
    ``before``'s cluster with its spec from ``after`` or ``bound_pod`` (``placed_pod``), as the experience's own
    state is; without either it is unknown_pod."""
    if before is None:
        return {"missing": "no_snapshot"}
    if not d.node:
        return {"missing": "unschedulable"}
    found = before.pod(d.pod_key)
    if found is not None and found[1] == _BOUND:
        return {"missing": "raced"}
    spec = found[0] if found is not None else placed_pod(d.pod_key, None, after, bound_pod)
    if spec is None:
        return {"missing": "unknown_pod"}
    try:
        state = before.cluster_state()
        pod = pod_from_dict(spec)  # pending: no node, no devices
    except (TypeError, ValueError, KeyError, AttributeError):
        return {"missing": "invalid_state"}
    node = state.index.get(d.node)
    if node is None:
        return {"missing": "unknown_node"}
    credit, ref = reference_credit(state, pod, node, tuple(int(g) for g in d.gpus), reference, scheme=scheme,
                                   base=before.placement_base())
    return {"total": float(credit.total), "reference": str(getattr(reference, "name", "")),
            "reference_node": state.nodes[ref].name if ref is not None else "",
            "components": {k: float(v) for k, v in credit.components.items()}}


def experience(d: m.Decision, before: SnapshotView | None, after: SnapshotView, reward: float,
               max_bytes: int, late: bool = False, bound_pod: dict[str, Any] | None = None,
               otherwise: str = "", credit: dict[str, Any] | None = None) -> tuple[m.Experience, str]:
    """The transition of decision ``d`` and what is missing from it ("" when complete). When the encoded
    message would exceed ``max_bytes``, the cluster state is left out (``missing`` = oversized). ``late``: no
    snapshot from before ``d`` is known (``before`` is then ignored). ``bound_pod``: the pod of its ``pod_bound``
    event (used when neither snapshot has it); ``otherwise``: the reason to name when nothing else is missing."""
    exp, missing, _ = encoded_experience(d, before, after, reward, max_bytes, late, bound_pod, otherwise, credit)
    return exp, missing


def encoded_experience(d: m.Decision, before: SnapshotView | None, after: SnapshotView, reward: float,
                       max_bytes: int, late: bool = False, bound_pod: dict[str, Any] | None = None,
                       otherwise: str = "", credit: dict[str, Any] | None = None
                       ) -> tuple[m.Experience, str, bytes]:
    """``experience`` and its wire bytes (encoded once: the size check's encoding is the one published)."""
    before = None if late else before
    state: dict[str, Any] = before.reference() if before is not None else {}
    missing = "late" if late else "" if before is not None else "no_snapshot"
    if before is not None:
        try:
            state["cluster"] = before.compact_without(d.pod_key)
        except (TypeError, ValueError, KeyError, AttributeError):
            missing = "invalid_state"
    action: dict[str, Any] = {"pod_key": d.pod_key, "node": d.node, "gpus": list(d.gpus), "policy": d.policy,
                              "score": d.score}
    pod = placed_pod(d.pod_key, before, after, bound_pod)
    if pod is not None:
        action["pod"] = pod
    elif not missing:
        missing = "unknown_pod"
    missing = missing or otherwise
    if missing:
        state["missing"] = missing
    exp = m.Experience(id=d.decision_id, cluster=d.cluster, state=state, action=action, reward=reward,
                       next_state=after.reference(), time=after.msg.time, credit=credit or {})
    data = m.encode(exp)
    if "cluster" in state and len(data) > max_bytes:
        state = {k: v for k, v in state.items() if k != "cluster"}
        state["missing"] = missing = "oversized"
        exp = exp.model_copy(update={"state": state})
        data = m.encode(exp)
    return exp, missing, data
