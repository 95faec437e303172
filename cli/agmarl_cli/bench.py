"""`agmarl bench latency`: how long the learned policy takes to score pending pods, served as in production.

The model runs in ONNX Runtime on one core (the process is pinned to one CPU and the sessions use one
thread). The cluster is the openb node list (1,523 nodes; fewer: its first N; more: the list replicated
with renamed copies, e.g. 5,000) partially filled with openb pods placed by a baseline (BestFit). Then,
in steady state, pods of the openb workload arrive one at a time (or in batches of B): the hard filter
gives the candidates (not timed), the policy scores them (timed: features, encoder, actor, and the device
choice), the picks are bound and as many running pods finish, so a few node rows change between decisions and
the caches (node rows, node embeddings) are warm but must follow the changes. Warm-up steps are not
measured. Besides wall time, the report gives the CPU time of the scoring thread and the load average:
on a shared machine wall time also counts other processes' slices (docs/performance.md).
``compare_latency`` runs two models alternately in one process from the same filled cluster (the INT8
variant against its float model: ``benchmarks/quantised_model.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from agmarl_common.serving import modelstore
from agmarl_common.core.cluster.filters import feasible_nodes, fits_gpu, fits_resources
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, unbind_at
from agmarl_common.core.sim import traces

# (nodes, batch) -> the p99 target in ms (docs/model.md, "Serving latency")
TARGETS_MS = {(1523, 1): 5.0, (5000, 1): 10.0, (1523, 64): 50.0}


@dataclass(frozen=True)
class BenchSpec:
    nodes: int = 1523
    batch: int = 1
    model: str = "default"
    steps: int = 300  # measured decisions (batches when batch > 1)
    warmup: int = 50
    fill: int = -1  # pods bound before measuring; -1 = 2 per node
    seed: int = 0
    pin: bool = True  # one CPU core
    objective: str = "composite"  # what the model optimises (features.OBJECTIVES); the serving default


def pin_one_core() -> int | None:
    """Pin this process to one of its allowed CPUs (the first); None where affinity is unsupported."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def cluster_nodes(n: int) -> tuple[Node, ...]:
    """The openb node list (1,523 nodes): its first ``n``, or replicated with renamed copies up to ``n``."""
    base = traces.load_openb_nodes(traces.openb_node_path(traces.ALL_NODES))
    if n <= len(base):
        return base[:n]
    k = len(base)
    return tuple(base[i] if i < k else replace(base[i % k], name=f"{base[i % k].name}-r{i // k}") for i in range(n))


def _place_baseline(policy, pod: Pod, state: ClusterState) -> ClusterState:
    cand = feasible_nodes(pod, state)
    if cand.size == 0:
        return state
    i = int(cand[int(np.argmax(policy.score(pod, state, cand)))])
    gpus = policy.choose_gpus(pod, state, i)
    return state if gpus is None else bind(state, pod, i, gpus)


def filled_state(nodes: Sequence[Node], workload: Sequence[Pod], count: int, rng: np.random.Generator) -> ClusterState:
    """``count`` pods of the workload (renamed, so keys are unique) placed by BestFit."""
    from agmarl_common.core.policies.registry import get_policy  # noqa: PLC0415

    bestfit = get_policy("bestfit")
    state = ClusterState.empty(nodes)
    for k, j in enumerate(rng.integers(0, len(workload), size=count)):
        state = _place_baseline(bestfit, replace(workload[j], name=f"fill-{k}"), state)
    return state


_STARTS: dict[tuple[int, int, int], tuple[ClusterState, dict]] = {}


def start_state(n_nodes: int, fill: int, seed: int) -> tuple[ClusterState, np.random.Generator]:
    """(the filled cluster, the generator after filling it) for (nodes, fill, seed): built once per process,
    so runs of several models in one process (``compare_latency``) start from the same state."""
    key = (n_nodes, fill, seed)
    if key not in _STARTS:
        rng = np.random.default_rng(seed)
        workload = traces.load_openb_pods(traces.openb_pod_path("default"))
        _STARTS[key] = (filled_state(cluster_nodes(n_nodes), workload, fill, rng), rng.bit_generator.state)
    state, rng_state = _STARTS[key]
    rng = np.random.default_rng()
    rng.bit_generator.state = rng_state
    return state, rng


def _fits(pod: Pod, state: ClusterState, i: int) -> bool:
    return fits_resources(pod, state, i).ok and fits_gpu(pod, state, i).ok


def _churn(state: ClusterState, rng: np.random.Generator, count: int) -> ClusterState:
    """``count`` running pods finish (steady state: the cluster neither fills up nor drains)."""
    for _ in range(count):
        busy = np.flatnonzero(state.pods_used > 0)
        if busy.size == 0:
            return state
        i = int(rng.choice(busy))
        state = unbind_at(state, i, state.bound[i][int(rng.integers(len(state.bound[i])))].key)
    return state


def _step(policy, pods: list[Pod], state: ClusterState, batch: int) -> tuple[float, float, ClusterState, int, int]:
    """(seconds the policy took, CPU seconds it used, state after binding its picks, candidates scored,
    pods bound). The CPU time (this thread's; ONNX Runtime runs on it with one thread) does not count
    the time other processes held the core, so it stays meaningful on a shared machine."""
    cands = [feasible_nodes(p, state) for p in pods]
    keep = [k for k, c in enumerate(cands) if c.size]
    pods, cands = [pods[k] for k in keep], [cands[k] for k in keep]
    if not pods:
        return -1.0, -1.0, state, 0, 0
    c0, t0 = time.thread_time(), time.perf_counter()
    if batch == 1:
        scores = policy.score(pods[0], state, cands[0])
        pick = int(cands[0][int(np.argmax(scores))])
        gpus = policy.choose_gpus(pods[0], state, pick)
        elapsed, cpu = time.perf_counter() - t0, time.thread_time() - c0
        picks = [(pods[0], pick, gpus)]
    else:
        scores = policy.score_batch(pods, state, cands)
        elapsed, cpu = time.perf_counter() - t0, time.thread_time() - c0
        picks = [(p, int(c[int(np.argmax(s))]), None) for p, c, s in zip(pods, cands, scores)]
    bound = 0
    for p, i, gpus in picks:  # the arbiter: picks that still fit, in order
        if batch > 1:
            gpus = policy.choose_gpus(p, state, i) if _fits(p, state, i) else None
        if gpus is not None:
            state = bind(state, p, i, gpus)
            bound += 1
    return elapsed, cpu, state, sum(int(c.size) for c in cands), bound


def run_latency(spec: BenchSpec) -> dict[str, Any]:
    """Measure; returns the report (latencies in ms)."""
    from agmarl_common.serving.onnx_model import OnnxModelPolicy  # noqa: PLC0415

    if spec.nodes < 1 or spec.batch < 1 or spec.steps < 1 or spec.warmup < 0:
        raise ValueError("--nodes, --batch and --steps must be >= 1, --warmup >= 0")
    cpu = pin_one_core() if spec.pin else None
    artifact = modelstore.load_local(spec.model, trust=modelstore.trust_from_environment())
    policy = OnnxModelPolicy(artifact, objective=spec.objective)
    workload = traces.load_openb_pods(traces.openb_pod_path("default"))
    policy.observe_workload(workload)
    t0 = time.perf_counter()
    fill = 2 * spec.nodes if spec.fill < 0 else spec.fill
    state, rng = start_state(spec.nodes, fill, spec.seed)
    fill_s = time.perf_counter() - t0
    times, cpu_times, cand_counts, seq = [], [], [], 0
    for step in range(spec.warmup + spec.steps):
        pods = []
        for _ in range(spec.batch):
            seq += 1
            pods.append(replace(workload[int(rng.integers(len(workload)))], name=f"bench-{seq}"))
        elapsed, cpu_s, state, n_cand, bound = _step(policy, pods, state, spec.batch)
        state = _churn(state, rng, max(bound, 1))
        if step >= spec.warmup and elapsed >= 0:
            times.append(elapsed * 1e3)
            cpu_times.append(cpu_s * 1e3)
            cand_counts.append(n_cand)
    t, c = np.asarray(times), np.asarray(cpu_times)
    gpu_cap = int(state.gpu_count.sum()) * 1000
    report = {
        "bench": "latency", "nodes": spec.nodes, "batch": spec.batch, "objective": spec.objective,
        "model": artifact.source,
        "model_version": artifact.version, "steps": int(t.size), "warmup": spec.warmup, "cpu": cpu,
        "onnx_threads": 1, "fill_pods": int(state.pods_used.sum()), "fill_s": round(fill_s, 2),
        "gpu_alloc_pct": round(100.0 * int(state.gpu_used.sum()) / max(gpu_cap, 1), 1),
        "candidates_mean": round(float(np.mean(cand_counts)), 1) if cand_counts else 0.0,
        "p50_ms": round(float(np.percentile(t, 50)), 3) if t.size else None,
        "p99_ms": round(float(np.percentile(t, 99)), 3) if t.size else None,
        "mean_ms": round(float(t.mean()), 3) if t.size else None,
        "max_ms": round(float(t.max()), 3) if t.size else None,
        "cpu_p50_ms": round(float(np.percentile(c, 50)), 3) if c.size else None,
        "cpu_p99_ms": round(float(np.percentile(c, 99)), 3) if c.size else None,
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "encoder_full_passes": policy._cache.full_passes, "encoder_partial_passes": policy._cache.partial_passes,
    }
    target = TARGETS_MS.get((spec.nodes, spec.batch))
    if target is not None and t.size:
        report["target_p99_ms"] = target
        report["within_target"] = bool(report["p99_ms"] <= target)
    return report


def compare_latency(spec: BenchSpec, other: str, rounds: int = 2) -> dict[str, Any]:
    """``spec.model`` against the model ``other`` on the same cluster, seed and steps, in this process:
    ``rounds`` alternating runs of each (A B A B ...), so both see the same load. Returns {"base": [reports],
    "other": [reports], "ratio": {p50_ms, p99_ms, cpu_p50_ms, cpu_p99_ms: median over rounds of other / base}}."""
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "other": []}
    for _ in range(rounds):
        runs["base"].append(run_latency(spec))
        runs["other"].append(run_latency(replace(spec, model=other)))
    keys = ("p50_ms", "p99_ms", "cpu_p50_ms", "cpu_p99_ms")
    ratio = {k: round(float(np.median([o[k] / b[k] for b, o in zip(runs["base"], runs["other"])])), 3) for k in keys}
    return {**runs, "ratio": ratio}


def latency_command(spec: BenchSpec, json_path: str | None) -> int:
    try:
        report = run_latency(spec)
    except (ValueError, KeyError, OSError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"agmarl bench: error: {' '.join(str(msg).split())}", file=sys.stderr)
        return 2
    what = "1 pod" if spec.batch == 1 else f"a batch of {spec.batch} pods"
    print(f"scoring {what} on {spec.nodes} nodes ({report['candidates_mean']:.0f} candidates, "
          f"model {report['model_version']}, ONNX Runtime on 1 core): p50 {report['p50_ms']} ms, "
          f"p99 {report['p99_ms']} ms over {report['steps']} steps (CPU time p50 {report['cpu_p50_ms']} ms, "
          f"p99 {report['cpu_p99_ms']} ms; load average {report['load_avg_1m']})"
          + (f" (target p99 <= {report['target_p99_ms']} ms: {'met' if report['within_target'] else 'MISSED'})"
             if "target_p99_ms" in report else ""))
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return 0
