"""GPU fragmentation as defined by the FGD paper (Weng et al., USENIX ATC'23).

Fragmentation is measured against a *target workload*: the distribution of pod shapes the cluster
expects. A node's idle GPU milli counts as fragment for a target pod shape when that pod could not
use it, and the node's fragmentation amount is the expectation over the target distribution:

    F(n) = sum_k p_k * frag_k(n)
    frag_k(n) = idle GPU milli of n                    if pod k asks no GPU (the paper's XL/XR),
                                                        or n's GPU model is not allowed for k,
                                                        or n cannot host k (GPUs or CPU short);
              = sum of idle milli on devices with
                less idle than k asks per GPU          otherwise (k fits; only too-small leftovers count).

Cluster fragmentation amount = sum_n F(n); fragmentation ratio = amount / idle GPU milli.
The target workload is the set of most popular pod shapes (cpu, gpu milli per GPU, gpu count,
gpu model constraint) of the workload, taken in decreasing popularity until they cover 95 % of
the pods, and renormalised (the paper simulator's "typical pods", popularity threshold 95, step 1,
CPU-only pods included).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod

DEFAULT_CPU_MILLI = 100  # kube-scheduler's non-zero default CPU request, used for pod shapes


@dataclass(frozen=True)
class TargetWorkload:
    """K pod shapes with their probabilities (sum 1), in decreasing popularity."""

    cpu_milli: np.ndarray  # (K,) int64, non-zero CPU request
    gpu_milli: np.ndarray  # (K,) int64, milli per GPU (0 = CPU-only pod)
    num_gpu: np.ndarray  # (K,) int64
    gpu_spec: tuple[tuple[str, ...], ...]  # allowed GPU models per shape (empty = any)
    prob: np.ndarray  # (K,) float64

    @property
    def size(self) -> int:
        return int(self.prob.size)

    def accessible(self, gpu_model: np.ndarray) -> np.ndarray:
        """(n, K) bool: node model allowed for each shape (a GPU shape needs a GPU node)."""
        models = np.asarray(gpu_model, dtype=object)
        out = np.ones((models.size, self.size), dtype=bool)
        has_model = np.array([bool(m) for m in models], dtype=bool)
        for k, spec in enumerate(self.gpu_spec):
            if spec:
                out[:, k] = np.array([m in spec for m in models], dtype=bool) & has_model
        return out


def pod_shape(pod: Pod) -> tuple[int, int, int, str]:
    """(non-zero cpu milli, gpu milli per GPU, gpu count, gpu model constraint) of a pod."""
    cpu = pod.cpu_milli if pod.cpu_milli > 0 else DEFAULT_CPU_MILLI
    milli = pod.gpu_milli if pod.num_gpu > 0 else 0
    return cpu, milli, pod.num_gpu if milli > 0 else 0, "|".join(pod.gpu_spec)


def target_workload(pods: Iterable[Pod], popularity_pct: float = 95.0, step: int = 1,
                    include_cpu_pods: bool = True) -> TargetWorkload:
    """The paper's typical-pod distribution of a workload (see the module docstring)."""
    counts = Counter(pod_shape(p) for p in pods if include_cpu_pods or p.num_gpu > 0)
    if not counts:
        raise ValueError("target_workload: no pods to build a distribution from")
    total = sum(counts.values())
    # decreasing count; ties by decreasing (cpu, milli, num, model) as the paper's reverse sort does
    ranked = sorted(((c,) + shape for shape, c in counts.items()), reverse=True)
    expected = popularity_pct * total / 100.0
    chosen, cum, upto = [], 0, 0
    while cum < expected and len(chosen) < len(ranked):
        upto += max(step, 1)
        while len(chosen) < upto and len(chosen) < len(ranked):
            chosen.append(ranked[len(chosen)])
            cum += chosen[-1][0]
    cnt = np.array([r[0] for r in chosen], dtype=np.float64)
    return TargetWorkload(
        cpu_milli=np.array([r[1] for r in chosen], dtype=np.int64),
        gpu_milli=np.array([r[2] for r in chosen], dtype=np.int64),
        num_gpu=np.array([r[3] for r in chosen], dtype=np.int64),
        gpu_spec=tuple(tuple(s for s in r[4].split("|") if s) for r in chosen),
        prob=cnt / cnt.sum(),
    )


def node_frag_amount(cpu_left: np.ndarray, gpu_left: np.ndarray, access: np.ndarray,
                     target: TargetWorkload) -> np.ndarray:
    """Expected fragment GPU milli per node state.

    cpu_left (B,), gpu_left (B, G) idle milli per device (0 for absent devices),
    access (B, K) from ``TargetWorkload.accessible``. Returns (B,) float64.
    """
    left = np.asarray(gpu_left, dtype=np.int64)
    total = left.sum(axis=1).astype(np.float64)  # (B,)
    milli = target.gpu_milli  # (K,)
    fits_dev = left[:, None, :] >= milli[None, :, None]  # (B, K, G)
    can_host = fits_dev.sum(axis=2) >= target.num_gpu[None, :]  # (B, K)
    cpu_ok = np.asarray(cpu_left)[:, None] >= target.cpu_milli[None, :]
    small = np.where(fits_dev, 0, left[:, None, :]).sum(axis=2).astype(np.float64)  # (B, K)
    is_gpu_shape = (milli > 0)[None, :]
    satisfied = is_gpu_shape & access & can_host & cpu_ok
    per_shape = np.where(satisfied, small, total[:, None])
    return expectation(per_shape, target.prob)


def expectation(per_shape: np.ndarray, prob: np.ndarray) -> np.ndarray:
    """(B,) each row of ``per_shape`` (B, K) weighted by ``prob`` (K,), summed row by row in one fixed order, so
    a row's result does not depend on the batch it is computed in: a BLAS matrix-vector product (``@``) rounds a
    row differently by its place in the batch and the batch's size, and the memoised rows of
    ``features.FeatureContext``, computed in whatever batches the decisions asked for, would then differ in the
    last bit from rows computed afresh."""
    return (per_shape * prob).sum(axis=1)


@dataclass(frozen=True)
class Fragmentation:
    amount_milli: float  # sum of node fragmentation amounts
    idle_milli: float  # idle GPU milli in the cluster

    @property
    def ratio(self) -> float:
        """Fragment share of the idle GPU milli (0..1); 0 when nothing is idle."""
        return self.amount_milli / self.idle_milli if self.idle_milli > 0 else 0.0


def state_frag(state: ClusterState, target: TargetWorkload,
               access: np.ndarray | None = None) -> np.ndarray:
    """(n,) fragmentation amount of each node of ``state``."""
    acc = target.accessible(state.gpu_model) if access is None else access
    return node_frag_amount(state.cpu_cap - state.cpu_used, state.gpu_free(), acc, target)


def cluster_fragmentation(state: ClusterState, target: TargetWorkload) -> Fragmentation:
    """Cluster fragmentation amount and idle GPU milli of ``state`` against ``target``."""
    return Fragmentation(float(state_frag(state, target).sum()), float(state.gpu_free().sum()))

