"""benchmarks/kube_real.py's measuring path (create the pods from several threads, watch the bindings,
sum requests per node, read kube-scheduler's metrics) run end to end against a small fake API server,
with the rig's process management replaced: it checks the benchmark's use of the official client
(creates, list + watch with resourceVersion, node status patch) and its report, not Kubernetes. The real
thing is tests/e2e/test_real_kube.py."""

from __future__ import annotations

import argparse
import http.server
import itertools
import json
import threading
import time
import urllib.parse
from pathlib import Path

import yaml

from agmarl_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load_script(ROOT / "benchmarks" / "kube_real.py", "kube_real_flow")


class FakeApi:
    """Nodes, namespaces, service accounts and pods in memory; list and watch of a namespace's pods; a
    binder thread that plays kube-scheduler (round robin over the nodes) once started."""

    def __init__(self):
        self.lock = threading.Condition()
        self.rv = itertools.count(1)
        self.nodes: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}
        self.events: list[tuple[int, str, dict]] = []
        self.requests: list[tuple[str, str, str | None]] = []
        self.stop = threading.Event()
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the watch streams chunks, as kube-apiserver does

            def log_message(self, *a):
                pass

            def _send(self, code, body):
                out = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def do_POST(self):  # noqa: N802
                path = urllib.parse.urlparse(self.path).path
                api.requests.append(("POST", path, self.headers.get("Content-Type")))
                obj = self._body()
                segs = path.strip("/").split("/")
                with api.lock:
                    obj.setdefault("metadata", {})["resourceVersion"] = str(next(api.rv))
                    if segs[-1] == "nodes":  # as the TaintNodesByCondition admission plugin does
                        obj.setdefault("spec", {})["taints"] = [{"key": "node.kubernetes.io/not-ready",
                                                                 "effect": "NoSchedule"}]
                        api.nodes[obj["metadata"]["name"]] = obj
                    elif segs[-1] == "pods":
                        obj["metadata"]["namespace"] = segs[3]
                        obj.setdefault("status", {})["phase"] = "Pending"
                        key = f"{segs[3]}/{obj['metadata']['name']}"
                        api.pods[key] = obj
                        api.events.append((int(obj["metadata"]["resourceVersion"]), "ADDED", json.loads(json.dumps(obj))))
                        api.lock.notify_all()
                self._send(201, obj)

            def do_PATCH(self):  # noqa: N802
                path = urllib.parse.urlparse(self.path).path
                api.requests.append(("PATCH", path, self.headers.get("Content-Type")))
                name = path.strip("/").split("/")[3]
                patch = self._body()
                with api.lock:
                    if path.endswith("/status"):
                        api.nodes[name]["status"] = patch["status"]
                    else:  # the node's spec: a merge patch (null removes a field)
                        spec = api.nodes[name].setdefault("spec", {})
                        for key, value in patch["spec"].items():
                            spec.pop(key, None) if value is None else spec.__setitem__(key, value)
                self._send(200, api.nodes[name])

            def do_GET(self):  # noqa: N802
                url = urllib.parse.urlparse(self.path)
                q = dict(urllib.parse.parse_qsl(url.query))
                if url.path == "/api/v1/nodes":
                    with api.lock:
                        items = list(api.nodes.values())
                    return self._send(200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                            "items": items})
                ns = url.path.strip("/").split("/")[3]
                if q.get("watch") in ("true", "1"):
                    return self._watch(ns, int(q.get("resourceVersion") or 0), float(q.get("timeoutSeconds") or 5),
                                       q.get("allowWatchBookmarks") in ("true", "1"))
                with api.lock:
                    items = [p for k, p in api.pods.items() if k.startswith(ns + "/")]
                    rv = str(max([e[0] for e in api.events] or [1]))
                self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items})

            def _watch(self, ns, since, timeout, bookmarks):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if bookmarks:  # as kube-apiserver sends them: an object with only its kind and resourceVersion
                    mark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(since)}}
                    line = json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                deadline = time.monotonic() + min(timeout, 5)
                while time.monotonic() < deadline and not api.stop.is_set():
                    with api.lock:
                        new = [e for e in api.events if e[0] > since and e[2]["metadata"]["namespace"] == ns]
                        if not new:
                            api.lock.wait(0.2)
                            continue
                    for rv, etype, obj in new:
                        line = json.dumps({"type": etype, "object": obj}).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        since = rv
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def binder(self) -> None:
        nodes = itertools.cycle(sorted(self.nodes))
        while not self.stop.is_set():
            with self.lock:
                for key, pod in self.pods.items():
                    if not pod["spec"].get("nodeName"):
                        pod["spec"]["nodeName"] = next(nodes)
                        rv = next(self.rv)
                        pod["metadata"]["resourceVersion"] = str(rv)
                        self.events.append((rv, "MODIFIED", json.loads(json.dumps(pod))))
                self.lock.notify_all()
            time.sleep(0.01)

    def close(self):
        self.stop.set()
        self.server.shutdown()


class _Sched:
    name, pid, port = "fake-scheduler", 0, 0

    def dead(self):
        return None

    def stop(self, timeout=0):
        return 0


def test_kube_real_alone_flow_against_a_fake_api(tmp_path, monkeypatch):
    bench = _bench()
    rig = bench.rig
    fake = FakeApi()
    kubeconfig = tmp_path / "fake.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "f",
        "clusters": [{"name": "f", "cluster": {"server": fake.url}}], "users": [{"name": "f", "user": {}}],
        "contexts": [{"name": "f", "context": {"cluster": "f", "user": "f"}}]}))
    configs: list[Path] = []

    def start(self, timeout=120.0):
        self.kubeconfig = kubeconfig
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.ensure_namespace("default")
        return self

    def start_scheduler(self, config, timeout=60.0, verbosity=None):
        configs.append(Path(config))
        threading.Thread(target=fake.binder, daemon=True).start()
        return _Sched()

    monkeypatch.setattr(rig.ControlPlane, "start", start)
    monkeypatch.setattr(rig.ControlPlane, "start_scheduler", start_scheduler)
    monkeypatch.setattr(rig.ControlPlane, "scheduler_metrics",
                        lambda self, child: 'scheduler_schedule_attempts_total{profile="agmarl-scheduler",result="scheduled"} 40\n')
    monkeypatch.setattr(rig.ControlPlane, "stop_child", lambda self, child: 0)
    args = argparse.Namespace(nodes=4, pods=40, cpu="100m", memory="128Mi", node_cpu="1", node_memory="1Gi",
                              create_threads=4, timeout=60.0, ready_timeout=30.0, log_timeout=5.0,
                              bin_dir=str(tmp_path / "bin"), etcd=None)
    try:
        r = bench.run_mode("alone", args, tmp_path / "alone")
    finally:
        fake.close()
    assert r["every_pod_bound"] and r["bound"] == r["bound_api"] == 40, r
    assert r["watch_errors"] == [] and r["watch_relists"] == 0, r  # bookmarks included
    assert r["pods_per_s"] > 0 and r["create_errors"] == [], r
    # CPU per pod of every process there was (the rig's are replaced here: only the benchmark's own)
    assert set(r["cpu_ms_per_pod"]) == {"benchmark"} and r["cpu_ms_per_pod"]["benchmark"] > 0, r
    assert (r["max_pods_per_node"], r["min_pods_per_node"], r["nodes_used"]) == (10, 10, 4)
    # 10 pods x 100m = 1 CPU = allocatable: full, not over; 10 x 128Mi = 1.25Gi > 1Gi: memory over on all four
    assert {(o["node"], o["resource"]) for o in r["overcommitted_nodes"]} == {(f"node-{i:03d}", "mem") for i in range(4)}
    assert r["scheduler_attempts"] == {"scheduled": 40}
    # kube-scheduler alone: the hybrid overlay's profile without its extender, the rig's kubeconfig
    (config,) = configs
    written = yaml.safe_load(config.read_text())
    assert "extenders" not in written and written["profiles"][0]["schedulerName"] == "agmarl-scheduler"
    # the nodes were made Ready through the status subresource, with a patch type the API server accepts
    patches = [ct for method, path, ct in fake.requests if method == "PATCH" and path.endswith("/status")]
    assert len(patches) == 4 and set(patches) == {"application/strategic-merge-patch+json"}
    assert all(n["status"]["conditions"][0]["type"] == "Ready" for n in fake.nodes.values())
    # and their not-ready taint removed, as the node lifecycle controller would (a merge patch of the spec)
    spec_patches = [(path, ct) for method, path, ct in fake.requests if method == "PATCH" and not path.endswith("/status")]
    assert sorted(spec_patches) == [(f"/api/v1/nodes/node-{i:03d}", "application/merge-patch+json") for i in range(4)]
    assert all("taints" not in n.get("spec", {}) for n in fake.nodes.values())
