"""The shared cluster model: plain, immutable data for nodes, pods and cluster usage.

Everything that reasons about a cluster (hard filter, scorers, simulator, graph features,
reward) works on these types. No I/O, no clocks, no randomness in here.

GPU semantics follow the Alibaba openb trace and the FGD paper (USENIX ATC'23):
- a node has ``gpu_count`` physical GPUs of one ``gpu_model``; each device has 1000 milli;
- a pod asks ``num_gpu`` GPUs and ``gpu_milli`` per GPU: ``num_gpu == 1`` with
  ``gpu_milli < 1000`` is a fractional share of one device; ``num_gpu >= 1`` with
  ``gpu_milli == 1000`` takes whole devices; ``num_gpu == 0`` asks for no GPU;
- ``gpu_spec`` lists the GPU models a pod may run on (empty = any).

This module is the one import path for the model; the code lives in
- ``specs.py``: constants and the Node / Pod dataclasses with their constraint types;
- ``state.py``: ``ClusterState``, ``choose_gpus``, ``bind`` / ``unbind`` / ``unbind_at``, ``state_with_bound``;
- ``podindex.py``: ``PodIndex`` (bound pods by labels and anti-affinity term); ``pod_index`` is in ``state.py``;
- ``codec.py``: plain-dict conversion (``to_dict`` / ``from_dict`` and the node/pod/state helpers);
- ``compact.py``: the compact wire forms; its ``state_from_dict`` decodes every form.
"""

from __future__ import annotations

from agmarl_common.core.cluster.codec import (
    from_dict,
    node_from_dict,
    pod_from_dict,
    state_to_dict,
    to_dict,
)
from agmarl_common.core.cluster.compact import state_from_dict
from agmarl_common.core.cluster.podindex import PodIndex, labels_key, term_key
from agmarl_common.core.cluster.specs import (
    AGMARL_SCHEDULER,
    DEFAULT_SCHEDULER,
    GPU_MILLI,
    HOSTNAME_LABEL,
    MAX_GPUS,
    RACK_LABEL,
    ZONE_LABEL,
    LabelRequirement,
    LabelSelector,
    Node,
    NodeSelectorTerm,
    Pod,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    Taint,
    Toleration,
    TopologySpreadConstraint,
    WeightedPodAffinityTerm,
)
from agmarl_common.core.cluster.state import (
    ClusterState,
    bind,
    choose_gpus,
    pod_index,
    state_with_bound,
    unbind,
    unbind_at,
)

__all__ = [
    "AGMARL_SCHEDULER", "DEFAULT_SCHEDULER", "GPU_MILLI", "HOSTNAME_LABEL", "MAX_GPUS", "RACK_LABEL", "ZONE_LABEL",
    "LabelRequirement", "LabelSelector", "Node", "NodeSelectorTerm", "Pod", "PodAffinityTerm",
    "PreferredSchedulingTerm", "Taint", "Toleration", "TopologySpreadConstraint", "WeightedPodAffinityTerm",
    "ClusterState", "bind", "choose_gpus", "state_with_bound", "unbind", "unbind_at",
    "PodIndex", "labels_key", "pod_index", "term_key",
    "from_dict", "node_from_dict", "pod_from_dict", "state_from_dict", "state_to_dict", "to_dict",
]
