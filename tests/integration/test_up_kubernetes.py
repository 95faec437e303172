"""`agmarl up --source kubernetes` from a workstation, both scheduling modes at once, decisions counted
per pod: each pod is decided once, by whoever schedules it.

The cluster is a STAND-IN Kubernetes API (``agmarl_testing.k8s_api``: real HTTP, the official client;
no kube-apiserver can run here) named only by ``--kubeconfig`` ($KUBECONFIG points at a file that does
not exist, so a component that ignored the setting would fail). The six services run as `agmarl up`
starts them, on the session's real nats-server. On it:
- pods of ``agmarl-batch-scheduler`` (``--batch-scheduler``): inference's batch mode places and binds them;
- pods of ``agmarl-scheduler``: this test plays kube-scheduler with the extender (prioritize over HTTP,
  then the Binding as kube-scheduler's DefaultBinder creates it); one of them is left pending throughout,
  as a pod kube-scheduler has not reached yet;
- a ``default-scheduler`` pod nobody schedules.
The state-collector re-announces pending pods every 0.3 s (10 s by default), so a pod that reached the
NATS loop would collect several loop decisions.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict

import httpx

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.specs import AGMARL_BATCH_SCHEDULER, AGMARL_SCHEDULER
from agmarl_testing.k8s_api import StandInApiServer, node_json, pod_json

from .conftest import wait_for

NODES = ("n1", "n2", "n3")
BATCH = [f"batch-{i}" for i in range(4)]
EXTENDED = [f"ext-{i}" for i in range(3)]
WAITING = "ext-waiting"  # an agmarl-scheduler pod kube-scheduler has not placed (yet)
PLAIN = "plain"  # default-scheduler: nobody here schedules it
ENDPOINTS = re.compile(r"agmarl: cluster (\S+): extender http://127\.0\.0\.1:(\d+) .*inference=:(\d+)")


class UpProcess:
    """`agmarl up` as a child process; its output lines collected by a reader thread."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "agmarl_cli.main", "up", *args], env=env, cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def match(self, pattern: re.Pattern) -> re.Match | None:
        for line in list(self.lines):
            found = pattern.search(line)
            if found:
                return found
        return None

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self.reader.join(timeout=5)

    def output(self) -> str:
        return "\n".join(self.lines[-60:])


def seeded_standin() -> StandInApiServer:
    standin = StandInApiServer().start()
    for name in NODES:
        standin.add_node(node_json(name, cpu="4", memory="8Gi"))
    for name in BATCH:
        standin.add_pod(pod_json(name, scheduler_name=AGMARL_BATCH_SCHEDULER, cpu="500m", memory="256Mi"))
    for name in [*EXTENDED, WAITING]:
        standin.add_pod(pod_json(name, scheduler_name=AGMARL_SCHEDULER, cpu="500m", memory="256Mi"))
    standin.add_pod(pod_json(PLAIN, cpu="100m"))
    return standin


def kube_scheduler_places(extender: str, api: str, name: str) -> str:
    """What kube-scheduler v1.36 does for one pod with the shipped extender config (filter runs in
    kube-scheduler itself; prioritize with nodeCacheCapable node names; the default binder binds)."""
    pod = pod_json(name, scheduler_name=AGMARL_SCHEDULER, cpu="500m", memory="256Mi")
    scores = httpx.post(f"{extender}/prioritize", json={"Pod": pod, "Nodes": None, "NodeNames": list(NODES)},
                        timeout=10.0)
    assert scores.status_code == 200, scores.text
    best = max(scores.json(), key=lambda h: (h["Score"], h["Host"]))["Host"]
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": "default"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": best}}
    resp = httpx.post(f"{api}/api/v1/namespaces/default/pods/{name}/binding", json=binding, timeout=10.0)
    assert resp.status_code in (200, 201), resp.text
    return best


async def test_up_kubernetes_each_pod_decided_once_by_its_scheduler(nats_url, tmp_path):
    standin = seeded_standin()
    kubeconfig = standin.write_kubeconfig(tmp_path / "kubeconfig")
    cluster = f"k8s-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGMARL_") and k != "NATS_URL"}
    env.update({"NATS_URL": nats_url, "AGMARL_STATE_DIR": str(tmp_path / ".state"),
                "KUBECONFIG": str(tmp_path / "no-such-kubeconfig"),  # --kubeconfig must win everywhere
                "AGMARL_PENDING_RETRY_SECONDS": "0.3", "AGMARL_SNAPSHOT_RESYNC_SECONDS": "0.3",
                "AGMARL_SNAPSHOT_MIN_INTERVAL": "0.1"})
    bus = await Bus.connect(nats_url, "test-up-kubernetes")
    decisions: list[m.Decision] = []
    snapshots: list[float] = []

    async def on_decision(msg):
        decisions.append(m.decode(m.Decision, msg.data))

    async def on_snapshot(msg):
        snapshots.append(time.monotonic())

    await bus.subscribe(subjects.decision_wildcard(cluster), on_decision)
    await bus.subscribe(subjects.snapshot(cluster), on_snapshot)
    up = UpProcess(["--source", "kubernetes", "--kubeconfig", str(kubeconfig), "--cluster", cluster,
                    "--batch-scheduler", AGMARL_BATCH_SCHEDULER, "--no-view"], env, str(tmp_path))
    try:
        found = await wait_for(lambda: up.match(ENDPOINTS) or up.proc.poll() is not None, timeout=150.0)
        assert found and up.proc.poll() is None, up.output()
        endpoints = up.match(ENDPOINTS)
        assert endpoints.group(1) == cluster
        extender = f"http://127.0.0.1:{endpoints.group(2)}"
        metrics = httpx.get(f"http://127.0.0.1:{endpoints.group(3)}/metrics", timeout=5.0)  # the printed port
        assert metrics.status_code == 200 and "agmarl_batch_bindings_total" in metrics.text

        # batch mode binds its pods by itself, through the kubeconfig given on the command line
        assert await wait_for(lambda: {k for k, _ in standin.bindings} >= {f"default/{n}" for n in BATCH},
                              timeout=60.0), (standin.bindings, up.output())
        # kube-scheduler with the extender places the others
        placed = {name: await asyncio.to_thread(kube_scheduler_places, extender, standin.url, name)
                  for name in EXTENDED}
        # several re-announcement rounds pass with WAITING and PLAIN still pending
        mark = len(snapshots)
        assert await wait_for(lambda: len(snapshots) >= mark + 8, timeout=30.0), up.output()
        assert await wait_for(lambda: sum(d.source == "batch" for d in decisions) >= len(BATCH), timeout=10.0)
    finally:
        code = up.stop()
        await bus.close()
        standin.stop()

    per_pod: dict[str, list[m.Decision]] = defaultdict(list)
    for d in decisions:
        per_pod[d.pod_key.split("/", 1)[1]].append(d)
    bound = {k.split("/", 1)[1]: node for k, node in standin.bindings}
    for name in BATCH:  # exactly one decision, batch mode's, naming the node it bound
        assert [(d.source, d.node) for d in per_pod[name]] == [("batch", bound[name])], (name, per_pod[name])
    for name in EXTENDED:  # the extender's answers only: never the NATS loop, never batch mode
        assert per_pod[name] and {d.source for d in per_pod[name]} == {"extender"}, (name, per_pod[name])
        assert bound[name] == placed[name]
    assert per_pod[WAITING] == [] and per_pod[PLAIN] == []  # pending all along, decided by no one
    assert set(bound) == {*BATCH, *EXTENDED}
    assert code == 0, up.output()
