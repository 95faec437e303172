"""AGMARL-DKS against a REAL kube-apiserver and kube-scheduler (v1.36 from tools/kube/build.sh, or v1.20.2 from
tools/kube/build_debian.py; tools/kube/control_plane.py runs them on loopback). docs/kube-real.md has the figures
and the commands.

    .venv/bin/python benchmarks/kube_real.py [--nodes 100] [--pods 2000] \
        [--modes alone,hybrid,full,batch,hybrid-kill] [--json OUT.json]

Every mode gets a fresh control plane (etcd on a temp dir, kube-apiserver, N Nodes of 32 CPU / 128Gi /
110 pods made Ready through the status subresource; no kubelet, so bound pods stay Pending with
``spec.nodeName``), then ``--pods`` pods of 100m / 128Mi created as fast as the client allows
(``--create-threads`` threads, bounded by the count and ``--timeout``):

- ``alone``: kube-scheduler with the hybrid overlay's KubeSchedulerConfiguration minus its extender (same
  profile, qps, percentageOfNodesToScore): the rate the others are compared with;
- ``hybrid`` / ``full``: the overlay's shipped config, only the kubeconfig and the extender URL changed,
  with the AGMARL services started by ``agmarl up --source kubernetes`` in that rollout mode;
- ``batch``: no kube-scheduler; pods name ``agmarl-batch-scheduler`` and inference's batch mode places and
  binds them (``agmarl up --batch-scheduler agmarl-batch-scheduler``, rollout mode full as the batch overlay);
- ``hybrid-kill``: hybrid, with the inference process SIGKILLed (by its PID, from ``agmarl up``'s run.json)
  when a third of the pods are bound; ``agmarl up`` restarts it (the pods kube-scheduler places alone meanwhile
  are logged by the new process as ``unassisted``: the log column counts them, "(N u)").

Per mode: pods/s from the first create to the last binding (and the create rate alone), the ratio to
``alone``, every pod bound?, overcommitted nodes (sum of requests > allocatable, per resource), the pods
on the fullest and emptiest node, the extender's fallbacks and server-side time (inference /metrics), and
whether the decision log (``agmarl decisions tail``) names the node each pod was really bound to.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "kube"))
import control_plane as rig  # noqa: E402 - tools/kube is not a package (not shipped)

from agmarl_cli.monitor import cpu_used, process_cpu_seconds  # noqa: E402 - after the rig's path

AGMARL = str(Path(sys.executable).with_name("agmarl"))
EXTENDER_SCHEDULER = "agmarl-scheduler"  # deploy/k8s overlays' profile
BATCH_SCHEDULER = "agmarl-batch-scheduler"  # deploy/k8s/overlays/batch
NAMESPACE = "bench"
MODES = ("alone", "hybrid", "full", "batch", "hybrid-kill")
# rollout settings of each overlay (deploy/k8s/overlays/<mode>/kustomization.yaml)
OVERLAY_ENV = {
    "hybrid": {"AGMARL_ROLLOUT_MODE": "hybrid", "AGMARL_DEFAULT_MODE": "hybrid", "AGMARL_HYBRID_MODEL_WEIGHT": "0.7"},
    "full": {"AGMARL_ROLLOUT_MODE": "full", "AGMARL_DEFAULT_MODE": "full"},
    "batch": {"AGMARL_ROLLOUT_MODE": "full", "AGMARL_DEFAULT_MODE": "full"},
}
DECISION_LINE = re.compile(r"^\S+\s+(\S+/\S+)\s+->\s+(\S+)\s+policy=(\S+) score=(\S+) mode=(\S+) trace=(\S*)")


# ---------------------------------------------------------------------------------------------------
# Pure helpers (tests/e2e/test_kube_real_helpers.py)

_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def cpu_milli(q: str) -> int:
    q = str(q)
    if q.endswith("m"):
        return int(q[:-1])
    return int(round(float(q) * 1000))


def mem_bytes(q: str) -> int:
    q = str(q)
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * _SUFFIX[suffix])
    return int(float(q))


def node_usage(pods: list[dict[str, Any]], nodes: dict[str, dict[str, str]]) -> dict[str, Any]:
    """``pods``: {"node", "cpu", "memory"} of bound pods; ``nodes``: name -> allocatable. Per node the pods
    and the requests summed; overcommitted: any resource (cpu, memory, pod count) past allocatable."""
    per = {n: {"pods": 0, "cpu_m": 0, "mem": 0} for n in nodes}
    for p in pods:
        u = per.setdefault(p["node"], {"pods": 0, "cpu_m": 0, "mem": 0})
        u["pods"] += 1
        u["cpu_m"] += cpu_milli(p.get("cpu") or "0")
        u["mem"] += mem_bytes(p.get("memory") or "0")
    over = []
    for n, u in per.items():
        alloc = nodes.get(n)
        if alloc is None:
            over.append({"node": n, "why": "not a node"})
            continue
        for key, cap in (("cpu_m", cpu_milli(alloc["cpu"])), ("mem", mem_bytes(alloc["memory"])),
                         ("pods", int(alloc.get("pods", "110")))):
            if u[key] > cap:
                over.append({"node": n, "resource": key, "requested": u[key], "allocatable": cap})
    counts = [u["pods"] for u in per.values()] or [0]
    return {"per_node": per, "overcommitted": over, "max_pods_per_node": max(counts),
            "min_pods_per_node": min(counts),
            "stdev_pods_per_node": round(statistics.pstdev(counts), 2) if len(counts) > 1 else 0.0}


def parse_decisions(text: str) -> dict[str, list[str]]:
    """``agmarl decisions tail`` output -> pod key -> the nodes its log entries name, in order."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        found = DECISION_LINE.match(line.strip())
        if found:
            out.setdefault(found.group(1), []).append(found.group(2))
    return out


def decision_agreement(logged: dict[str, list[str]], bindings: dict[str, str]) -> dict[str, Any]:
    """Per bound pod: does the log's last entry name its binding? (and: more than one entry?)"""
    matched, wrong, missing, several = 0, [], [], 0
    for key, node in bindings.items():
        nodes = logged.get(key)
        if not nodes:
            missing.append(key)
            continue
        several += len(nodes) > 1
        if nodes[-1] == node:
            matched += 1
        else:
            wrong.append({"pod": key, "logged": nodes[-1], "bound": node})
    return {"bound": len(bindings), "matched": matched, "wrong": len(wrong), "missing": len(missing),
            "pods_with_several_entries": several, "examples_wrong": wrong[:5], "examples_missing": missing[:5]}


def prom_samples(text: str, name: str) -> dict[str, float]:
    """Prometheus text -> {label string: value} for one metric name (labels "" when none)."""
    out: dict[str, float] = {}
    pat = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)")
    for line in text.splitlines():
        found = pat.match(line)
        if found:
            out[found.group(1) or ""] = float(found.group(2))
    return out


def label(labels: str, key: str) -> str:
    found = re.search(rf'{key}="([^"]*)"', labels)
    return found.group(1) if found else ""


# ---------------------------------------------------------------------------------------------------
# The run

def pod_manifest(name: str, scheduler: str, cpu: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE,
                                                            "labels": {"app": "kube-real"}},
            "spec": {"schedulerName": scheduler, "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}


class BindingWatch:
    """Watches the namespace's pods; records when each first shows ``spec.nodeName``."""

    def __init__(self, cp: rig.ControlPlane, deadline: float):
        from kubernetes import client

        self.api = client.CoreV1Api(cp.api_client())
        self.bound: dict[str, tuple[str, float]] = {}
        self.lock = threading.Lock()
        self.deadline = deadline
        self.stopped = threading.Event()
        self.errors: list[str] = []
        self.relists = 0
        rv = self._relist()
        self.thread = threading.Thread(target=self._run, args=(rv,), daemon=True)
        self.thread.start()

    def _record(self, obj: Any, at: float) -> None:
        if obj.spec and obj.spec.node_name:
            with self.lock:
                self.bound.setdefault(f"{obj.metadata.namespace}/{obj.metadata.name}", (obj.spec.node_name, at))

    def _relist(self) -> str:
        """Every bound pod the list shows (a binding a broken watch missed is counted now, at this time) and the
        resourceVersion to watch from."""
        pods = self.api.list_namespaced_pod(NAMESPACE)
        now = time.monotonic()
        for obj in pods.items:
            self._record(obj, now)
        return pods.metadata.resource_version

    def _run(self, rv: str) -> None:
        from kubernetes import watch

        while not self.stopped.is_set() and time.monotonic() < self.deadline:
            w = watch.Watch()
            try:
                for ev in w.stream(self.api.list_namespaced_pod, NAMESPACE, resource_version=rv,
                                   timeout_seconds=max(1, min(30, int(self.deadline - time.monotonic()))),
                                   allow_watch_bookmarks=True):
                    obj = ev["object"]
                    if ev["type"] == "ERROR":  # a Status (a dict), e.g. 410 Gone: relist and watch again
                        raise RuntimeError(f"watch ERROR event: {str(obj)[:160]}")
                    if ev["type"] == "BOOKMARK":  # the client leaves it a dict: only its resourceVersion counts
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        continue
                    rv = obj.metadata.resource_version or rv
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._record(obj, time.monotonic())
                    if self.stopped.is_set():
                        break
            except Exception as exc:  # noqa: BLE001 - a watch expiring (410): relist and go on
                self.errors.append(str(exc)[:200])
                with contextlib.suppress(Exception):
                    rv = self._relist()
                    self.relists += 1
            finally:
                w.stop()

    def count(self) -> int:
        with self.lock:
            return len(self.bound)

    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        self.thread.join(timeout=2)  # a blocked read ends with its watch timeout; the thread is a daemon


class AgmarlUp:
    """``agmarl up --source kubernetes`` as a child process (its own state dir), ended by its PID."""

    def __init__(self, mode: str, kubeconfig: Path, work: Path, cluster: str):
        self.state = work / "agmarl-state"
        self.cluster = cluster
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGMARL_") and k != "NATS_URL"}
        env.update({"AGMARL_STATE_DIR": str(self.state), **OVERLAY_ENV["batch" if mode == "batch" else
                                                                       mode.replace("-kill", "")]})
        self.env = env
        argv = [AGMARL, "up", "--source", "kubernetes", "--kubeconfig", str(kubeconfig), "--cluster", cluster,
                "--no-view"]
        if mode == "batch":
            argv += ["--batch-scheduler", BATCH_SCHEDULER]
        self.log = (work / "agmarl-up.log").open("wb")
        self.proc = subprocess.Popen(argv, env=env, cwd=str(work), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def run_info(self) -> dict[str, Any] | None:
        path = self.state / "run.json"
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
        return None

    def dead(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"agmarl up exited {self.proc.returncode}: {Path(self.log.name).read_text(errors='replace')[-3000:]}"

    def wait_ready(self, nodes: int, timeout: float = 240.0) -> dict[str, Any]:
        info = rig.wait_until(lambda: (i := self.run_info()) and i.get("extender_url") and i, timeout,
                              "agmarl up run.json", interval=0.5, alive=self.dead)
        url = info["extender_url"]
        port = int(url.rsplit(":", 1)[1])

        def view_has_nodes() -> bool:
            return http_get(port, "/readyz")[0] == 200 and len(json.loads(
                http_get(port, "/debug/view")[1]).get("pods_per_node", {})) >= nodes

        rig.wait_until(view_has_nodes, timeout, "the extender's view holding every node", interval=0.5,
                       alive=self.dead)
        return info

    def metrics(self, service: str = "inference") -> str:
        info = self.run_info() or {}
        url = info.get("metrics_urls", {}).get(service)
        if not url:
            return ""
        port = int(url.split(":")[2].split("/")[0])
        return http_get(port, "/metrics")[1]

    def decisions(self, last: int) -> str:
        out = subprocess.run([AGMARL, "decisions", "tail", "--cluster", self.cluster, "--last", str(last),
                              "--follow", "0"], env=self.env, cwd=str(self.state.parent), capture_output=True,
                             text=True, timeout=120)
        return out.stdout

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def create_pods(cp: rig.ControlPlane, names: list[str], scheduler: str, cpu: str, memory: str, threads: int,
                deadline: float) -> tuple[float, float, list[str]]:
    """Creates the pods from ``threads`` threads (one API client each); (first, last create time, errors)."""
    from kubernetes import client

    apis = [client.CoreV1Api(cp.api_client()) for _ in range(threads)]
    errors: list[str] = []
    first = time.monotonic()

    def work(k: int) -> None:
        api = apis[k]
        for i in range(k, len(names), threads):
            if time.monotonic() > deadline:
                errors.append("deadline")
                return
            try:
                api.create_namespaced_pod(NAMESPACE, pod_manifest(names[i], scheduler, cpu, memory))
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors.append(f"{names[i]}: {str(exc)[:200]}")

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))
    return first, time.monotonic(), errors


def run_mode(mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    if mode not in MODES:
        raise SystemExit(f"kube_real: mode {mode!r}: one of {', '.join(MODES)}")
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"mode": mode, "nodes": args.nodes, "pods": args.pods}
    up: AgmarlUp | None = None
    sched: rig.Child | None = None
    watch: BindingWatch | None = None
    t_setup = time.monotonic()
    with rig.ControlPlane(work / "rig", bin_dir=args.bin_dir, etcd=args.etcd) as cp:
        cp.start()
        cp.ensure_namespace(NAMESPACE)
        node_names = cp.create_nodes(args.nodes, cpu=args.node_cpu, memory=args.node_memory, pods="110")
        report["kube_version"] = (Path(args.bin_dir) / "KUBE_VERSION").read_text().strip() \
            if (Path(args.bin_dir) / "KUBE_VERSION").exists() else ""
        try:
            scheduler_name = BATCH_SCHEDULER if mode == "batch" else EXTENDER_SCHEDULER
            if mode != "alone":
                up = AgmarlUp(mode, cp.kubeconfig, work, cluster=f"real-{mode.replace('-', '')}")
                info = up.wait_ready(args.nodes, timeout=args.ready_timeout)
                report["extender_url"] = info["extender_url"]
            if mode != "batch":
                shipped = rig.SHIPPED_CONFIGS["full" if mode == "full" else "hybrid"]
                url = None if mode == "alone" else report["extender_url"]
                sched = cp.start_scheduler(cp.scheduler_config(shipped, url, name=mode))
                report["scheduler_config"] = str(shipped.relative_to(rig.ROOT)) + ("" if url else " (extenders removed)")
            report["setup_s"] = round(time.monotonic() - t_setup, 1)

            deadline = time.monotonic() + args.timeout
            watch = BindingWatch(cp, deadline)
            names = [f"p{i:05d}" for i in range(args.pods)]
            killer = None
            if mode == "hybrid-kill":
                killer = threading.Thread(target=kill_inference_at, args=(up, watch, args.pods // 3, deadline, report),
                                          daemon=True)
                killer.start()
            procs = {c.name: c.pid for c in cp.children if not c.name.startswith("kube-scheduler")}
            procs.update({"kube-scheduler": sched.pid} if sched is not None and sched.pid else {})
            info = (up.run_info() or {}) if up is not None else {}
            procs.update({k: v for k, v in (info.get("pids") or {}).items() if v})
            procs.update({"nats-server": info["nats_pid"]} if info.get("nats_pid") else {})
            procs["benchmark"] = os.getpid()
            cpu0 = process_cpu_seconds(procs)
            first, last_create, errors = create_pods(cp, names, scheduler_name, args.cpu, args.memory,
                                                     args.create_threads, deadline)
            report["create_s"] = round(last_create - first, 2)
            report["create_pods_per_s"] = round(len(names) / max(last_create - first, 1e-9), 1)
            report["create_errors"] = errors[:5] + ([f"... {len(errors)} in all"] if len(errors) > 5 else [])
            expected = len(names) - len(errors)
            with contextlib.suppress(rig.RigError):
                rig.wait_until(lambda: watch.count() >= expected, max(0.0, deadline - time.monotonic()),
                               "every pod bound", interval=0.1,
                               alive=(lambda: sched.dead() if sched else None))
            watch.stop()
            cpu1 = process_cpu_seconds(procs)
            if killer:
                killer.join(timeout=5)
            bound = dict(watch.bound)
            # where the CPU went while the pods were created and bound (the benchmark includes its creating
            # threads and its watch), per pod
            report["cpu_ms_per_pod"] = {k: round(1000.0 * v / len(bound), 2)
                                        for k, v in cpu_used(cpu0, cpu1).items()} if bound else {}
            report["bound"] = len(bound)
            report["every_pod_bound"] = len(bound) == len(names)
            if bound:
                last_bound = max(t for _, t in bound.values())
                report["wall_s"] = round(last_bound - first, 2)
                report["pods_per_s"] = round(len(bound) / max(last_bound - first, 1e-9), 1)
            report["watch_errors"] = watch.errors[:3]
            report["watch_relists"] = watch.relists  # bindings counted from a relist carry its time

            # the API server's view: bindings and requests per node
            api = cp.core_api()
            pods = api.list_namespaced_pod(NAMESPACE).items
            bindings = {f"{p.metadata.namespace}/{p.metadata.name}": p.spec.node_name for p in pods if p.spec.node_name}
            report["bound_api"] = len(bindings)
            req = [{"node": p.spec.node_name, "cpu": p.spec.containers[0].resources.requests.get("cpu"),
                    "memory": p.spec.containers[0].resources.requests.get("memory")} for p in pods if p.spec.node_name]
            alloc = {n.metadata.name: n.status.allocatable for n in api.list_node().items}
            usage = node_usage(req, alloc)
            report["overcommitted_nodes"] = usage["overcommitted"]
            report["max_pods_per_node"] = usage["max_pods_per_node"]
            report["min_pods_per_node"] = usage["min_pods_per_node"]
            report["stdev_pods_per_node"] = usage["stdev_pods_per_node"]
            report["nodes_used"] = sum(1 for u in usage["per_node"].values() if u["pods"])
            if sched is not None:
                attempts = prom_samples(cp.scheduler_metrics(sched), "scheduler_schedule_attempts_total")
                report["scheduler_attempts"] = {label(k, "result"): int(v) for k, v in attempts.items()}
            if up is not None:
                report.update(agmarl_figures(up, bindings, args))
        finally:
            if watch is not None:
                watch.stop()
            if sched is not None:
                cp.stop_child(sched)
            if up is not None:
                report["agmarl_up_exit"] = up.stop()
                report["agmarl_state"] = str(up.state)
    report["node_names"] = f"{node_names[0]}..{node_names[-1]}"
    return report


def kill_inference_at(up: AgmarlUp, watch: BindingWatch, at: int, deadline: float, report: dict[str, Any]) -> None:
    """SIGKILL the inference process (its PID from run.json) once ``at`` pods are bound."""
    while time.monotonic() < deadline and watch.count() < at:
        time.sleep(0.05)
    pid = ((up.run_info() or {}).get("pids") or {}).get("inference")
    if pid and watch.count() >= at:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            report["killed_inference"] = {"pid": pid, "bound_at_kill": watch.count()}


def agmarl_figures(up: AgmarlUp, bindings: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    metrics = up.metrics("inference")
    fallbacks = prom_samples(metrics, "agmarl_extender_fallbacks_total")
    out["extender_fallbacks"] = {label(k, "reason"): int(v) for k, v in fallbacks.items() if v}
    counts = prom_samples(metrics, "agmarl_extender_request_duration_seconds_count")
    sums = prom_samples(metrics, "agmarl_extender_request_duration_seconds_sum")
    out["extender_calls"] = {label(k, "verb"): int(v) for k, v in counts.items() if v}
    out["extender_mean_ms"] = {label(k, "verb"): round(1e3 * sums.get(k, 0.0) / v, 2) for k, v in counts.items() if v}
    calls = sum(out["extender_calls"].get(v, 0) for v in ("prioritize", "filter"))
    out["fallback_fraction"] = round(sum(out["extender_fallbacks"].values()) / calls, 4) if calls else None
    batch = prom_samples(metrics, "agmarl_batch_bindings_total")
    if any(batch.values()):
        out["batch_bindings"] = {label(k, "result") or "all": int(v) for k, v in batch.items() if v}
    # the decision log: an extender decision is published once its binding is known (watch)
    want = set(bindings)
    logged: dict[str, list[str]] = {}
    text = ""
    deadline = time.monotonic() + args.log_timeout
    while time.monotonic() < deadline:
        text = up.decisions(last=max(1000, 8 * len(bindings)))
        logged = parse_decisions(text)
        if want <= set(logged):
            break
        time.sleep(2.0)
    out["decision_log"] = decision_agreement(logged, bindings)
    out["decision_log"]["entries"] = sum(len(v) for v in logged.values())
    # of them, pods kube-scheduler placed alone while inference restarted (its catch-up's entries)
    out["decision_log"]["unassisted"] = text.count("policy=(unassisted)")
    return out


def print_table(reports: list[dict[str, Any]]) -> None:
    alone = next((r.get("pods_per_s") for r in reports if r["mode"] == "alone"), None)
    print(f"{'mode':12s} {'pods/s':>8s} {'ratio':>6s} {'bound':>11s} {'over':>5s} {'max/min':>8s} "
          f"{'fallbacks':>10s} {'log==binding':>14s} {'create/s':>9s}")
    for r in reports:
        if "error" in r:
            print(f"{r['mode']:12s} ERROR {r['error']}")
            continue
        pps = r.get("pods_per_s")
        ratio = f"{pps / alone:.2f}" if pps and alone else "-"
        log = r.get("decision_log")
        logs = (f"{log['matched']}/{log['bound']}" + (f" ({log['unassisted']} u)" if log.get("unassisted") else "")
                if log else "-")
        fb = sum((r.get("extender_fallbacks") or {}).values()) if "extender_fallbacks" in r else "-"
        print(f"{r['mode']:12s} {pps or 0:8.1f} {ratio:>6s} {r.get('bound', 0):>5d}/{r['pods']:<5d} "
              f"{len(r.get('overcommitted_nodes', [])):5d} {r.get('max_pods_per_node', 0):>4d}/{r.get('min_pods_per_node', 0):<3d} "
              f"{fb!s:>10s} {logs:>14s} {r.get('create_pods_per_s', 0):9.1f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--pods", type=int, default=2000)
    p.add_argument("--modes", default="alone,hybrid,full,batch")
    p.add_argument("--cpu", default="100m")
    p.add_argument("--memory", default="128Mi")
    p.add_argument("--node-cpu", default="32")
    p.add_argument("--node-memory", default="128Gi")
    p.add_argument("--create-threads", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600.0, help="per mode: creating and binding, seconds")
    p.add_argument("--ready-timeout", type=float, default=240.0)
    p.add_argument("--log-timeout", type=float, default=60.0, help="waiting for the decision log to name every pod")
    p.add_argument("--bin-dir", default=str(rig.DEFAULT_BIN))
    p.add_argument("--etcd", default=None)
    p.add_argument("--work", default=str(rig.DEFAULT_STATE / "runs"))
    p.add_argument("--json", default=None, metavar="OUT.json")
    args = p.parse_args(argv)
    if args.pods > 20000 or args.nodes > 5000:
        raise SystemExit("kube_real: at most 20,000 pods and 5,000 nodes")
    try:
        rig.find_binaries(Path(args.bin_dir), args.etcd)
    except rig.RigError as exc:
        print(f"kube_real: {exc}", file=sys.stderr)
        return 2
    run = Path(args.work) / time.strftime("%Y%m%d-%H%M%S")

    def stop(signum: int, _frame: Any) -> None:  # SIGTERM (and SIGINT, ignored in a background job) end the run the
        raise KeyboardInterrupt(f"signal {signum}")  # way Ctrl-C does: every mode's finally ends what it started

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    reports = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        print(f"--- {mode}", flush=True)
        try:
            r = run_mode(mode, args, run / mode)
        except (rig.RigError, OSError) as exc:
            r = {"mode": mode, "nodes": args.nodes, "pods": args.pods, "error": str(exc)[:2000]}
        print(json.dumps({k: v for k, v in r.items() if k not in ("examples",)}, default=str), flush=True)
        reports.append(r)
    alone = next((r.get("pods_per_s") for r in reports if r["mode"] == "alone"), None)
    for r in reports:
        if alone and r.get("pods_per_s"):
            r["ratio_to_alone"] = round(r["pods_per_s"] / alone, 3)
    print_table(reports)
    if args.json:
        Path(args.json).write_text(json.dumps({"bench": "kube_real", "runs": reports}, indent=2, default=str))
    return 0 if all("error" not in r for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
