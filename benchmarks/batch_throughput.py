"""Batch mode throughput (issue 11, item 4): pods decided per second for 2,000 pending pods on the 1,523-node
openb cluster, per policy and batch size. Target: >= 700 pods/s.

The pods are the first ``--pods`` arrivals of openb:default's inflation plan (``sim.inflation.plan``, seed
``--seed``), the cluster starts empty, the policy is briefed with the workload (as ``agmarl eval`` does) and
warmed up on a few other pods against the starting state (a serving policy has seen the cluster before a
batch comes). Two measurements:

1. **in-process**: ``batchcore.decide_batch`` over batches of ``--batch-sizes`` pods, each batch deciding
   on the state the previous one left (what the binder does with its ``ClusterView``). Printed: wall-clock
   pods/s (median of ``--repeats`` runs, best in brackets) and pods per CPU second of this process (less
   sensitive to other load on the machine).
2. **through the batch binder** (``--binder``): the inference service's ``BatchBinder`` (``start_batch_mode``)
   with a real nats-server, fed a ``ClusterSnapshot`` and one ``PendingPod`` message per pod, binding with
   the official ``kubernetes`` client against the project's STAND-IN API server
   (``agmarl_testing.k8s_api.StandInApiServer`` in a child process: real HTTP, not Kubernetes -- no
   kube-apiserver is available here). Printed: pods/s until every pod is decided (ledger status binding, bound or unschedulable) and
   until every Binding was accepted by the stand-in, counted from the first PendingPod published (the
   messages are encoded before: in a cluster the state-collector, another process, does that). The binder
   publishes a ``Decision`` on JetStream for each bound pod, in the same process and event loop; printed: how
   many were acked (``decision_published``) and how many not (``decision_unpublished``). The Bindings are
   posted by the binder's bind worker, a child process (``agmarl_inference.bindworker``), started before the
   clock starts. Also printed: pods decided per CPU second of this process until then (the binder and the
   publishing of the PendingPods), and the CPU per pod that the bind worker, the stand-in and nats-server
   used in the same window (on this machine all of them share its 2 cores). Once the binder's runtime is
   started, what exists is moved out of the collector's full collections (``gc.freeze``), as the inference
   service's main does.

``--no-decompose`` runs the learned policy with ``actor.onnx`` as exported instead of
``serving.actor_head.DecomposedActor`` (the before/after comparison of that change, in one tree).

The load average is printed with the figures: on a shared 2-core machine they vary with it.

    nice .venv/bin/python benchmarks/batch_throughput.py
    nice .venv/bin/python benchmarks/batch_throughput.py --policies kube-default --batch-sizes 64 256 2000 --binder
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import os
import statistics
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from agmarl_common.core.cluster.model import ClusterState, Pod, state_to_dict, to_dict
from agmarl_common.core.cluster.specs import AGMARL_BATCH_SCHEDULER
from agmarl_common.core.policies.base import brief
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import catalog
from agmarl_common.core.sim.inflation import plan
from agmarl_inference.batchcore import decide_batch

TARGET = 700.0  # pods/s


def load(args: argparse.Namespace) -> tuple[tuple, list[Pod], list[Pod], list[Pod]]:
    """(nodes, the pods to decide, warm-up pods, the workload the policy is briefed with)."""
    nodes = tuple(catalog.cluster_nodes(args.nodes))
    workload = catalog.openb_pods(args.workload)
    arrivals, _ = plan(nodes, workload, np.random.default_rng(args.seed))
    pods = [replace_scheduler(p) for p in arrivals[: args.pods]]
    warm = list(arrivals[args.pods: args.pods + 8])
    return nodes, pods, warm, workload


def replace_scheduler(p: Pod) -> Pod:
    return replace(p, scheduler_name=AGMARL_BATCH_SCHEDULER)


def make_policy(name: str, seed: int, workload: list[Pod], nodes: tuple, warm: list[Pod], decompose: bool = True):
    """(the briefed policy, seconds its warm-up took): one batch of ``warm`` on the empty cluster, thrown
    away, fills what is derived once per cluster (topology domains, node masks, the model's embeddings)."""
    policy = get_policy(name, seed)
    if not decompose and getattr(policy, "head", None) is not None:
        policy.head = None  # the learned policy runs actor.onnx as exported
    brief(policy, workload)
    t0 = time.perf_counter()
    decide_batch(warm, ClusterState.empty(nodes), policy)
    return policy, time.perf_counter() - t0


def in_process(policy, nodes: tuple, pods: list[Pod], batch: int) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, pods placed) deciding ``pods`` in batches of ``batch``."""
    state = ClusterState.empty(nodes)
    placed = 0
    c0, t0 = time.process_time(), time.perf_counter()
    for k in range(0, len(pods), batch):
        placements, state = decide_batch(pods[k:k + batch], state, policy)
        placed += sum(1 for p in placements if p.node)
    return time.perf_counter() - t0, time.process_time() - c0, placed


def first_decisions(led) -> set[str]:
    """The keys of the pods ``led`` (the binder's ledger) moved to binding or unschedulable at least once, kept
    up to date as it does: the benchmark's poll then costs the measured process a ``len``, not a walk."""
    decided: set[str] = set()
    for status in ("binding", "unschedulable"):
        move = getattr(led, status)

        def moved(key: str, *args, _move=move) -> None:
            decided.add(key)
            _move(key, *args)
        setattr(led, status, moved)
    return decided


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds (user + system) process ``pid`` used so far (Linux /proc); 0 when it is gone or unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_standin(conn, node_names: list[str], pods: list[tuple[str, str]]) -> None:
    """In a child process (an API server is a process of its own): the STAND-IN API server with these nodes
    and pending pods; sends its URL, then answers "count" with the number of pods bound, until "stop"."""
    from agmarl_testing.k8s_api import StandInApiServer, node_json, pod_json  # noqa: PLC0415

    with StandInApiServer() as standin:
        for n in node_names:
            standin.add_node(node_json(n))
        for namespace, name in pods:
            standin.add_pod(pod_json(name, namespace=namespace, scheduler_name=AGMARL_BATCH_SCHEDULER))
        conn.send(standin.url)
        while conn.recv() == "count":
            conn.send(len({key for key, _ in standin.bindings}))


async def through_binder(policy, nodes: tuple, pods: list[Pod], warm: list[Pod], batch: int, work: Path) -> dict:
    """Decide and bind ``pods`` through the batch binder, the stand-in API (a child process) and a real
    nats-server."""
    from kubernetes import client  # noqa: PLC0415

    from agmarl_common.runtime import messages as m  # noqa: PLC0415
    from agmarl_common.runtime import subjects  # noqa: PLC0415
    from agmarl_common.runtime.bus import Bus  # noqa: PLC0415
    from agmarl_common.runtime.natsserver import NatsServer  # noqa: PLC0415
    from agmarl_common.runtime.service import ServiceRuntime  # noqa: PLC0415
    from agmarl_inference.batch import BatchConfig, start_batch_mode  # noqa: PLC0415
    from agmarl_inference.settings import InferenceSettings  # noqa: PLC0415

    cluster = f"bench{uuid.uuid4().hex[:6]}"
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    standin = ctx.Process(target=serve_standin, args=(child_conn, [n.name for n in nodes],
                                                      [(p.namespace, p.name) for p in pods]), daemon=True)
    standin.start()

    def ask(what: str):
        conn.send(what)
        return conn.recv()

    with NatsServer(store_dir=work / f"js-{cluster}") as nats:
        url = conn.recv()
        settings = InferenceSettings(nats_url=nats.url, cluster=cluster, trace_dir=str(work / "traces"),
                                     batch_scheduler_name=AGMARL_BATCH_SCHEDULER)
        rt = ServiceRuntime(f"inference-batch-{cluster}", settings)
        api = client.ApiClient(client.Configuration(host=url))
        cfg = BatchConfig(window_s=0.05, max_pods=batch, bind_timeout_s=30.0)
        binder = start_batch_mode(rt, settings, policy=lambda: policy, api_client=api, cfg=cfg)
        await rt.start()
        await rt.bus.ensure_streams()
        bus = await Bus.connect(nats.url, "bench-batch")
        gc.collect()  # as the inference service's main does once started (agmarl_inference.app): what lives
        gc.freeze()  # as long as the process stays out of full collections
        try:
            await bus.publish(subjects.snapshot(cluster), m.ClusterSnapshot(
                cluster=cluster, seq=1, time=time.time(), state=state_to_dict(ClusterState.empty(nodes)),
                pending=[to_dict(p) for p in pods]))
            while binder.state is None or not binder.worker.alive:  # the bind worker started, not counted
                await asyncio.sleep(0.01)
            decide_batch(warm, binder.state, policy)  # the policy has seen the view's cluster (its node tuple)
            led = binder.ledger
            decided = first_decisions(led)  # the poll is CPU of the measured process: it only counts
            # encoded before the clock starts: in a cluster the state-collector, another process, encodes them
            now = time.time()
            wire = [m.encode(m.PendingPod(cluster=cluster, pod=to_dict(p), seen_at=now, seq=1)) for p in pods]
            others = {"bind worker": binder.worker.proc.pid, "stand-in": standin.pid, "nats-server": nats.pid}
            others0 = {k: cpu_seconds(pid) for k, pid in others.items()}
            t0, c0 = time.perf_counter(), time.process_time()
            for data in wire:
                await bus.publish(subjects.pending(cluster), data)
            decided_at = bound_at = decided_cpu = None
            others_cpu: dict[str, float] = {}
            placed = bound = 0
            while bound_at is None and time.perf_counter() - t0 < 300:
                if decided_at is None:  # every pod had its first decision (a later release does not undo it)
                    if len(decided) >= len(pods):
                        decided_at, decided_cpu = time.perf_counter() - t0, time.process_time() - c0
                        others_cpu = {k: cpu_seconds(pid) - others0[k] for k, pid in others.items()}
                        placed = len(pods) - led.counts()["unschedulable"]
                else:
                    bound = await asyncio.to_thread(ask, "count")
                    if bound >= placed:
                        bound_at = time.perf_counter() - t0
                await asyncio.sleep(0.02)
            released = Counter(h.split(":", 1)[1].strip()[:60] for e in led.entries.values() for h in e.history
                               if h.startswith("queued:") or h.startswith("attempt "))
            if binder.inflight:  # Bindings the stand-in accepted whose answer the binder has not read yet
                await asyncio.wait(list(binder.inflight), timeout=30.0)
            await binder.outbox.drain(30.0)
            acked = {r: int(binder.results.labels(result=r)._value.get())
                     for r in ("decision_published", "decision_unpublished")}
            return {"decided_s": decided_at, "decided_cpu_s": decided_cpu, "others_cpu_s": others_cpu, "bound_s": bound_at,
                    "batches": binder.batches, "bound": bound, "decisions": acked,
                    "counts": led.counts(), "released": dict(released)}
        finally:
            await binder.stop()
            await bus.close()
            await rt.shutdown()
            api.close()
            gc.unfreeze()
            conn.send("stop")
            standin.join(timeout=10)
            if standin.is_alive():
                standin.terminate()


def binding_cost(n: int) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) per Binding: ``n`` sequential ``create_binding`` calls (the
    binder's) through the official client against the stand-in API in a child process."""
    from kubernetes import client  # noqa: PLC0415

    from agmarl_inference.bindworker import create_binding  # noqa: PLC0415

    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    standin = ctx.Process(target=serve_standin, args=(child_conn, ["node-a"], [("default", f"p{i}") for i in range(n)]),
                          daemon=True)
    standin.start()
    try:
        api = client.CoreV1Api(client.ApiClient(client.Configuration(host=conn.recv())))
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(n):
            create_binding(api, "default", f"p{i}", "node-a", 30.0)
        return (time.process_time() - c0) / n, (time.perf_counter() - t0) / n
    finally:
        conn.send("stop")
        standin.join(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="openb:all")
    ap.add_argument("--workload", default="openb:default")
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--policies", nargs="+", default=["kube-default", "model:default"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[64, 256, 2000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--binder", action="store_true", help="also through the batch binder and the stand-in API")
    ap.add_argument("--binder-batches", nargs="+", type=int, default=[64, 256],
                    help="the binder's max_pods (256 is the service's default: BatchConfig.max_pods)")
    ap.add_argument("--binding-cost", type=int, default=0, metavar="N",
                    help="also time N sequential Bindings (the binder's create_binding) against the stand-in")
    ap.add_argument("--no-decompose", action="store_true",
                    help="the learned policy runs actor.onnx as exported, not serving.actor_head.DecomposedActor")
    args = ap.parse_args()
    nodes, pods, warm, workload = load(args)
    print(f"batch throughput: {len(pods)} pending pods ({args.workload}, inflation order, seed {args.seed}) "
          f"on {len(nodes)} nodes ({args.nodes}); target >= {TARGET:.0f} pods/s")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    for name in args.policies:
        for batch in args.batch_sizes:
            walls, cpus, warmups, placed = [], [], [], 0
            for _ in range(args.repeats):
                policy, warmup = make_policy(name, args.seed, workload, nodes, warm,  # fresh caches each run
                                             not args.no_decompose)
                warmups.append(warmup)
                wall, cpu, placed = in_process(policy, nodes, pods, batch)
                walls.append(wall)
                cpus.append(cpu)
            rate = len(pods) / statistics.median(walls)
            verdict = "met" if rate >= TARGET else "missed"
            print(f"  in-process  {name:14s} batch {batch:5d}: {rate:7.0f} pods/s wall (best "
                  f"{len(pods) / min(walls):.0f}), {len(pods) / statistics.median(cpus):7.0f} pods/CPU-s; "
                  f"{placed}/{len(pods)} placed; target {verdict} (warm-up {1000 * statistics.median(warmups):.0f} ms "
                  f"not counted)")
    if args.binder:
        work = Path(tempfile.mkdtemp(prefix="agmarl-batch-bench-"))
        for name in args.policies:
            for batch in args.binder_batches:
                policy, _ = make_policy(name, args.seed, workload, nodes, warm, not args.no_decompose)
                r = asyncio.run(through_binder(policy, nodes, pods, warm, batch, work))
                decided = len(pods) / r["decided_s"] if r["decided_s"] else float("nan")
                bound = len(pods) / r["bound_s"] if r["bound_s"] else float("nan")
                verdict = "met" if decided >= TARGET else "missed"
                per_cpu = len(pods) / r["decided_cpu_s"] if r["decided_cpu_s"] else float("nan")
                print(f"  binder      {name:14s} batch {batch:5d}: {decided:7.0f} pods/s decided "
                      f"({per_cpu:.0f} per CPU-s of this process), "
                      f"{bound:7.0f} pods/s bound ({r['bound']} Bindings accepted by the STAND-IN API, "
                      f"{r['batches']} batches; ledger {r['counts']}; Decisions acked "
                      f"{r['decisions']['decision_published']}, unpublished {r['decisions']['decision_unpublished']}"
                      f"{'; released ' + str(r['released']) if r['released'] else ''}); target {verdict}")
                if r["decided_s"]:
                    print(f"      CPU until decided, ms per pod: binder {1e3 * r['decided_cpu_s'] / len(pods):.2f}, "
                          + ", ".join(f"{k} {1e3 * v / len(pods):.2f}" for k, v in r["others_cpu_s"].items())
                          + f" (over {r['decided_s']:.2f} s wall)")
    if args.binding_cost:
        cpu, wall = binding_cost(args.binding_cost)
        print(f"  binding cost: {1e3 * cpu:.2f} ms CPU of this process, {1e3 * wall:.1f} ms wall per Binding "
              f"({args.binding_cost} sequential create_binding calls, official client, STAND-IN API)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
