"""Summary pieces computed by the CLI."""

import os
import time

import pytest

from agmarl_cli.monitor import Monitor, cpu_used, latency_split, process_cpu_seconds, traces_complete
from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_testing.extender import until


def test_traces_complete_needs_all_three_services():
    spans = [{"trace_id": "t1", "service": s} for s in ("state-collector", "graph-builder", "inference")]
    spans += [{"trace_id": "t2", "service": s} for s in ("state-collector", "inference")]
    assert traces_complete(["t1", "t2", "t3"], spans) == 1


def decision(pod: str, seen_at: float, decided_at: float, trace_id: str = "") -> m.Decision:
    return m.Decision(decision_id=f"d-{pod}", cluster="mon", namespace="default", pod_key=f"default/{pod}",
                      node="n1", policy="kube-default", mode="full", trace_id=trace_id, seen_at=seen_at,
                      decided_at=decided_at)


async def test_latency_counts_pods_announced_once_up_and_reports_startup_apart(nats_url):
    """A pod announced while the services were starting waited for them (first graph, selection, model load):
    it is start-up, not decision latency; the latency is published (seen_at) -> decided (decided_at)."""
    bus = await Bus.connect(nats_url, name="test-monitor")
    mon = Monitor(cluster="mon")
    try:
        await mon.attach(bus)
        gate = time.time()
        await bus.publish(subjects.decision("mon", "default"), decision("early", gate - 12.0, gate - 0.5))
        mon.start_measuring(gate)
        await bus.publish(subjects.decision("mon", "default"), decision("a", gate + 1.0, gate + 1.004, "t-a"))
        await bus.publish(subjects.decision("mon", "default"), decision("b", gate + 2.0, gate + 2.010, "t-b"))
        # a pod kube-scheduler placed alone (the decision log's catch-up): logged, neither a decision nor a latency
        alone = decision("alone", gate + 3.0, gate + 3.0).model_copy(update={"source": "unassisted"})
        await bus.publish(subjects.decision("mon", "default"), alone)
        await until(lambda: mon.decisions == 3 and mon.unassisted == 1, "3 decisions and 1 unassisted seen", 10.0)
    finally:
        await bus.close()
    lat = mon.latency_summary()
    assert lat["count"] == 2 and lat["max"] == pytest.approx(10.0, abs=1e-3)  # not the 11.5 s of start-up
    assert lat["p50"] == pytest.approx(7.0, abs=1e-3)
    assert mon.startup_summary() == {"decisions": 1, "latency_ms": {
        "p50": 11500.0, "p90": 11500.0, "p99": 11500.0, "max": 11500.0, "count": 1}}
    # the inference spans part each latency into the wait before inference took the pod up and the decision
    spans = [{"trace_id": "t-a", "service": "inference", "name": "inference pending_pod",
              "start_ns": int((gate + 1.001) * 1e9)},
             {"trace_id": "t-b", "service": "inference", "name": "inference pending_pod",
              "start_ns": int((gate + 2.008) * 1e9)},
             {"trace_id": "t-b", "service": "state-collector", "name": "state-collector pending_pod_seen",
              "start_ns": int((gate + 2.0) * 1e9)}]
    split = latency_split(mon.measured, spans)
    assert split["split_count"] == 2
    assert split["queue_ms"]["max"] == pytest.approx(8.0, abs=1e-3)
    assert split["decide_ms"]["max"] == pytest.approx(3.0, abs=1e-3)


async def test_load_summary_says_when_decisions_do_not_keep_up(nats_url):
    bus = await Bus.connect(nats_url, name="test-monitor")
    mon = Monitor(cluster="mon")
    try:
        await mon.attach(bus)
        mon.stats = {"announced": 100.0}  # the state-collector's count in its last snapshot
        now = time.time()
        mon.start_measuring(now)
        for i in range(10):
            await bus.publish(subjects.decision("mon", "default"), decision(f"p{i}", now + 0.1, now + 0.2))
        await until(lambda: mon.decisions == 10, "10 decisions seen", 10.0)
    finally:
        await bus.close()
    mon.stats = {"announced": 140.0}  # 40 announced, 10 decided
    mon.stop_measuring()
    load = mon.load_summary()
    assert load["keeping_up"] is False and load["undecided_at_end"] == 30
    assert load["announced_per_s"] == pytest.approx(4 * load["decided_per_s"], rel=0.01)
    mon.window.update(announced_end=110.0)  # 10 announced, 10 decided
    assert mon.load_summary()["keeping_up"] is True and mon.load_summary()["undecided_at_end"] == 0


def test_cpu_per_decision_from_the_processes_and_a_restarted_one_left_out():
    mon = Monitor(cluster="mon")
    mon.stats = {"announced": 0.0}
    mon.start_measuring(cpu={"inference": (10, 1.0), "trainer": (11, 5.0)})
    mon.measured = [("t", 0.0, 0.0)] * 100
    mon.stats = {"announced": 100.0}
    mon.stop_measuring(cpu={"inference": (10, 1.5), "trainer": (12, 0.5)})  # the trainer restarted
    load = mon.load_summary()
    assert load["cpu_ms_per_decision"] == {"inference": 5.0}
    assert load["keeping_up"] is True


def test_process_cpu_seconds_reads_this_process():
    out = process_cpu_seconds({"me": os.getpid(), "gone": None})
    assert list(out) == ["me"] and out["me"][0] == os.getpid() and out["me"][1] > 0


def test_cpu_used_by_the_processes_that_lived_through_the_window():
    start = {"etcd": (10, 1.0), "inference": (20, 2.0), "gone": (30, 1.0)}
    end = {"etcd": (10, 1.5), "inference": (21, 0.1)}  # inference restarted (another pid), "gone" ended
    assert cpu_used(start, end) == {"etcd": 0.5}
