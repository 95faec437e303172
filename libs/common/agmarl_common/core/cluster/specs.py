"""Cluster specs: constants and the plain, immutable dataclasses for nodes, pods and their constraints.

GPU semantics follow the Alibaba openb trace and the FGD paper (USENIX ATC'23):
- a node has ``gpu_count`` physical GPUs of one ``gpu_model``; each device has 1000 milli;
- a pod asks ``num_gpu`` GPUs and ``gpu_milli`` per GPU: ``num_gpu == 1`` with
  ``gpu_milli < 1000`` is a fractional share of one device; ``num_gpu >= 1`` with
  ``gpu_milli == 1000`` takes whole devices; ``num_gpu == 0`` asks for no GPU;
- ``gpu_spec`` lists the GPU models a pod may run on (empty = any).

Import these through ``agmarl_common.core.cluster.model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

GPU_MILLI = 1000
MAX_GPUS = 8
ZONE_LABEL = "topology.kubernetes.io/zone"
RACK_LABEL = "topology.agmarl.io/rack"
TIE_ORDER_LABEL = "agmarl.io/tie-order"  # optional: a decider gives ties to the node with the lowest value
HOSTNAME_LABEL = "kubernetes.io/hostname"
DEFAULT_SCHEDULER = "default-scheduler"
AGMARL_SCHEDULER = "agmarl-scheduler"  # kube-scheduler with the extender (deploy/k8s extender overlays)
AGMARL_BATCH_SCHEDULER = "agmarl-batch-scheduler"  # the batch scheduler (inference batch mode, overlay batch)


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


LS_QOS = "LS"  # the latency-sensitive QoS class (openb traces, synthetic workloads)


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
