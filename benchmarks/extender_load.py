"""HTTP load on the kube-scheduler extender at openb scale (1,523 nodes, nodeCacheCapable).

Starts a private nats-server and the inference service as a real process (``python -m
agmarl_inference``), puts an active policy in KV, publishes the openb nodes with openb pods placed on
them as graph-builder publishes a full cluster graph (GraphUpdate), then replays what kube-scheduler does for each pending pod, one
pod at a time: POST /filter with all 1,523 NodeNames, then POST /prioritize with the nodes that
passed. Pods are openb pods written as v1.Pod JSON (cpu/memory requests, nvidia.com/gpu or the
alibabacloud.com/gpu-milli share annotation), so the Kubernetes conversion runs on every call.

Phase 1 (healthy): bounded by --pods and --seconds; prints p50/p99/max per verb and the
fallbacks the service counted. Phase 2: the nats-server is stopped (NATS and with it the model
path unavailable); every prioritize must still answer within the budget, with default scores.

    .venv/bin/python benchmarks/extender_load.py
    .venv/bin/python benchmarks/extender_load.py --pods 500 --policy fgd --budget-ms 100
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.filters import feasible_mask
from agmarl_common.core.cluster.compact import compact_snapshot
from agmarl_common.core.cluster.model import Pod
from agmarl_common.kube.convert import pods_on_nodes
from agmarl_common.runtime.natsserver import NatsServer
from agmarl_common.core.sim.traces import load_openb_nodes, load_openb_pods
from agmarl_testing.fixtures import ServiceProcess

CLUSTER = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pod_json(p: Pod, i: int) -> dict:
    """An openb pod as the v1.Pod kube-scheduler would send."""
    requests = {"cpu": f"{p.cpu_milli}m", "memory": f"{p.memory_mib}Mi"}
    annotations = {}
    if p.num_gpu and not p.is_gpu_share:
        requests["nvidia.com/gpu"] = str(p.num_gpu)
    elif p.is_gpu_share:
        annotations["alibabacloud.com/gpu-milli"] = str(p.gpu_milli)
    if p.gpu_spec:
        annotations["alibabacloud.com/gpu-card-model"] = "|".join(p.gpu_spec)
    return {"metadata": {"name": f"{p.name}-{i}", "namespace": "openb", "uid": f"uid-{i}",
                         "labels": {"app": "openb"}, "annotations": annotations},
            "spec": {"schedulerName": "agmarl-scheduler", "containers": [{"name": "main", "resources": {
                "requests": requests}}]},
            "status": {"phase": "Pending", "qosClass": "Burstable"}}


def preload(nodes, pods, count: int):
    """First-fit (rotating start) of ``count`` openb pods: a cluster that is partly used."""
    from agmarl_common.core.cluster.model import ClusterState, bind, choose_gpus
    state = ClusterState.empty(nodes)
    placed = 0
    for k, p in enumerate(pods[:count]):
        ok = np.flatnonzero(feasible_mask(p, state))
        if ok.size == 0:
            continue
        i = int(ok[(k * 7919) % ok.size])
        state = bind(state, p, i, choose_gpus(p, state.gpu_free()[i]) or ())
        placed += 1
    return pods_on_nodes(nodes, state.all_pods()), placed


def scrape(port: int) -> dict[str, float]:
    """Fallback and drop counters, and the server-side duration histogram of prioritize."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("agmarl_extender_fallbacks_total", "agmarl_extender_decisions_dropped_total"):
                out[f"{s.name}{{{s.labels.get('reason', '')}}}"] = s.value
            elif s.name == "agmarl_extender_request_duration_seconds_bucket" and s.labels.get("verb") == "prioritize":
                out[f"le={s.labels['le']}"] = s.value
    return out


def server_side(before: dict[str, float], after: dict[str, float], budget_s: float) -> str:
    """Server-side prioritize durations (from the histogram): requests above the budget bucket."""
    def delta(k: str) -> float:
        return after.get(k, 0.0) - before.get(k, 0.0)
    total = delta("le=+Inf")
    bounds = sorted(float(k[3:]) for k in after if k.startswith("le=") and k != "le=+Inf")
    le = next((b for b in bounds if b >= budget_s), None)
    within = delta(f"le={le}") if le is not None else total
    cumulative = {b: delta(f"le={b}") for b in bounds}
    shape = ", ".join(f"<={b * 1e3:g}ms: {n:.0f}" for b, n in cumulative.items() if 0.005 <= b <= 0.25)
    return (f"server-side prioritize over {le * 1e3 if le else float('inf'):.0f} ms: {total - within:.0f} of "
            f"{total:.0f} (cumulative: {shape})")


def counters(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | str:
    out = {k: v - before.get(k, 0.0) for k, v in after.items() if not k.startswith("le=") and v - before.get(k, 0.0)}
    return out or "none"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def run_pods(client: httpx.Client, pods: list[dict], names: list[str], seconds: float) -> dict[str, list[float]]:
    lat: dict[str, list[float]] = {"filter": [], "prioritize": []}
    deadline = time.monotonic() + seconds
    for body in pods:
        if time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        r = client.post("/filter", json={"Pod": body, "Nodes": None, "NodeNames": names})
        lat["filter"].append(time.perf_counter() - t0)
        r.raise_for_status()
        passed = r.json()["NodeNames"]
        if len(passed) < 2:  # kube-scheduler does not prioritize 0 or 1 node
            continue
        t0 = time.perf_counter()
        r = client.post("/prioritize", json={"Pod": body, "Nodes": None, "NodeNames": passed})
        lat["prioritize"].append(time.perf_counter() - t0)
        r.raise_for_status()
        assert all(0 <= h["Score"] <= 10 for h in r.json())
    return lat


def report(title: str, lat: dict[str, list[float]], budget_s: float) -> None:
    print(f"\n{title}")
    print("| verb | requests | p50 (ms) | p99 (ms) | max (ms) | over budget |")
    print("|---|---|---|---|---|---|")
    for verb, xs in lat.items():
        over = sum(1 for x in xs if x > budget_s)
        print(f"| {verb} | {len(xs)} | {pct(xs, 50) * 1e3:.2f} | {pct(xs, 99) * 1e3:.2f} | "
              f"{max(xs, default=float('nan')) * 1e3:.2f} | {over} |")


async def seed_nats(url: str, policy: str, snapshot: m.GraphUpdate | None) -> None:
    bus = await Bus.connect(url, "bench")
    try:
        if snapshot is None:
            await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.PolicySelection(
                policy=policy, reason="extender benchmark", time=time.time()))
        else:
            await bus.publish(subjects.graph(CLUSTER), snapshot)
            await bus.flush()
    finally:
        await bus.close()


def wait_ready(client: httpx.Client, proc: ServiceProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"inference exited:\n{proc.output()[-3000:]}")
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"extender not ready within {timeout}s:\n{proc.output()[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=1000, help="pods in phase 1 (2 requests each)")
    ap.add_argument("--seconds", type=float, default=60.0, help="time bound of phase 1")
    ap.add_argument("--down-pods", type=int, default=150, help="pods in phase 2 (NATS stopped)")
    ap.add_argument("--preload", type=int, default=2000, help="openb pods bound before the run")
    ap.add_argument("--policy", default="most-allocated", help="active policy (the 'model')")
    ap.add_argument("--budget-ms", type=int, default=100)
    args = ap.parse_args()
    budget_s = args.budget_ms / 1000

    nodes = load_openb_nodes()
    openb = load_openb_pods()
    state, placed = preload(nodes, openb, args.preload)
    snapshot = m.GraphUpdate(cluster=CLUSTER, epoch="bench", version=1, full=True, state=compact_snapshot(state),
                             time=time.time())
    names = [n.name for n in nodes]
    pending = [pod_json(p, i) for i, p in enumerate(openb[args.preload:args.preload + args.pods + args.down_pods])]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    print(f"nodes={len(nodes)} bound pods={placed} snapshot={len(m.encode(snapshot)) / 1e6:.2f} MB "
          f"policy={args.policy} budget={args.budget_ms} ms")

    work = Path(tempfile.mkdtemp(prefix="agmarl-extbench-"))
    http_port, metrics_port = free_port(), free_port()
    with NatsServer(store_dir=work / "js") as nats:
        asyncio.run(seed_nats(nats.url, args.policy, None))
        proc = ServiceProcess("agmarl_inference", env={
            "NATS_URL": nats.url, "AGMARL_CLUSTER": CLUSTER, "AGMARL_HTTP_PORT": str(http_port),
            "AGMARL_METRICS_PORT": str(metrics_port), "AGMARL_EXTENDER_BUDGET_MS": str(args.budget_ms),
            "AGMARL_ROLLOUT_MODE": "full", "AGMARL_LOG_LEVEL": "WARNING"}, log_path=work / "inference.log").start()
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=10.0) as client:
                deadline = time.monotonic() + 30
                while True:  # the service subscribes to graph updates once it runs
                    try:
                        client.get("/healthz")
                        break
                    except httpx.TransportError:
                        if time.monotonic() > deadline or proc.returncode is not None:
                            raise RuntimeError(proc.output()[-3000:]) from None
                        time.sleep(0.1)
                asyncio.run(seed_nats(nats.url, args.policy, snapshot))
                wait_ready(client, proc)
                active = client.get("/readyz").json()["policy"]
                if active != args.policy:
                    raise SystemExit(f"the service runs policy {active!r}, not {args.policy!r} (unknown name?)")
                run_pods(client, pending[:20], names, 30)  # warm-up, not reported
                before = scrape(metrics_port)
                lat = run_pods(client, pending[20:args.pods], names, args.seconds)
                after = scrape(metrics_port)
                report("Phase 1: healthy (NATS up, model answering)", lat, budget_s)
                print("fallbacks:", counters(before, after))
                print(server_side(before, after, budget_s))

                nats.stop()
                time.sleep(0.5)
                before = scrape(metrics_port)
                lat = run_pods(client, pending[args.pods:args.pods + args.down_pods], names, args.seconds)
                after = scrape(metrics_port)
                report("Phase 2: NATS stopped (model path unavailable, default scores)", lat, budget_s)
                print("fallbacks:", counters(before, after))
                print(server_side(before, after, budget_s))
                print(f"every prioritize answered inside the budget (client-side): "
                      f"{all(x <= budget_s for x in lat['prioritize'])}")
        finally:
            code = proc.stop()
            print(f"inference exit code: {code} (log: {work / 'inference.log'})")


if __name__ == "__main__":
    main()
