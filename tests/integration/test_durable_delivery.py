"""No acknowledged decision lost, none applied twice (issue 14.4), on a real nats-server with the real
services replaying an openb sub-cluster (state-collector as the cluster, graph-builder, inference, and the
reward-calculator):

- the binder (state-collector) killed with SIGKILL mid-run and restarted: every decision the new cluster's
  pods got is delivered to it and applied once (bound, refused, unschedulable or dropped as a duplicate),
  none of the dead cluster's decisions is applied to the new one, and the durable consumer ends with
  nothing pending or unacked;
- the reward-calculator killed with SIGKILL, then stopped with SIGTERM, each time restarted: every bound
  decision has exactly one Experience on the EXPERIENCE stream, and no refused bind has one;
- deploy/k8s's three-server NATS with 3 stream replicas keeps acknowledging decisions with one server lost.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.natsserver import find_binary
from agmarl_testing.fixtures import wait_healthy

from .conftest import metric_value, module_of, scrape, wait_for
from .test_live_replay import sub_cluster

OUTCOMES = ("pod_bound", "bind_rejected")


def replay_env(nats_url: str, cluster: str, tmp_path, pods_csv, nodes_csv, **extra: str) -> dict[str, str]:
    return {"NATS_URL": nats_url, "AGMARL_CLUSTER": cluster, "AGMARL_HTTP_PORT": "0",
            "AGMARL_REPLAY_WORKLOAD": f"openb:{pods_csv}", "AGMARL_REPLAY_NODES": str(nodes_csv),
            "AGMARL_SIM_SEED": "7", "AGMARL_REPLAY_IN_FLIGHT": "4", "AGMARL_REPLAY_RATE": "25",
            "AGMARL_SNAPSHOT_SECONDS": "0.5", "AGMARL_PINNED_POLICY": "fgd", "AGMARL_OBJECTIVE": "allocation",
            "AGMARL_BRIEF_WORKLOAD": f"openb:{pods_csv}", "AGMARL_EXPLAIN_MODEL": "false",
            "AGMARL_DECISION_ACK_WAIT": "2", **extra}


class EventLog:
    """Every cluster event of one cluster, in arrival order."""

    def __init__(self) -> None:
        self.events: list[m.ClusterEvent] = []

    async def on_msg(self, msg) -> None:
        self.events.append(m.decode(m.ClusterEvent, msg.data))

    def outcomes(self, epoch: str | None = None) -> list[m.ClusterEvent]:
        return [e for e in self.events if e.type in OUTCOMES and (epoch is None or e.epoch == epoch)]

    def epochs(self) -> list[str]:
        return list(dict.fromkeys(e.epoch for e in self.events))


async def read_stream(bus: Bus, subject: str, cls, limit: int = 20_000, quiet: float = 1.0) -> list:
    """Every message of ``subject`` in its stream, from the start (until ``quiet`` seconds bring nothing)."""
    sub = await bus.js.subscribe(subject, ordered_consumer=True)
    out = []
    try:
        while len(out) < limit:
            try:
                out.append(m.decode(cls, (await sub.next_msg(timeout=quiet)).data))
            except asyncio.TimeoutError:
                break
    finally:
        await sub.unsubscribe()
    return out


async def drained(bus: Bus, service: str, cluster: str) -> bool:
    """The service's decision consumer has delivered everything and holds nothing unacked."""
    info = await bus.js.consumer_info(subjects.DECISIONS.name, subjects.durable(service, cluster))
    return info.num_pending == 0 and info.num_ack_pending == 0


def kill9(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.proc.wait(10)


async def test_a_killed_binder_loses_no_decision_and_applies_none_twice(nats_url, service_processes, tmp_path):
    nodes_csv, pods_csv = sub_cluster(tmp_path)
    cluster = "durable-binder"
    env = replay_env(nats_url, cluster, tmp_path, pods_csv, nodes_csv)
    bus = await Bus.connect(nats_url, name="test-binder")
    log = EventLog()
    try:
        await bus.subscribe(subjects.event(cluster), log.on_msg)
        procs = {s: service_processes(module_of(s), env=env) for s in ("graph-builder", "inference", "state-collector")}
        for s, p in procs.items():
            await wait_healthy(bus, s, timeout=60, proc=p)
        assert await wait_for(lambda: len(log.outcomes()) >= 40, timeout=60), procs["state-collector"].output()[-2000:]
        old_epoch = log.epochs()[0]
        killed_at = time.time()
        kill9(procs["state-collector"])
        collector = service_processes(module_of("state-collector"), env=env)
        health = await wait_healthy(bus, "state-collector", timeout=60, proc=collector)
        assert await wait_for(lambda: len([e for e in log.outcomes() if e.epoch != old_epoch]) >= 40, timeout=90), \
            collector.output()[-2000:]
        procs["inference"].stop()  # no more decisions: what is in the stream is all there is
        assert await wait_for(lambda: drained(bus, "state-collector", cluster), timeout=30), collector.output()[-2000:]
        metrics = scrape(health.metrics_port)
        decisions = await read_stream(bus, subjects.decision_wildcard(cluster), m.Decision)
    finally:
        await bus.close()

    new_epoch = next(e for e in log.epochs() if e != old_epoch)
    old = [d for d in decisions if d.seen_at < killed_at]
    new = [d for d in decisions if d.seen_at >= killed_at]
    applied = [e.decision_id for e in log.outcomes(new_epoch)]
    assert len(applied) == len(set(applied)), "a decision was bound or refused twice"
    assert not set(applied) & {d.decision_id for d in old}, "a decision of the killed run was applied to the new one"
    assert set(applied) <= {d.decision_id for d in new}
    count = {name: metric_value(metrics, f"agmarl_{name}_total") for name in
             ("pods_bound", "bind_rejected", "decisions_unschedulable", "decisions_stale", "decisions_foreign")}
    assert count["pods_bound"] + count["bind_rejected"] == len(applied)
    # every decision made for the new cluster reached the new binder and was handled exactly once
    handled = count["pods_bound"] + count["bind_rejected"] + count["decisions_unschedulable"] + count["decisions_stale"]
    assert handled == len(new), (count, len(new))
    # the dead cluster's decisions still in the stream when it died were acked as foreign, never applied
    assert count["decisions_foreign"] >= sum(1 for d in old if d.decided_at > killed_at)


async def test_every_bound_decision_has_experience_across_kill_and_sigterm(nats_url, service_processes, tmp_path):
    nodes_csv, pods_csv = sub_cluster(tmp_path)
    cluster = "durable-reward"
    out = tmp_path / "replay.json"
    env = replay_env(nats_url, cluster, tmp_path, pods_csv, nodes_csv, AGMARL_REPLAY_OUT=str(out),
                     AGMARL_FLUSH_SECONDS="2")
    bus = await Bus.connect(nats_url, name="test-reward-durable")
    log = EventLog()
    try:
        await bus.ensure_streams()
        await bus.subscribe(subjects.event(cluster), log.on_msg)
        reward = service_processes(module_of("reward-calculator"), env=env)
        await wait_healthy(bus, "reward-calculator", timeout=60, proc=reward)
        procs = {s: service_processes(module_of(s), env=env) for s in ("graph-builder", "inference", "state-collector")}
        for s, p in procs.items():
            await wait_healthy(bus, s, timeout=60, proc=p)
        stops, stopped = [], []
        for at, how in ((40, "SIGKILL"), (120, "SIGTERM")):
            assert await wait_for(lambda: len(log.outcomes()) >= at, timeout=90), reward.output()[-2000:]
            if how == "SIGKILL":
                kill9(reward)
            else:
                # a clean exit is the property (its flush, task cancel and drain may be slow on a loaded machine)
                stops.append(reward.stop(timeout=60))
                stopped.append(reward)
            reward = service_processes(module_of("reward-calculator"), env=env)
            await wait_healthy(bus, "reward-calculator", timeout=60, proc=reward)
        assert stops == [0], stopped[0].output()[-4000:]
        assert await wait_for(out.exists, timeout=120, interval=0.5), procs["state-collector"].output()[-2000:]
        procs["inference"].stop()
        bound = {e.decision_id for e in log.outcomes() if e.type == "pod_bound"}
        refused = {e.decision_id for e in log.outcomes() if e.type == "bind_rejected"}
        assert await wait_for(lambda: drained(bus, "reward-calculator", cluster), timeout=60), reward.output()[-3000:]
        experience = await read_stream(bus, subjects.experience(cluster), m.Experience)
    finally:
        await bus.close()
    ids = [e.id for e in experience]
    assert len(ids) == len(set(ids)), "a decision has two experiences"
    missing = bound - set(ids)
    assert not missing, f"{len(missing)} of {len(bound)} bound decisions have no experience"
    assert not refused & set(ids), "a refused bind was rewarded"
    assert all(e.action["node"] == "" for e in experience if e.id not in bound)  # else only unschedulable ones


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_three_replicas_keep_acknowledging_with_one_server_lost(tmp_path):
    """deploy/k8s's NATS: three servers (the StatefulSet's flags), fsync on every write, streams created with
    ``stream_replicas = 3``; with one server killed, decisions are still acknowledged and every one reaches a
    durable consumer once."""
    cports, ports = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in cports)
    servers = []
    for i in range(3):
        conf = tmp_path / f"nats-{i}.conf"
        conf.write_text(f'jetstream {{\n  store_dir: "{tmp_path}/store-{i}"\n  sync_interval: always\n}}\n')
        servers.append(subprocess.Popen(
            [str(find_binary()), "-c", str(conf), "-a", "127.0.0.1", "-p", str(ports[i]), "--server_name", f"nats-{i}",
             "--cluster_name", "agmarl", "--cluster", f"nats://127.0.0.1:{cports[i]}", "--routes", routes],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    bus = None
    try:
        bus = await Bus.connect(f"nats://127.0.0.1:{ports[1]}", "test-replicas", connect_wait=15.0)
        bus.stream_replicas = 3

        errors: list[str] = []

        async def created():
            try:
                return await bus.ensure_stream(subjects.DECISIONS)
            except Exception as exc:  # noqa: BLE001 - no JetStream meta leader yet
                errors.append(repr(exc))
                return None
        # three servers electing a meta leader with fsync on every write: seconds, more on a loaded CI machine
        info = await wait_for(created, timeout=60, interval=0.2)
        assert info is not None, f"no replicated stream after 60 s; last errors: {errors[-3:]}"
        assert info.config.num_replicas == 3 and len(info.cluster.replicas) == 2
        got: list[str] = []

        async def on_msg(msg):
            got.append(msg.header["Nats-Msg-Id"])
            await msg.ack()
        # a message the killed server had delivered but not seen acked comes again after ack_wait: keep it short
        await bus.durable_subscribe(subjects.DECISIONS.name, subjects.decision_wildcard("c"), "replicas", on_msg,
                                    ack_wait=2.0, max_deliver=50)
        await bus.js_publish(subjects.decision("c", "ns"), b"before", msg_id="d0")
        servers[0].kill()
        servers[0].wait(10)

        async def acked(msg_id: str):
            try:
                return await bus.js_publish(subjects.decision("c", "ns"), msg_id.encode(), msg_id=msg_id, timeout=1.0)
            except Exception:  # noqa: BLE001 - a new stream leader is being elected
                return None
        for k in range(1, 21):
            assert await wait_for(lambda: acked(f"d{k}"), timeout=20, interval=0.1), f"d{k} never acknowledged"
        assert await wait_for(lambda: len(set(got)) >= 21, timeout=40), sorted(set(got))
        assert sorted(set(got), key=lambda s: int(s[1:])) == [f"d{k}" for k in range(21)]
    finally:
        if bus is not None:
            await bus.close()
        for proc in servers:
            proc.kill()
            proc.wait(10)
