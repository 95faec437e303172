"""CPU time of the extender's own work per pod, in-process (issue 11, item 4): what the inference service does for a
nodeCacheCapable ``prioritize`` request between reading its body and writing its answer, and for the decision's
log entry, without HTTP and without NATS.

The cluster and the pods are those of ``agmarl bench extender`` (``--nodes`` nodes of 32 CPU / 128 GiB, one pod of
``--cpu`` / ``--memory`` after the other, every node named in each request). Per pod, on the thread that runs the
service's event loop (``time.thread_time``): the body parsed (``parse_args``), ``ExtenderService.prioritize``
(the request's state, the feasible mask, the default scores, the wait for the policy's scores on the model's
thread, the assumed choice), the answer's JSON (``priorities_json``), the log entry built once the binding is
observed and encoded (where ``DecisionPublisher`` builds it: on the event loop, or on a worker thread when it
waits for an explanation from the model's thread), and the policy's
``prepare`` on the state the assumption left (what the service's ``prepare_loop`` does between requests). Then
the CPU of the whole process a pod (``time.process_time``: the model's thread too). HTTP (h11, Starlette,
FastAPI), NATS (graph-builder's deltas, the log's publish) and the other processes of a real run come on top:
``agmarl bench extender`` measures those.

    .venv/bin/python benchmarks/extender_cpu.py [--nodes 1523] [--pods 400] [--policy model:default]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import numpy as np
from prometheus_client import CollectorRegistry

from agmarl_cli.extender_bench import CLUSTER, bench_nodes, pod_body
from agmarl_common.core.cluster.state import ClusterState
from agmarl_common.core.cluster.view import ClusterView
from agmarl_common.core.policies.base import brief
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.runtime import messages as m
from agmarl_inference.extender import ExtenderMetrics, ExtenderService
from agmarl_inference.extender_wire import ExtenderArgs, parse_args, priorities_json
from agmarl_inference.settings import InferenceSettings

PARTS = ("parse", "prioritize", "answer", "log entry", "prepare")


class Source:
    """The inference app as the extender sees it: the active policy, kube-default as the default, mode full."""

    def __init__(self, policy: str, objective: str):
        self.policy, self.default = get_policy(policy), get_policy("kube-default")
        brief(self.policy, objective=objective)
        self.model_version, self.mode = policy, "full"

    def set_mode(self, mode: str, reason: str) -> None:
        self.mode = mode


class Entries:
    """The decision publisher's part: keeps what ``offer`` gets, built and encoded by the caller."""

    def __init__(self) -> None:
        self.offered: list = []

    def offer(self, build, ctx, inline: bool = False) -> bool:  # noqa: ANN001 - DecisionPublisher.offer's shape
        self.offered.append((build, inline))
        return True


def stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"p50": round(float(np.percentile(a, 50)), 3), "p99": round(float(np.percentile(a, 99)), 3),
            "mean": round(float(a.mean()), 3)}


async def run(args: argparse.Namespace) -> dict:
    nodes = bench_nodes(args.nodes)
    view = ClusterView()
    view.apply_snapshot("bench", 0, ClusterState.empty(nodes))
    source = Source(args.policy, args.objective)
    settings = InferenceSettings(cluster=CLUSTER)
    ext = ExtenderService(settings, source, view, ExtenderMetrics(CollectorRegistry()))
    entries = Entries()
    ext.publisher = entries
    names = [n.name for n in nodes]
    prepare = getattr(source.policy, "prepare", None)
    parts: dict[str, list[float]] = {p: [] for p in PARTS}
    cpu0 = time.process_time()
    try:
        for k in range(args.warmup + args.pods):
            if k == args.warmup:
                cpu0 = time.process_time()
            body = json.dumps({"Pod": pod_body(k, args.cpu, args.memory), "NodeNames": names}).encode()
            t = [time.thread_time()]
            req = parse_args(ExtenderArgs, body, settings.extender_max_nodes)
            t.append(time.thread_time())
            scores = await ext.prioritize(req)
            t.append(time.thread_time())
            priorities_json(scores)
            t.append(time.thread_time())
            key = f"{req.Pod['metadata']['namespace']}/{req.Pod['metadata']['name']}"
            ext.observed([(key, ext.pending[key].node)])  # the watch saw the binding: the entry is published
            for build, inline in entries.offered:  # as DecisionPublisher builds them
                m.encode(build() if inline else await asyncio.to_thread(build))
            entries.offered.clear()
            t.append(time.thread_time())
            if callable(prepare):
                prepare(view.state)
            t.append(time.thread_time())
            if k >= args.warmup:
                for p, a, b in zip(PARTS, t, t[1:]):
                    parts[p].append((b - a) * 1e3)
        process_ms = (time.process_time() - cpu0) * 1e3 / args.pods
    finally:
        ext.close()
    event_loop = float(sum(np.mean(v) for v in parts.values()))
    return {"bench": "extender_cpu", "nodes": args.nodes, "pods": args.pods, "policy": args.policy,
            "objective": args.objective, "parts_ms": {p: stats(v) for p, v in parts.items()},
            "event_loop_ms": round(event_loop, 3), "process_ms": round(process_ms, 3),
            "other_threads_ms": round(process_ms - event_loop, 3),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1523)
    ap.add_argument("--pods", type=int, default=400, help="pods measured")
    ap.add_argument("--warmup", type=int, default=50, help="pods decided first, not measured")
    ap.add_argument("--policy", default="model:default")
    ap.add_argument("--objective", default="composite", choices=("composite", "allocation"))
    ap.add_argument("--cpu", default="100m")
    ap.add_argument("--memory", default="128Mi")
    ap.add_argument("--json", default="", help="write the report here too")
    args = ap.parse_args()
    report = asyncio.run(run(args))
    for p, s in report["parts_ms"].items():
        print(f"{p:12s} p50 {s['p50']:.3f}  p99 {s['p99']:.3f}  mean {s['mean']:.3f} ms of CPU (event-loop thread)")
    print(f"event-loop thread {report['event_loop_ms']:.3f} ms, other threads (the model's) "
          f"{report['other_threads_ms']:.3f} ms, process {report['process_ms']:.3f} ms of CPU a pod "
          f"({report['pods']} pods, {report['nodes']} nodes, {report['policy']}; load {report['load_avg_1m']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
