"""Load cap: a policy's own filter (admission) that holds pods which are not latency-sensitive off
nodes they would push past the hot line.

``capped:<policy>`` is ``<policy>`` with admission: a pod that is not latency-sensitive (QoS class
``LS`` in traces and the simulator, ``Guaranteed`` in Kubernetes; ``EXEMPT_QOS``) is not admitted to a
node where its cpu request would take the node's cpu pressure (``cluster.metrics.node_cpu_pressure``:
max(requested, measured) / allocatable) above ``cap`` = 0.8, the reward's hot-node line for LS pods
and its utilisation knee. Such a pod waits (the scheduler retries it with backoff) instead of going
there. Latency-sensitive pods are admitted wherever the hard filter lets them go, and an empty node
admits any pod (a pod bigger than the cap of every node must not starve). Scores and GPU choices are
the wrapped policy's.

The same idea as Koordinator's LoadAwareScheduling Filter (nodes over a usage threshold are filtered
out) applied to the requests of best-effort pods: under overload the batch backlog waits in the queue
rather than on the nodes of latency-sensitive services. It trades pending time of batch pods for LS
placement and utilisation below the knee, so it is a regime expert (batch-heavy, node loss), not a
default: the adaptive gate selects it from live features.

Harnesses apply admission through ``policies.base.admitted``: the dynamic simulator, the inference
decision loop (``agmarl_inference.decide``, outside shadow mode), the second scheduler's batch arbiter
and the extender's filter verb (where the active policy decides).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod
from agmarl_common.core.cluster.specs import LS_QOS
from agmarl_common.core.policies.base import Policy

CAP = 0.8  # = reward.HOT_NODE_THRESHOLD = reward.UTILISATION_KNEE
PREFIX = "capped:"
EXEMPT_QOS = (LS_QOS, "Guaranteed")  # latency-sensitive: never held back by the cap


def admit_under_cap(pod: Pod, state: ClusterState, candidates: np.ndarray, cap: float = CAP) -> np.ndarray:
    """(len(candidates),) bool: the candidates ``pod`` may go to under the load cap (module docstring)."""
    c = np.asarray(candidates, dtype=np.int64)
    if pod.qos in EXEMPT_QOS or c.size == 0:
        return np.ones(c.size, dtype=bool)
    used = state.cpu_used[c].astype(np.float64)
    if state.cpu_load is not None:
        used = np.maximum(used, np.asarray(state.cpu_load, dtype=np.float64)[c])
    cap_milli = state.cpu_cap[c].astype(np.float64)
    after = used + pod.cpu_milli
    return (after <= cap * cap_milli) | (state.pods_used[c] == 0)


class LoadCapPolicy:
    """``policy`` with the load cap as admission; everything else is delegated to it."""

    def __init__(self, policy: Policy, cap: float = CAP):
        if not 0.0 < cap <= 1.0:
            raise ValueError(f"load cap must be in (0, 1], got {cap}")
        self.policy, self.cap = policy, cap
        self.name = PREFIX + policy.name

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        return self.policy.score(pod, state, candidates)

    def choose_gpus(self, pod: Pod, state: ClusterState, node_index: int) -> tuple[int, ...] | None:
        return self.policy.choose_gpus(pod, state, node_index)

    def admit(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        return admit_under_cap(pod, state, candidates, self.cap)

    def admission_reason(self, pod: Pod) -> str:
        return (f"LoadCap: a {pod.qos or 'non-LS'} pod would take the node's cpu above {self.cap:.0%} "
                f"of allocatable ({self.name})")

    def __getattr__(self, attr: str) -> Any:  # observe_workload, set_objective, score_batch, explain, ...
        if attr == "policy":
            raise AttributeError(attr)
        return getattr(self.policy, attr)


def wrap_capped(policy: Policy, seed: int = 0) -> LoadCapPolicy:
    """``capped:<policy>`` (``registry.WRAPPERS``)."""
    return LoadCapPolicy(policy)
