"""The regime-shift scenario (``benchmarks/regime_shift.py``): the workload of its four phases (the
scripted node failure is the simulator's ``sim.dynamic.fail_nodes``).

1. online-heavy: long-lived LS services (replicas with hostname anti-affinity, declared network / IO
   preferences) and a few batch jobs;
2. batch-heavy: bursts of short BE batch jobs at a high rate (``--batch-kind gpu``: GPU jobs with shapes
   from the openb trace, scaled to the synthetic GPU nodes);
3. node loss: the same batch load while 20 % of the nodes are down (``sim.dynamic.fail_nodes``, in regime_shift.py);
4. recovery: a light diurnal mix.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from agmarl_common.core.cluster.model import (ZONE_LABEL, LabelRequirement, LabelSelector, Node, NodeSelectorTerm, Pod,
                                         PodAffinityTerm, PreferredSchedulingTerm, WeightedPodAffinityTerm)
from agmarl_common.core.reward import IO_HEAVY_LABEL, LOCAL_SSD_LABEL, NETWORK_HEAVY_LABEL
from agmarl_common.core.sim import synthetic
from agmarl_common.core.sim.loadcurve import flat_curve
from agmarl_common.core.sim.traces import GPU_NODES, load_openb_nodes, load_openb_pods, openb_node_path, openb_pod_path

BATCH_TARGET = 0.45
GPU_BATCH_TARGET = 1.0  # --batch-kind gpu: GPU milli requested by the batch phases / the cluster's GPU milli
GPU_FRACTION = {"cpu": 0.2, "gpu": 0.5}  # share of GPU nodes in the synthetic cluster, per --batch-kind
BATCH_DURATION_S = 300.0  # mean duration of a batch task (synthetic.burst's default)


def _shift(pods: list[Pod], phase: int, offset: float, tag: dict | None = None) -> list[Pod]:
    out = []
    for p in pods:
        labels = dict(p.labels)
        if tag:
            labels.update(tag)
        name = f"p{phase}-{p.name}"
        out.append(replace(p, name=name, uid=name, creation_time=p.creation_time + offset, labels=labels))
    return out


def _declare(p: Pod, k: int) -> Pod:
    """Online LS pods declare what they need: network-heavy services prefer their peers' zone
    (instead of a hard zone spread), every third pod is IO-heavy and prefers local-SSD nodes."""
    if p.qos != "LS":
        return p
    sel = LabelSelector(match_labels={"app": p.service})
    labels = {**p.labels, NETWORK_HEAVY_LABEL: "true"}
    extra: dict = {"topology_spread": (),
                   "preferred_pod_affinity": (WeightedPodAffinityTerm(100, PodAffinityTerm(sel, ZONE_LABEL)),)}
    if k % 3 == 0:
        labels[IO_HEAVY_LABEL] = "true"
        ssd = NodeSelectorTerm((LabelRequirement(LOCAL_SSD_LABEL, "In", ("true",)),))
        extra["preferred_node_affinity"] = (PreferredSchedulingTerm(100, ssd),)
    return replace(p, labels=labels, **extra)


def _big(p: Pod, k: int) -> Pod:
    """Every fourth batch task is a big one (8x the cpu and memory)."""
    return replace(p, cpu_milli=p.cpu_milli * 8, memory_mib=p.memory_mib * 8) if k % 4 == 0 else p


GpuShape = tuple[int, int, int, int]  # (cpu milli, memory MiB, num_gpu, gpu milli per GPU)


def per_gpu(nodes: Sequence[Node]) -> tuple[float, float]:
    """Cpu milli and memory MiB per GPU over the GPU nodes of ``nodes``."""
    gpu = [n for n in nodes if n.gpu_count]
    count = sum(n.gpu_count for n in gpu)
    if not count:
        raise ValueError("no GPU node")
    return sum(n.cpu_milli for n in gpu) / count, sum(n.memory_mib for n in gpu) / count


def gpu_batch_shapes(pods: Sequence[Pod], nodes: Sequence[Node], cpu_scale: float = 1.0,
                     mem_scale: float = 1.0) -> list[GpuShape]:
    """The GPU pods of a trace as shapes for ``nodes``: cpu and memory times the scales, ``gpu_spec``
    dropped (any GPU model), kept only when the shape fits an empty GPU node of ``nodes``."""
    gpu_nodes = [n for n in nodes if n.gpu_count]
    out = []
    for p in pods:
        if p.num_gpu <= 0:
            continue
        cpu, mem = max(1, int(round(p.cpu_milli * cpu_scale))), int(round(p.memory_mib * mem_scale))
        if any(cpu <= n.cpu_milli and mem <= n.memory_mib and p.num_gpu <= n.gpu_count for n in gpu_nodes):
            out.append((cpu, mem, p.num_gpu, p.gpu_milli))
    return out


def gpu_batch_rate(nodes: Sequence[Node], shapes: Sequence[GpuShape], mean_duration_s: float,
                   target: float) -> float:
    """Tasks per second that keep ``target`` of the cluster's GPU milli requested (Little's law)."""
    capacity = sum(n.gpu_count for n in nodes) * 1000
    mean_milli = float(np.mean([g * m for _, _, g, m in shapes]))
    return target * capacity / (mean_milli * mean_duration_s)


def gpu_batch(nodes: list[Node], phase_s: float, seed: int, shapes: Sequence[GpuShape],
              target: float = GPU_BATCH_TARGET) -> list[Pod]:
    """The batch phase's burst process (same windows and durations) with each task's shape drawn
    from ``shapes``, at the rate that requests ``target`` of the GPUs."""
    rate = gpu_batch_rate(nodes, shapes, BATCH_DURATION_S, target)
    batch = synthetic.burst(nodes, phase_s, rate=rate, seed=seed, curve=flat_curve(), burst_every_s=300.0,
                            burst_factor=4.0, mean_duration_s=BATCH_DURATION_S)
    pick = np.random.default_rng([seed, 1]).integers(len(shapes), size=len(batch))  # own stream
    return [replace(p, cpu_milli=c, memory_mib=m, num_gpu=g, gpu_milli=gm, gpu_spec=())
            for p, (c, m, g, gm) in zip(batch, (shapes[i] for i in pick))]


def openb_gpu_shapes(nodes: list[Node]) -> list[GpuShape]:
    """The openb default trace's GPU pods, cpu and memory scaled by the ratio of ``nodes``' cores and
    memory per GPU to the openb GPU cluster's (reads the trace)."""
    cpu, mem = per_gpu(nodes)
    ref_cpu, ref_mem = per_gpu(load_openb_nodes(openb_node_path(GPU_NODES)))
    return gpu_batch_shapes(load_openb_pods(openb_pod_path("default")), nodes, cpu / ref_cpu, mem / ref_mem)


def scenario_workload(nodes, phase_s: float, seed: int, gpu_shapes: Sequence[GpuShape] = ()) -> list[Pod]:
    """The four phases; with ``gpu_shapes`` the batch phases are GPU tasks (``gpu_batch``)."""
    flat = flat_curve()
    pods: list[Pod] = []
    # 1. online-heavy: LS services (hostname anti-affinity, declared preferences) and a few batch jobs
    online = synthetic.batch_online_mix(nodes, phase_s, seed=seed, curve=flat, online_fraction=0.85,
                                        gpu_fraction=0.05)
    pods += _shift([_declare(p, k) for k, p in enumerate(online)], 1, 0.0)
    # 2. batch-heavy: bursty short BE jobs at a high rate, some big tasks
    rate = synthetic.auto_rate(nodes, 1000, 300.0, target=BATCH_TARGET)
    for phase in (2, 3):  # 3. node loss: the batch load goes on
        if gpu_shapes:
            pods += _shift(gpu_batch(nodes, phase_s, seed + phase, gpu_shapes), phase, (phase - 1) * phase_s)
            continue
        batch = synthetic.burst(nodes, phase_s, rate=rate, seed=seed + phase, curve=flat, burst_every_s=300.0,
                                burst_factor=4.0)
        pods += _shift([_big(p, k) for k, p in enumerate(batch)], phase, (phase - 1) * phase_s)
    # 4. recovery: a light diurnal mix
    pods += _shift(synthetic.diurnal(nodes, phase_s, rate=synthetic.auto_rate(nodes, 1000, 300.0, target=0.3),
                                     seed=seed + 4, curve=flat, mean_duration_s=300.0), 4, 3 * phase_s)
    return sorted(pods, key=lambda p: (p.creation_time, p.name))

