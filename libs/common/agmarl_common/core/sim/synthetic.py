"""Synthetic clusters and workloads for the dynamic simulator.

``synthetic_cluster`` builds mixed cpu / memory / GPU nodes (T4, A10, V100) with zone, rack and
hostname labels, some local-SSD nodes and optionally some tainted ("dedicated=batch") nodes.

Workload generators share one signature, ``gen(nodes, horizon_s, rate=None, seed=0, curve=None,
**options) -> list[Pod]`` (pods sorted by ``creation_time``, each with a ``duration``). Arrivals are
a non-homogeneous Poisson process whose rate is ``rate * curve.multiplier(t)``; ``rate`` is the
mean number of pods per second (None: sized so that about half of the cluster cpu is requested
in steady state). ``curve`` defaults to one real day of the Alibaba 2018 utilisation series
squeezed onto the horizon (that default reads a CSV; pass a curve to avoid any I/O).

The ``pressure_*`` variants (``PRESSURE_VARIANTS``) keep the cluster near full (85-90 % of its cpu
requested, flat curve) so that placement changes pending time, timeouts and SLA: steady load, GPU
fragmentation (whole and fractional GPU pods at 95 % of the GPU capacity), bursts, and node loss
(``sim_options``: the simulator settings a variant runs with, a scripted loss of 20 % of the nodes).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from agmarl_common.core.cluster.model import (
    HOSTNAME_LABEL, RACK_LABEL, ZONE_LABEL, LabelRequirement, LabelSelector, Node, NodeSelectorTerm, Pod,
    PodAffinityTerm, PreferredSchedulingTerm, Taint, Toleration, TopologySpreadConstraint,
    WeightedPodAffinityTerm,
)
from agmarl_common.core.sim.loadcurve import LoadCurve, fit_to_horizon, flat_curve, load_curve

LOCAL_SSD_LABEL = "agmarl.io/local-ssd"
NODE_KIND_LABEL = "agmarl.io/node-kind"
GPU_MODEL_LABEL = "agmarl.io/gpu-model"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
DEDICATED_TAINT = Taint("agmarl.io/dedicated", "batch", "NoSchedule")
BATCH_TOLERATION = Toleration("agmarl.io/dedicated", "Equal", "batch", "NoSchedule")

# kind -> (cpu milli, memory MiB, gpus, gpu model)
NODE_KINDS: dict[str, tuple[int, int, int, str]] = {
    "cpu": (32000, 131072, 0, ""), "mem": (32000, 262144, 0, ""), "big": (64000, 262144, 0, ""),
    "gpu-t4": (32000, 131072, 4, "T4"), "gpu-a10": (48000, 196608, 4, "A10"), "gpu-v100": (64000, 393216, 8, "V100"),
}
CPU_KINDS, CPU_KIND_P = ("cpu", "mem", "big"), (0.5, 0.25, 0.25)
GPU_KINDS, GPU_KIND_P = ("gpu-t4", "gpu-a10", "gpu-v100"), (0.4, 0.3, 0.3)
POD_CPU, POD_CPU_P = (250, 500, 1000, 2000, 4000), (0.2, 0.3, 0.3, 0.15, 0.05)  # mean 1000 milli
MEM_PER_CORE_GIB = (2, 4, 8)


def synthetic_cluster(n_nodes: int = 50, zones: int = 2, racks_per_zone: int = 4, gpu_fraction: float = 0.2,
                      local_ssd_fraction: float = 0.2, taint_fraction: float = 0.0, seed: int = 0) -> list[Node]:
    """Nodes ``node-000``.. spread round-robin over zones, then racks within a zone."""
    if n_nodes < 1 or zones < 1 or racks_per_zone < 1:
        raise ValueError("n_nodes, zones and racks_per_zone must be >= 1")
    rng = np.random.default_rng(seed)
    n_gpu = int(round(gpu_fraction * n_nodes))
    is_gpu = np.zeros(n_nodes, bool)
    is_gpu[rng.permutation(n_nodes)[:n_gpu]] = True
    ssd = rng.random(n_nodes) < local_ssd_fraction
    taint = (rng.random(n_nodes) < taint_fraction) & ~is_gpu
    nodes = []
    for i in range(n_nodes):
        kind = str(rng.choice(GPU_KINDS, p=GPU_KIND_P) if is_gpu[i] else rng.choice(CPU_KINDS, p=CPU_KIND_P))
        cpu, mem, gpus, gpu_model = NODE_KINDS[kind]
        zone = f"zone-{chr(ord('a') + i % zones)}"
        name = f"node-{i:03d}"
        labels = {ZONE_LABEL: zone, RACK_LABEL: f"{zone}-rack-{(i // zones) % racks_per_zone}",
                  HOSTNAME_LABEL: name, INSTANCE_TYPE_LABEL: kind, NODE_KIND_LABEL: kind.split("-")[0]}
        if gpus:
            labels[GPU_MODEL_LABEL] = gpu_model
        if ssd[i]:
            labels[LOCAL_SSD_LABEL] = "true"
        nodes.append(Node(name=name, cpu_milli=cpu, memory_mib=mem, gpu_count=gpus, gpu_model=gpu_model,
                          labels=labels, taints=(DEDICATED_TAINT,) if taint[i] else ()))
    return nodes


# ---------------------------------------------------------------------------------------------
# Arrival process and pod shapes


def arrival_times(curve: LoadCurve, horizon_s: float, rate: float, rng: np.random.Generator,
                  extra: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Sorted arrival times in [0, horizon): Poisson counts per bin at ``rate * m(t)``, uniform inside.

    ``extra`` multiplies the curve (e.g. bursts); the product is renormalised to mean 1 so ``rate``
    stays the mean rate.
    """
    if horizon_s <= 0 or rate < 0:
        raise ValueError("horizon_s must be > 0 and rate >= 0")
    bin_s = max(1.0, horizon_s / 20000.0)
    edges = np.arange(0.0, horizon_s, bin_s)
    width = np.minimum(edges + bin_s, horizon_s) - edges
    mult = curve.multiplier(edges + width / 2)
    if extra is not None:
        mult = mult * extra(edges + width / 2)
    mult = mult / max(float(np.average(mult, weights=width)), 1e-12)
    counts = rng.poisson(rate * mult * width)
    starts = np.repeat(edges, counts)
    times = starts + rng.random(starts.size) * np.repeat(width, counts)
    return np.sort(times)


def auto_rate(nodes: list[Node], mean_cpu_milli: float, mean_duration_s: float, target: float = 0.5) -> float:
    """Pods per second that keep ``target`` of the cluster cpu requested (Little's law)."""
    total = sum(n.cpu_milli for n in nodes)
    return target * total / (mean_cpu_milli * mean_duration_s)


def _default_curve(curve: LoadCurve | None, horizon_s: float) -> LoadCurve:
    return curve if curve is not None else fit_to_horizon(load_curve(), horizon_s)


def _size(rng: np.random.Generator) -> tuple[int, int]:
    cpu = int(rng.choice(POD_CPU, p=POD_CPU_P))
    return cpu, int(cpu * int(rng.choice(MEM_PER_CORE_GIB)) * 1024 // 1000)


def _gpu_fields(nodes: list[Node], rng: np.random.Generator) -> dict:
    """num_gpu/gpu_milli (60 % shares of 250/500 milli, else 1-2 whole GPUs) and sometimes a gpu_spec."""
    models = sorted({n.gpu_model for n in nodes if n.gpu_count})
    if rng.random() < 0.6:
        out = {"num_gpu": 1, "gpu_milli": int(rng.choice((250, 500)))}
    else:
        out = {"num_gpu": int(rng.choice((1, 2))), "gpu_milli": 1000}
    if models and rng.random() < 0.2:
        out["gpu_spec"] = (str(rng.choice(models)),)
    return out


def _has_gpu(nodes: list[Node]) -> bool:
    return any(n.gpu_count for n in nodes)


def _app_selector(app: str) -> LabelSelector:
    return LabelSelector(match_labels={"app": app})


def _pod(ns: str, idx: int, t: float, duration: float, cpu: int, mem: int, **kw) -> Pod:
    name = f"{ns}-{idx:06d}"
    return Pod(name=name, namespace=ns, uid=name, cpu_milli=cpu, memory_mib=mem, creation_time=float(t),
               duration=float(duration), **kw)


def _by_time(pods: list[Pod]) -> list[Pod]:
    return sorted(pods, key=lambda p: (p.creation_time, p.name))


# ---------------------------------------------------------------------------------------------
# Generators


def diurnal(nodes: list[Node], horizon_s: float = 3600.0, rate: float | None = None, seed: int = 0,
            curve: LoadCurve | None = None, ls_fraction: float = 0.3, gpu_fraction: float = 0.05,
            mean_duration_s: float = 600.0) -> list[Pod]:
    """Independent pods following the curve: LS web pods of 10 services and BE pods, some with GPUs."""
    rng = np.random.default_rng(seed)
    rate = auto_rate(nodes, 1000, mean_duration_s) if rate is None else rate
    times = arrival_times(_default_curve(curve, horizon_s), horizon_s, rate, rng)
    gpu_ok = _has_gpu(nodes)
    pods = []
    for k, t in enumerate(times):
        cpu, mem = _size(rng)
        duration = max(10.0, float(rng.exponential(mean_duration_s)))
        if rng.random() < ls_fraction:
            svc = f"web-{int(rng.integers(10))}"
            kw = {"qos": "LS", "service": svc, "labels": {"app": svc}}
        else:
            kw = {"qos": "BE", "tolerations": (BATCH_TOLERATION,)}
        if gpu_ok and rng.random() < gpu_fraction:
            kw.update(_gpu_fields(nodes, rng))
        pods.append(_pod("diurnal", k, t, duration, cpu, mem, **kw))
    return pods


def burst(nodes: list[Node], horizon_s: float = 3600.0, rate: float | None = None, seed: int = 0,
          curve: LoadCurve | None = None, burst_every_s: float = 600.0, burst_len_s: float = 60.0,
          burst_factor: float = 8.0, mean_duration_s: float = 300.0) -> list[Pod]:
    """Short BE pods; on top of the curve, windows of ``burst_len_s`` at ``burst_factor`` times the rate."""
    rng = np.random.default_rng(seed)
    rate = auto_rate(nodes, 1000, mean_duration_s) if rate is None else rate
    n_bursts = max(1, int(horizon_s // burst_every_s))
    starts = np.sort(rng.uniform(0.0, max(horizon_s - burst_len_s, 0.0), n_bursts))

    def bursts(t: np.ndarray) -> np.ndarray:
        inside = ((t[:, None] >= starts[None, :]) & (t[:, None] < starts[None, :] + burst_len_s)).any(axis=1)
        return np.where(inside, burst_factor, 1.0)

    times = arrival_times(_default_curve(curve, horizon_s), horizon_s, rate, rng, extra=bursts)
    gpu_ok = _has_gpu(nodes)
    pods = []
    for k, t in enumerate(times):
        cpu, mem = _size(rng)
        kw = {"qos": "BE", "tolerations": (BATCH_TOLERATION,), "service": f"job-{int(t // burst_len_s)}"}
        if gpu_ok and rng.random() < 0.05:
            kw.update(_gpu_fields(nodes, rng))
        pods.append(_pod("burst", k, t, max(5.0, float(rng.exponential(mean_duration_s))), cpu, mem, **kw))
    return pods


def _online_service(nodes: list[Node], rng: np.random.Generator, svc: str, t: float, horizon_s: float,
                    start_idx: int) -> list[Pod]:
    """2-5 LS replicas: hostname anti-affinity, zone spread (maxSkew 1), long-lived."""
    replicas = int(rng.integers(2, 6))
    cpu, mem = _size(rng)
    sel = _app_selector(svc)
    kw = {"qos": "LS", "service": svc, "labels": {"app": svc, "tier": "online"},
          "pod_anti_affinity": (PodAffinityTerm(sel, HOSTNAME_LABEL),),
          "topology_spread": (TopologySpreadConstraint(1, ZONE_LABEL, "DoNotSchedule", sel),)}
    duration = float(rng.uniform(0.5, 1.5)) * horizon_s
    return [_pod("online", start_idx + r, t + float(rng.uniform(0, 5)), duration, cpu, mem, **kw)
            for r in range(replicas)]


def _batch_job(nodes: list[Node], rng: np.random.Generator, job: str, t: float, start_idx: int,
               gpu_ok: bool, gpu_fraction: float) -> list[Pod]:
    """1-20 BE tasks created together, short, some GPU-share tasks."""
    tasks = int(min(20, rng.geometric(0.2)))
    cpu, mem = _size(rng)
    kw = {"qos": "BE", "service": job, "labels": {"job": job, "tier": "batch"}, "tolerations": (BATCH_TOLERATION,)}
    if gpu_ok and rng.random() < gpu_fraction:
        kw.update({"num_gpu": 1, "gpu_milli": int(rng.choice((250, 500)))})
    return [_pod("batch", start_idx + k, t, max(10.0, float(rng.exponential(120.0))), cpu, mem, **kw)
            for k in range(tasks)]


def batch_online_mix(nodes: list[Node], horizon_s: float = 3600.0, rate: float | None = None, seed: int = 0,
                     curve: LoadCurve | None = None, online_fraction: float = 0.3,
                     gpu_fraction: float = 0.15) -> list[Pod]:
    """LS online services (replicas with anti-affinity and zone spread) and bursty BE batch jobs."""
    rng = np.random.default_rng(seed)
    if rate is None:  # online pods live ~horizon, batch ~120 s; size on the mean duration
        mean_dur = online_fraction * min(horizon_s, 3600.0) / 2 + (1 - online_fraction) * 120.0
        rate = auto_rate(nodes, 1000, mean_dur)
    curve = _default_curve(curve, horizon_s)
    gpu_ok = _has_gpu(nodes)
    pods: list[Pod] = []
    for k, t in enumerate(arrival_times(curve, horizon_s, rate * online_fraction / 3.5, rng)):
        pods += _online_service(nodes, rng, f"svc-{k}", float(t), horizon_s, len(pods))
    n_online = len(pods)
    for k, t in enumerate(arrival_times(curve, horizon_s, rate * (1 - online_fraction) / 5.0, rng)):
        pods += _batch_job(nodes, rng, f"job-{k}", float(t), len(pods) - n_online, gpu_ok, gpu_fraction)
    return _by_time(pods)


def _affinity_fields(nodes: list[Node], rng: np.random.Generator, svc: str) -> dict:
    """One of five constraint profiles, chosen per pod."""
    zones = sorted({n.labels.get(ZONE_LABEL, "") for n in nodes} - {""})
    sel = _app_selector(svc)
    profile = int(rng.integers(5))
    if profile == 0:
        return {"node_selector": {LOCAL_SSD_LABEL: "true"}}
    if profile == 1 and zones:
        z = str(rng.choice(zones))
        return {"required_node_affinity": (NodeSelectorTerm((LabelRequirement(ZONE_LABEL, "In", (z,)),)),)}
    if profile == 2:
        return {"pod_affinity": (PodAffinityTerm(sel, ZONE_LABEL),)}
    if profile == 3:
        return {"pod_anti_affinity": (PodAffinityTerm(sel, HOSTNAME_LABEL),),
                "topology_spread": (TopologySpreadConstraint(2, RACK_LABEL, "ScheduleAnyway", sel),
                                    TopologySpreadConstraint(1, ZONE_LABEL, "DoNotSchedule", sel))}
    pref = NodeSelectorTerm((LabelRequirement(NODE_KIND_LABEL, "In", ("cpu", "big")),))
    return {"preferred_node_affinity": (PreferredSchedulingTerm(50, pref),),
            "preferred_pod_anti_affinity": (WeightedPodAffinityTerm(100, PodAffinityTerm(sel, HOSTNAME_LABEL)),)}


def affinity_heavy(nodes: list[Node], horizon_s: float = 3600.0, rate: float | None = None, seed: int = 0,
                   curve: LoadCurve | None = None, n_services: int = 20, mean_duration_s: float = 900.0) -> list[Pod]:
    """Pods of ``n_services`` services, each pod with a node selector, zone affinity, pod (anti-)affinity,
    spread or preferred terms."""
    rng = np.random.default_rng(seed)
    rate = auto_rate(nodes, 1000, mean_duration_s) if rate is None else rate
    times = arrival_times(_default_curve(curve, horizon_s), horizon_s, rate, rng)
    pods = []
    for k, t in enumerate(times):
        svc = f"aff-{int(rng.integers(n_services))}"
        cpu, mem = _size(rng)
        kw = {"qos": "LS" if rng.random() < 0.5 else "BE", "service": svc, "labels": {"app": svc}}
        kw.update(_affinity_fields(nodes, rng, svc))
        pods.append(_pod("affinity", k, t, max(10.0, float(rng.exponential(mean_duration_s))), cpu, mem, **kw))
    return pods


# ---------------------------------------------------------------------------------------------
# High pressure: a cluster kept near full, where placement changes waits, timeouts and SLA

WHOLE_GPUS, WHOLE_GPUS_P = (1, 2, 4), (0.5, 0.35, 0.15)  # whole-GPU pods: devices per pod
SHARE_MILLI = (250, 500)  # fractional GPU pods: milli of one device


def _bursts(rng: np.random.Generator, horizon_s: float, every_s: float, len_s: float, factor: float
            ) -> Callable[[np.ndarray], np.ndarray] | None:
    """An arrival multiplier: ``factor`` inside windows of ``len_s`` (one per ``every_s``, seeded starts), 1 else."""
    if factor == 1.0:
        return None
    starts = np.sort(rng.uniform(0.0, max(horizon_s - len_s, 0.0), max(1, int(horizon_s // every_s))))

    def extra(t: np.ndarray) -> np.ndarray:
        inside = ((t[:, None] >= starts[None, :]) & (t[:, None] < starts[None, :] + len_s)).any(axis=1)
        return np.where(inside, factor, 1.0)
    return extra


def _gpu_pod_fields(rng: np.random.Generator, whole_share: float) -> dict:
    """A whole-GPU pod (1, 2 or 4 devices) with probability ``whole_share``, else a 250/500-milli share."""
    if rng.random() < whole_share:
        return {"num_gpu": int(rng.choice(WHOLE_GPUS, p=WHOLE_GPUS_P)), "gpu_milli": 1000}
    return {"num_gpu": 1, "gpu_milli": int(rng.choice(SHARE_MILLI))}


def pressure_rates(nodes: list[Node], target: float, gpu_target: float, whole_share: float,
                   mean_duration_s: float) -> tuple[float, float]:
    """(cpu-only pods/s, GPU pods/s) that request ``target`` of the cluster cpu and ``gpu_target`` of its
    GPU milli in steady state (Little's law; GPU pods bring 1000 milli cpu on average too)."""
    gpu_cap = sum(n.gpu_count for n in nodes) * 1000.0
    mean_gpu = whole_share * 1000.0 * float(np.dot(WHOLE_GPUS, WHOLE_GPUS_P)) + (1 - whole_share) * np.mean(SHARE_MILLI)
    r_gpu = gpu_target * gpu_cap / (mean_gpu * mean_duration_s) if gpu_cap else 0.0
    cpu_cap = sum(n.cpu_milli for n in nodes)
    r_cpu = max(target * cpu_cap - r_gpu * 1000.0 * mean_duration_s, 0.0) / (1000.0 * mean_duration_s)
    return r_cpu, r_gpu


def pressure(nodes: list[Node], horizon_s: float = 3600.0, rate: float | None = None, seed: int = 0,
             curve: LoadCurve | None = None, target: float = 0.9, gpu_target: float = 0.0,
             whole_gpu_share: float = 0.4, ls_fraction: float = 0.3, burst_factor: float = 1.0,
             burst_every_s: float = 300.0, burst_len_s: float = 60.0, mean_duration_s: float = 300.0,
             warm_start: bool = True) -> list[Pod]:
    """Independent pods that keep ``target`` of the cluster cpu requested in steady state (and ``gpu_target``
    of its GPUs, mixed whole and fractional GPU pods), LS web pods of 10 services and BE pods, durations
    exponential (mean ``mean_duration_s``), optionally bursts (``burst_factor`` times the rate inside
    ``burst_len_s`` windows, mean rate unchanged). The curve defaults to flat: the pressure is steady.
    ``warm_start``: the steady-state population (Poisson, mean rate x mean duration per stream) arrives at
    t = 0, so the cluster is under pressure from the first minute instead of after one mean duration.
    ``rate`` (pods/s), when given, scales both streams to it."""
    rng = np.random.default_rng(seed)
    curve = curve if curve is not None else flat_curve()
    gpu_ok = _has_gpu(nodes)
    r_cpu, r_gpu = pressure_rates(nodes, target, gpu_target if gpu_ok else 0.0, whole_gpu_share, mean_duration_s)
    if rate is not None:
        k = rate / max(r_cpu + r_gpu, 1e-12)
        r_cpu, r_gpu = r_cpu * k, r_gpu * k
    extra = _bursts(rng, horizon_s, burst_every_s, burst_len_s, burst_factor)
    pods = []
    for stream, r in (("pressure", r_cpu), ("gpu", r_gpu)):
        if r <= 0:
            continue
        times = arrival_times(curve, horizon_s, r, rng, extra=extra)
        if warm_start:
            times = np.concatenate([np.zeros(rng.poisson(r * mean_duration_s)), times])
        for k, t in enumerate(times):
            cpu, mem = _size(rng)
            if rng.random() < ls_fraction:
                svc = f"web-{int(rng.integers(10))}"
                kw = {"qos": "LS", "service": svc, "labels": {"app": svc}}
            else:
                kw = {"qos": "BE", "tolerations": (BATCH_TOLERATION,)}
            if stream == "gpu":
                kw.update(_gpu_pod_fields(rng, whole_gpu_share))
            pods.append(_pod(stream, k, t, max(10.0, float(rng.exponential(mean_duration_s))), cpu, mem, **kw))
    return _by_time(pods)


PRESSURE_VARIANTS: dict[str, dict] = {  # name -> options of ``pressure``
    "pressure_load": {"target": 0.95, "gpu_target": 0.5},
    "pressure_gpu_frag": {"target": 0.85, "gpu_target": 1.0, "whole_gpu_share": 0.4},
    "pressure_burst": {"target": 0.9, "gpu_target": 0.5, "burst_factor": 6.0},
    "pressure_node_loss": {"target": 0.9, "gpu_target": 0.5},
}
PRESSURE_PENDING_TIMEOUT_S = 300.0  # a pressure run counts a pod pending this long as unschedulable
NODE_LOSS = {"pressure_node_loss": (1 / 3, 0.2, 1 / 3)}  # name -> (at, share of nodes, for), times x horizon


def _variant(options: dict) -> Callable[..., list[Pod]]:
    def gen(nodes: list[Node], horizon_s: float = 3600.0, rate: float | None = None, seed: int = 0,
            curve: LoadCurve | None = None, **more) -> list[Pod]:
        return pressure(nodes, horizon_s, rate, seed, curve, **{**options, **more})
    return gen


def sim_options(name: str, horizon_s: float) -> dict[str, float]:
    """The ``SimConfig`` fields a named workload runs with: for the pressure variants a shorter pending
    timeout and, for ``pressure_node_loss``, the scripted loss of 20 % of the nodes from a third of the
    horizon to two thirds; {} for the others."""
    if name not in PRESSURE_VARIANTS:
        return {}
    out = {"pending_timeout_s": PRESSURE_PENDING_TIMEOUT_S}
    if name in NODE_LOSS:
        at, share, length = NODE_LOSS[name]
        out.update(node_loss_at_s=at * horizon_s, node_loss_fraction=share, node_loss_s=length * horizon_s)
    return out


Generator = Callable[..., list[Pod]]
SYNTHETIC_WORKLOADS: dict[str, Generator] = {
    "diurnal": diurnal, "burst": burst, "batch_online_mix": batch_online_mix, "affinity_heavy": affinity_heavy,
    **{name: _variant(options) for name, options in PRESSURE_VARIANTS.items()},
}


def generate(name: str, nodes: list[Node], horizon_s: float = 3600.0, rate: float | None = None, seed: int = 0,
             **options) -> list[Pod]:
    """``SYNTHETIC_WORKLOADS[name](nodes, horizon_s, rate, seed, **options)``."""
    if name not in SYNTHETIC_WORKLOADS:
        raise ValueError(f"unknown synthetic workload {name!r}; known: {sorted(SYNTHETIC_WORKLOADS)}")
    return SYNTHETIC_WORKLOADS[name](nodes, horizon_s=horizon_s, rate=rate, seed=seed, **options)
