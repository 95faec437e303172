"""The Kubernetes source against a STAND-IN API server (agmarl_testing.k8s_api: real HTTP on
127.0.0.1, the official kubernetes client pointed at it; there is no Kubernetes API here).

List builds the state, watch events update it, bookmarks advance the resourceVersion, 410 Gone
(HTTP or ERROR event) relists, a dropped watch reconnects with backoff, and the service process
(source: kubernetes, kubeconfig) publishes pending pods of the batch scheduler on the bus."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from kubernetes import client

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.filters import violations
from agmarl_common.core.cluster.model import state_from_dict
from agmarl_common.core.cluster.specs import AGMARL_BATCH_SCHEDULER, AGMARL_SCHEDULER
from agmarl_common.kube.convert import node_from_k8s, pod_from_k8s
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_testing.fixtures import wait_healthy
from agmarl_testing.k8s_api import StandInApiServer, node_json, pod_json
from agmarl_state_collector.k8ssource import Backoff, KubernetesSource, WatchConfig
from agmarl_state_collector.k8sapp import KubernetesCollectorApp
from agmarl_state_collector.settings import CollectorSettings

FAST = WatchConfig(timeout_seconds=5, request_timeout=3.0, backoff_base=0.1, backoff_max=0.8, queue_size=16)


async def until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


def seeded_standin(gone_as_event: bool = False) -> StandInApiServer:
    s = StandInApiServer(gone_as_event=gone_as_event).start()
    s.add_node(node_json("n1", cpu="4", memory="8Gi"))
    s.add_node(node_json("n2", cpu="8", memory="16Gi", gpus=2))
    s.add_pod(pod_json("web", node_name="n1", phase="Running", cpu="1", memory="1Gi"))
    s.add_pod(pod_json("done", node_name="n2", phase="Succeeded", cpu="2"))
    s.add_pod(pod_json("train", namespace="ml", scheduler_name=AGMARL_BATCH_SCHEDULER, cpu="2", gpus=1))
    s.add_pod(pod_json("plain", cpu="250m"))
    return s


@pytest.fixture
async def watched():
    """(stand-in, started source, list of changes seen); everything stopped afterwards."""
    standin = seeded_standin()
    api = client.ApiClient(client.Configuration(host=standin.url))
    source = KubernetesSource(api, pod_from_k8s, node_from_k8s, FAST, rng=random.Random(7))
    seen = []

    async def on_changes(changes):
        seen.extend(changes)

    source.start()
    task = asyncio.create_task(source.run(on_changes))
    await asyncio.wait_for(source.synced.wait(), 5.0)
    try:
        yield standin, source, seen
    finally:
        await asyncio.to_thread(source.stop)
        task.cancel()
        standin.stop()
        api.close()


def cpu_used(source: KubernetesSource) -> dict[str, int]:
    st = source.cache.state
    return {n.name: int(st.cpu_used[i]) for i, n in enumerate(st.nodes)}


@pytest.mark.parametrize("failures,low,high", [(0, 0.05, 0.1), (1, 0.1, 0.2), (2, 0.2, 0.4), (5, 0.4, 0.8),
                                                (20, 0.4, 0.8)])
def test_backoff_grows_with_jitter_and_is_capped(failures, low, high):
    delays = [Backoff(0.1, 0.8, random.Random(seed), failures).next() for seed in range(50)]
    assert all(low <= d <= high for d in delays)
    assert len(set(delays)) > 1  # jittered
    b = Backoff(0.1, 0.8, random.Random(0), failures)
    b.reset()
    assert b.next() <= 0.1


async def test_initial_list_builds_the_state(watched):
    standin, source, seen = watched
    cache = source.cache
    assert [n.name for n in cache.state.nodes] == ["n1", "n2"]
    assert cpu_used(source) == {"n1": 1000, "n2": 0}  # the Succeeded pod frees its resources
    assert [p.key for p in cache.pending_pods()] == ["default/plain", "ml/train"]
    train = cache.pending["ml/train"]
    assert (train.scheduler_name, train.num_gpu, train.cpu_milli) == (AGMARL_BATCH_SCHEDULER, 1, 2000)
    assert cache.resource_versions == {"nodes": str(standin.rv), "pods": str(standin.rv)}
    assert {(c.type, c.pod_key or c.node) for c in seen} >= {("node_added", "n1"), ("pod_bound", "default/web"),
                                                              ("pod_added", "ml/train")}


async def test_watch_events_update_the_state(watched):
    standin, source, seen = watched
    seen.clear()
    standin.modify_pod("ml/train", node_name="n2")  # bound by a scheduler
    standin.add_pod(pod_json("batch", node_name="n1", phase="Running", cpu="2"))
    assert await until(lambda: cpu_used(source) == {"n1": 3000, "n2": 2000})
    assert source.cache.state.gpu_used[source.cache.state.index["n2"]].sum() == 1000
    standin.set_phase("default/batch", "Failed")  # a failed pod frees its node
    standin.delete_pod("default/web")
    standin.add_node(node_json("n2", cpu="8", memory="16Gi", gpus=2, ready=False))
    standin.add_node(node_json("n3", cpu="2", memory="4Gi"))
    assert await until(lambda: "n3" in source.cache.state.index and cpu_used(source)["n1"] == 0)
    assert not source.cache.state.nodes[source.cache.state.index["n2"]].ready
    # two watches (threads): order holds within a kind, not across kinds
    assert [(c.type, c.pod_key) for c in seen if c.pod_key] == [
        ("pod_bound", "ml/train"), ("pod_bound", "default/batch"), ("pod_failed", "default/batch"),
        ("pod_deleted", "default/web")]
    assert [(c.type, c.node) for c in seen if not c.pod_key] == [("node_failed", "n2"), ("node_added", "n3")]
    assert violations(source.cache.state) == []
    assert source.cache.resource_versions["pods"] == str(standin.rv - 2)  # the last pod event


async def test_bookmarks_advance_the_resource_version(watched):
    standin, source, _ = watched
    before = source.stats.bookmarks
    rv = standin.bookmark()
    assert await until(lambda: source.cache.resource_versions == {"nodes": str(rv), "pods": str(rv)})
    assert source.stats.bookmarks >= before + 2
    standin.drop_watches()  # the reconnect resumes from the bookmark, not from the list
    assert await until(lambda: any(r.query.get("resourceVersion") == str(rv)
                                   for r in standin.watch_requests("pods")))
    assert all(r.query.get("allowWatchBookmarks") == "true" for r in standin.watch_requests("pods"))
    assert len(standin.list_requests("pods")) == 1


@pytest.mark.parametrize("as_event", [False, True], ids=["http-410", "error-event-410"])
async def test_gone_relists_and_the_state_is_correct_afterwards(as_event):
    standin = seeded_standin(gone_as_event=as_event)
    api = client.ApiClient(client.Configuration(host=standin.url))
    source = KubernetesSource(api, pod_from_k8s, node_from_k8s, FAST, rng=random.Random(3))
    seen = []

    async def on_changes(changes):
        seen.extend(changes)

    source.start()
    task = asyncio.create_task(source.run(on_changes))
    try:
        await asyncio.wait_for(source.synced.wait(), 5.0)
        seen.clear()
        if as_event:
            standin.expire(tell_watchers=True)  # open watches get an ERROR event with code 410
        else:
            standin.expire()  # a watch (re)connecting from the old resourceVersion gets HTTP 410
            standin.drop_watches()
        # changes whose events the watch never delivers: only the relist can show them
        standin.delete_pod("default/web")
        standin.add_pod(pod_json("late", node_name="n2", phase="Running", cpu="3"))
        standin.delete_node("n1")
        assert await until(lambda: source.stats.relists >= 2 and len(standin.list_requests("pods")) >= 2)
        assert await until(lambda: cpu_used(source) == {"n2": 3000})
        assert ("pod_deleted", "default/web") in {(c.type, c.pod_key) for c in seen}
        assert ("node_failed", "n1") in {(c.type, c.node) for c in seen}
        assert source.cache.resource_versions["pods"] == str(standin.rv)
        standin.add_pod(pod_json("after", cpu="100m"))  # and the new watch works
        assert await until(lambda: "default/after" in source.cache.pending)
    finally:
        await asyncio.to_thread(source.stop)
        task.cancel()
        standin.stop()
        api.close()


async def test_dropped_connection_reconnects_with_backoff(watched):
    standin, source, _ = watched
    standin.fail_watches(3, 500, plural="pods")
    standin.drop_watches()
    dropped_at = time.monotonic()
    assert await until(lambda: len([r for r in standin.watch_requests("pods") if r.at > dropped_at]) >= 4)
    times = [r.at for r in standin.watch_requests("pods") if r.at > dropped_at][:4]
    gaps = [b - a for a, b in zip(times, times[1:])]
    # requests 1-3 got HTTP 500: each retry waits backoff 0.1 * 2^k with jitter in [d/2, d], k >= 0, 1, 2
    assert gaps[0] >= 0.045 and gaps[1] >= 0.09 and gaps[2] >= 0.18, gaps
    assert gaps[2] > gaps[0]
    assert source.stats.reconnects >= 3
    standin.add_pod(pod_json("fresh", cpu="100m"))
    assert await until(lambda: "default/fresh" in source.cache.pending)
    assert len(standin.list_requests("pods")) == 1  # reconnected from the resourceVersion, no relist


async def test_service_publishes_pending_batch_pods_from_the_standin(nats_url, tmp_path, service_processes):
    """state-collector as a process, AGMARL_SOURCE=kubernetes, AGMARL_KUBECONFIG -> the stand-in,
    AGMARL_BATCH_SCHEDULER_NAME -> the batch scheduler: only its pods are announced, never those of
    agmarl-scheduler (kube-scheduler with the extender decides them) nor of default-scheduler."""
    standin = seeded_standin()
    standin.add_pod(pod_json("extended", scheduler_name=AGMARL_SCHEDULER, cpu="1"))
    kubeconfig = standin.write_kubeconfig(tmp_path / "kubeconfig")
    cluster = f"k{int(time.time() * 1000) % 10**8}"
    bus = await Bus.connect(nats_url, "test-k8s-collector")
    pending: list[m.PendingPod] = []
    snapshots: list[m.ClusterSnapshot] = []
    events: list[m.ClusterEvent] = []

    async def on_pending(msg):
        pending.append(m.decode(m.PendingPod, msg.data))

    async def on_event(msg):
        events.append(m.decode(m.ClusterEvent, msg.data))

    async def on_snapshot(msg):
        snapshots.append(m.decode(m.ClusterSnapshot, msg.data))

    await bus.subscribe(subjects.pending(cluster), on_pending)
    await bus.subscribe(subjects.snapshot(cluster), on_snapshot)
    await bus.subscribe(subjects.event(cluster), on_event)
    proc = service_processes("agmarl_state_collector", env={
        "NATS_URL": nats_url, "AGMARL_CLUSTER": cluster, "AGMARL_SOURCE": "kubernetes",
        "AGMARL_KUBECONFIG": str(kubeconfig), "AGMARL_SNAPSHOT_MIN_INTERVAL": "0.1",
        "AGMARL_BATCH_SCHEDULER_NAME": AGMARL_BATCH_SCHEDULER, "AGMARL_PENDING_RETRY_SECONDS": "0.2",
        "AGMARL_SNAPSHOT_RESYNC_SECONDS": "0.2",
        "AGMARL_WATCH_TIMEOUT_SECONDS": "5", "AGMARL_TRACE_DIR": str(tmp_path)})
    try:
        await wait_healthy(bus, "state-collector", timeout=15.0, proc=proc)
        assert await until(lambda: pending and snapshots, timeout=5.0), proc.output()[-2000:]
        assert pending[0].pod["scheduler_name"] == AGMARL_BATCH_SCHEDULER
        standin.add_pod(pod_json("train2", scheduler_name=AGMARL_BATCH_SCHEDULER, cpu="1"))
        assert await until(lambda: "train2" in {p.pod["name"] for p in pending}, timeout=5.0)
        # re-announced every 0.2 s while pending: several rounds, and never a pod of another scheduler
        assert await until(lambda: sum(p.pod["name"] == "train2" for p in pending) >= 3, timeout=5.0)
        assert {p.pod["name"] for p in pending} == {"train", "train2"}
        assert await until(lambda: len(snapshots[-1].pending) == 4, timeout=5.0)
        last = snapshots[-1]
        assert [n.name for n in state_from_dict(last.state).nodes] == ["n1", "n2"]  # compact form, decoded
        assert last.stats["bound"] == 1.0 and last.stats["pending"] == 4.0
        # a binding the watch sees goes out as the next event of this run's one sequence, carrying the pod,
        # so graph-builder (and every cluster view) applies it at once
        standin.modify_pod("default/train2", node_name="n2")
        assert await until(lambda: any(e.type == "pod_bound" and e.pod_key == "default/train2" for e in events),
                           timeout=5.0), [(e.type, e.pod_key) for e in events]
        bound = next(e for e in events if e.type == "pod_bound" and e.pod_key == "default/train2")
        assert bound.node == "n2" and bound.pod["name"] == "train2" and bound.epoch == last.epoch != ""
        assert bound.seq > last.seq and len({e.seq for e in events}) == len(events)
        assert proc.stop() == 0
    finally:
        await bus.close()
        standin.stop()


async def test_only_the_batch_schedulers_pods_are_announced(watched):
    """Off by default (no batch scheduler): no pod reaches the NATS loop; with one, only its pods --
    never agmarl-scheduler's, which kube-scheduler with the extender decides."""
    standin, source, _ = watched
    standin.add_pod(pod_json("extended", scheduler_name=AGMARL_SCHEDULER, cpu="1"))
    assert await until(lambda: "default/extended" in source.cache.pending)
    for name, expected in (("", []), (AGMARL_BATCH_SCHEDULER, ["ml/train"])):
        settings = CollectorSettings(source="kubernetes", batch_scheduler_name=name)
        app = KubernetesCollectorApp(ServiceRuntime("state-collector", settings), settings, source)
        assert [p.key for p in app.batch_pending()] == expected
    assert CollectorSettings().batch_scheduler_name == ""
