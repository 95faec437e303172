"""Chaos benchmark (issue 14.6): faults injected into a running system under steady load, one at a time,
and what each cost.

The system is the one `agmarl up` runs (``System``: an authenticated embedded nats-server, the six services
as processes, the state-collector's simulator as the cluster at its default ~50 % load) with the same
supervision loop (``System.supervise`` every 0.2 s, restarts with backoff). Each fault is ``kill`` (SIGKILL)
or ``stop`` (SIGSTOP for ``--stop-seconds``, then SIGCONT) of one service or the nats-server. After each
fault the benchmark waits until decisions flow again (a pod bound by a decision made after the fault ended),
then ``--steady`` seconds before the next fault. At the end it stops inference (no new decisions), waits
``--ack-wait`` + 10 s so unacked decisions are redelivered and settled, and reads the DECISIONS stream and
the last snapshot. Experiences are recorded as they are stored (``ExperienceLog``, from the start): the
EXPERIENCE stream keeps 1 GiB and drops its oldest beyond that, which a full run exceeds.

Per fault (each decision is counted in the window of the fault that precedes its ``decided_at``):

- lost: acknowledged decisions (on the DECISIONS stream) with a node, for pods of the current cluster that
  are still pending at the end, never bound or refused (a ``pod_bound``/``bind_rejected`` event naming them);
- decided twice: pods (of one cluster epoch) with more placement decisions than refused binds + 1; bound
  twice: pods with two ``pod_bound`` events in one epoch (an event is one ``(epoch, seq)``: the state-collector
  publishes a decision's outcome again, with the same sequence number, when storing it failed in a NATS crash);
- bound w/o exp: ``pod_bound`` decisions with no Experience (id = decision id) on the EXPERIENCE stream;
- violations: the largest hard-filter violation count a snapshot reported in the window;
- recover s: fault end (the kill, or the SIGCONT) to the first pod bound by a decision made after it;
- stall s: the longest time without any pod bound, from the last bind before the fault to that first one
  (a SIGSTOP's pause shows here, not in recover s).

A killed state-collector is a new simulated cluster (a new epoch): the old cluster's pods are gone, so its
undelivered decisions are not counted as lost. Events are read with a core subscription: an event published
while this benchmark's own connection is reconnecting is missed, which can only under-count bound decisions.

    nice .venv/bin/python benchmarks/chaos.py                     # every service and NATS, kill and stop
    nice .venv/bin/python benchmarks/chaos.py --faults inference:kill,nats-server:stop --nodes 20
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from agmarl_cli.keys import local_model_keys
from agmarl_cli.monitor import check_health, probe_health
from agmarl_cli.supervisor import NATS, SERVICES, System
from agmarl_common.runtime import messages as m
from agmarl_common.runtime import permissions, subjects
from agmarl_common.runtime.bus import MSG_ID_HEADER, Bus
from agmarl_common.core.cluster.compact import pod_key_of
from agmarl_common.runtime.natsauth import NatsAuth

CLUSTER = "chaos"
TARGETS = (*SERVICES, NATS)


@dataclass
class Fault:
    target: str
    kind: str  # "kill" | "stop"
    started: float = 0.0  # wall clock
    ended: float = 0.0  # the kill, or the SIGCONT
    recover_s: float | None = None  # None: decisions did not flow again within the bound
    stall_s: float | None = None  # the longest time without a pod bound, from the last bind before the fault on
    counts: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)  # bound decisions without experience (their ids)


class Recorder:
    """What the benchmark sees on the bus: when each decision arrived, every event and the snapshots."""

    def __init__(self) -> None:
        self.decided: dict[str, float] = {}  # decision id -> its decided_at (the deciding process's wall time)
        self.events: list[m.ClusterEvent] = []
        self.seen: set[tuple[str, int]] = set()  # (epoch, seq) of the events recorded
        self.bound_at: list[float] = []  # wall time of each pod_bound event, in arrival order
        self.epochs: list[str] = []  # in order of appearance
        self.last_snapshot: m.ClusterSnapshot | None = None
        self.violations: list[tuple[float, int]] = []  # (wall time, a snapshot's violation count)
        self.flowing = asyncio.Event()  # set when a pod is bound by a decision seen after ``since``
        self.training: list[str] = []  # the trainer's train statuses ("<status> <request id>"): fine-tunes compete for the cores
        self.since = float("inf")

    def _epoch(self, epoch: str) -> None:
        if epoch and epoch not in self.epochs:
            self.epochs.append(epoch)

    async def on_decision(self, msg) -> None:
        # the decision's own time, not when it is seen here: a decision the killed process made just before the
        # kill can arrive after it and must not count as "flowing again" (a CI run did: recover 0.0 s, then no
        # decision in the fault's window while inference restarted)
        decision = m.decode(m.Decision, msg.data)
        self.decided.setdefault(decision.decision_id, decision.decided_at)

    async def on_event(self, msg) -> None:
        event = m.decode(m.ClusterEvent, msg.data)
        if (event.epoch, event.seq) in self.seen:  # the same event again (a store retried after a NATS crash)
            return
        self.seen.add((event.epoch, event.seq))
        self.events.append(event)
        self._epoch(event.epoch)
        if event.type == "pod_bound":
            self.bound_at.append(time.time())
            if self.decided.get(event.decision_id, 0.0) > self.since:
                self.flowing.set()

    async def on_train_status(self, msg) -> None:
        status = m.decode(m.TrainStatus, msg.data)
        self.training.append(f"{status.status} {status.request_id}")

    async def on_snapshot(self, msg) -> None:
        snap = m.decode(m.ClusterSnapshot, msg.data)
        self._epoch(snap.epoch)
        self.last_snapshot = snap
        self.violations.append((time.time(), int(snap.stats.get("violations", 0))))

    def stall(self, started: float, until: float) -> float:
        """The longest gap between pods bound, from the last bind before ``started`` to the first after ``until``."""
        first = max(0, bisect.bisect_left(self.bound_at, started) - 1)
        last = bisect.bisect_right(self.bound_at, until)
        times = self.bound_at[first:last + 1]
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)

    async def flowing_after(self, t: float, timeout: float) -> float | None:
        """Seconds from ``t`` until a pod is bound by a decision seen after ``t`` (None: not within ``timeout``)."""
        self.since = t
        self.flowing.clear()
        try:
            await asyncio.wait_for(self.flowing.wait(), timeout)
        except asyncio.TimeoutError:
            return None
        return time.time() - t


async def read_stream(bus: Bus, subject: str, read, quiet: float = 2.0, limit: int = 500_000) -> list:
    """``read(msg)`` of every message on ``subject`` in its stream, from the start (an ordered consumer)."""
    sub = await bus.js.subscribe(subject, ordered_consumer=True)
    out = []
    try:
        while len(out) < limit:
            try:
                out.append(read(await sub.next_msg(timeout=quiet)))
            except asyncio.TimeoutError:
                break
    finally:
        await sub.unsubscribe()
    return out


class DecisionRef(NamedTuple):
    """The fields of a Decision the tally reads (a whole Decision holds every node's scores)."""

    decision_id: str
    pod_key: str
    node: str
    seen_at: float
    decided_at: float

    @classmethod
    def of(cls, msg) -> "DecisionRef":
        d = m.decode(m.Decision, msg.data)
        return cls(d.decision_id, d.pod_key, d.node, d.seen_at, d.decided_at)


class ExperienceLog:
    """The ids of every Experience stored, read as they come (an ordered consumer from the stream's start that
    resumes after a NATS restart): the EXPERIENCE stream keeps 1 GiB and drops its oldest messages beyond that
    (a run of ~10,000 decisions on 50 nodes writes more), so reading it only at the end would miss the first."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.last = time.monotonic()  # when the last one came

    async def follow(self, bus: Bus, subject: str, stop: asyncio.Event) -> None:
        sub = None
        while sub is None and not stop.is_set():
            try:
                sub = await bus.js.subscribe(subject, ordered_consumer=True)
            except Exception:  # noqa: BLE001 - the reward-calculator has not created the stream yet
                await asyncio.sleep(0.5)
        try:
            while not stop.is_set():
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except asyncio.TimeoutError:
                    continue
                self.ids.add(experience_id(msg))
                self.last = time.monotonic()
        finally:
            if sub is not None:
                await sub.unsubscribe()

    async def settled(self, quiet: float, timeout: float) -> None:
        """Wait until no experience has come for ``quiet`` seconds (bounded by ``timeout``): the
        reward-calculator has worked through its backlog."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and time.monotonic() - self.last < quiet:
            await asyncio.sleep(0.5)


def scrape(url: str, family: str) -> dict[str, float]:
    """The samples of one metric family (label set -> value) from a /metrics page; {} when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    return {line.rsplit(" ", 1)[0][len(family):] or "total": float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(family)}


def experience_id(msg) -> str:
    """An Experience's id (= its decision's id) from its Nats-Msg-Id header, without decoding the states."""
    return (msg.headers or {}).get(MSG_ID_HEADER) or m.decode(m.Experience, msg.data).id


def tally(faults: list[Fault], rec: Recorder, decisions: list[DecisionRef], experience_ids: set[str],
          collector_kills: list[float]) -> None:
    """Fill each fault's counts (see the module docstring)."""
    starts = [f.started for f in faults]

    def window(t: float) -> int | None:
        i = bisect.bisect_right(starts, t) - 1
        return i if i >= 0 else None

    def epoch_of(d: DecisionRef) -> str:  # the cluster a decision was made for: which collector announced it
        i = bisect.bisect_right(collector_kills, d.seen_at)
        return rec.epochs[i] if i < len(rec.epochs) else f"#{i}"

    outcome = {e.decision_id for e in rec.events if e.type in ("pod_bound", "bind_rejected") and e.decision_id}
    bound = [e for e in rec.events if e.type == "pod_bound" and e.decision_id]
    by_id = {d.decision_id: d for d in decisions}
    current = rec.epochs[-1] if rec.epochs else ""
    pending = {pod_key_of(p) for p in (rec.last_snapshot.pending if rec.last_snapshot else [])}
    for f in faults:
        f.counts = {"lost": 0, "decided_twice": 0, "bound_twice": 0, "bound_without_experience": 0,
                    "violations": 0, "decisions": 0}
    placements: dict[tuple[str, str], list[DecisionRef]] = defaultdict(list)
    for d in decisions:
        w = window(d.decided_at)
        if w is None:
            continue
        faults[w].counts["decisions"] += 1
        if d.node:
            placements[(epoch_of(d), d.pod_key)].append(d)
            if epoch_of(d) == current and d.pod_key in pending and d.decision_id not in outcome:
                faults[w].counts["lost"] += 1
    refused = Counter((e.epoch, e.pod_key) for e in rec.events if e.type == "bind_rejected")
    for key, ds in placements.items():
        if len(ds) > refused[key] + 1:
            w = window(sorted(d.decided_at for d in ds)[1])
            faults[w].counts["decided_twice"] += 1  # type: ignore[index]
    for (epoch, key), n in Counter((e.epoch, e.pod_key) for e in bound).items():
        if n > 1:
            first = next(e for e in bound if (e.epoch, e.pod_key) == (epoch, key))
            d = by_id.get(first.decision_id)
            w = window(d.decided_at) if d else None
            if w is not None:
                faults[w].counts["bound_twice"] += 1
    for e in bound:
        d = by_id.get(e.decision_id)
        w = window(d.decided_at) if d else None
        if w is not None and e.decision_id not in experience_ids:
            faults[w].counts["bound_without_experience"] += 1
            faults[w].examples.append(e.decision_id)
    for t, v in rec.violations:
        w = window(t)
        if w is not None:
            faults[w].counts["violations"] = max(faults[w].counts["violations"], v)


async def supervise(system: System, stop: asyncio.Event, lines: list[str]) -> None:
    while not stop.is_set():
        lines += [f"{time.time():.1f} {event}" for event in await asyncio.to_thread(system.supervise)]
        try:
            await asyncio.wait_for(stop.wait(), 0.2)
        except asyncio.TimeoutError:
            pass


async def wait_all_healthy(bus: Bus, timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    status: dict[str, str] = {}
    while time.monotonic() < deadline:
        status = await check_health(bus, SERVICES, timeout=3.0)
        if all(v == "healthy" for v in status.values()):
            break
        await asyncio.sleep(0.5)
    return status


async def inject(system: System, fault: Fault, stop_seconds: float) -> None:
    pid = system.nats.pid if fault.target == NATS else system.procs[fault.target].pid
    fault.started = time.time()
    if fault.kind == "kill":
        os.kill(pid, signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(stop_seconds)  # the fault's length, not a wait for something
        finally:
            os.kill(pid, signal.SIGCONT)
    fault.ended = time.time()


async def run(faults: list[Fault], root: Path, nodes: int = 50, stop_seconds: float = 5.0, steady: float = 10.0,
              recover_timeout: float = 60.0, ack_wait: float = 30.0, settle_timeout: float = 180.0,
              log=print) -> dict:
    os.environ["AGMARL_STATE_DIR"] = str(root)  # the credentials live under it
    for name in ("NATS_URL", "AGMARL_NATS_URL", "AGMARL_NATS_CREDS_DIR"):
        os.environ.pop(name, None)
    system = System(root=root, run_id="chaos")
    root.mkdir(parents=True, exist_ok=True)
    rec, lines, collector_kills = Recorder(), [], []
    stop = asyncio.Event()
    bus: Bus | None = None
    reader: Bus | None = None
    supervisor: asyncio.Task | None = None
    experiences, following, follower = ExperienceLog(), asyncio.Event(), None
    main_task = asyncio.current_task()
    for sig in (signal.SIGTERM, signal.SIGHUP):  # stopped from outside: the finally below stops what it started
        asyncio.get_running_loop().add_signal_handler(sig, main_task.cancel)
    try:
        system.start_nats()
        env = {**local_model_keys(root), "AGMARL_CLUSTER": CLUSTER, "AGMARL_SIM_NODES": str(nodes),
               "AGMARL_DECISION_ACK_WAIT": str(ack_wait)}
        system.start_services(env)
        operator = NatsAuth(seed_file=str(system.creds.seed(permissions.OPERATOR)), identity=permissions.OPERATOR)
        bus = await Bus.connect(system.nats_url, "agmarl-chaos", auth=operator)
        await bus.subscribe(subjects.decision_wildcard(CLUSTER), rec.on_decision)
        await bus.subscribe(subjects.event(CLUSTER), rec.on_event)
        await bus.subscribe(subjects.snapshot(CLUSTER), rec.on_snapshot)
        await bus.subscribe(subjects.train_status(), rec.on_train_status)
        # supervised from the start, as `agmarl up` does: a service that dies starting (its metrics port taken
        # meanwhile: a CI run) is restarted, not left unhealthy
        supervisor = asyncio.get_running_loop().create_task(supervise(system, stop, lines))
        status = await wait_all_healthy(bus, 120.0)
        if any(v != "healthy" for v in status.values()):
            raise RuntimeError(f"not healthy: {status}; logs in {system.log_dir}")
        # EXPERIENCE is the trainer's to read (proto/permissions.md): read it as the trainer
        reader = await Bus.connect(system.nats_url, "agmarl-chaos-experience", auth=NatsAuth(
            seed_file=str(system.creds.seed("trainer")), identity="trainer"))
        follower = asyncio.get_running_loop().create_task(
            experiences.follow(reader, subjects.experience(CLUSTER), following))
        if await rec.flowing_after(time.time(), recover_timeout) is None:
            raise RuntimeError(f"no decisions flowing before the first fault; logs in {system.log_dir}")
        for fault in faults:
            await inject(system, fault, stop_seconds)
            if fault.target == "state-collector" and fault.kind == "kill":
                collector_kills.append(fault.started)
            fault.recover_s = await rec.flowing_after(fault.ended, recover_timeout)
            fault.stall_s = rec.stall(fault.started, time.time())
            log(f"{fault.target:18s} {fault.kind:4s} recovered in "
                f"{'-' if fault.recover_s is None else f'{fault.recover_s:.1f}'} s")
            await asyncio.sleep(steady)  # steady load between faults
        stop.set()
        await supervisor
        system.procs["inference"].send_signal(signal.SIGTERM)  # no new decisions: what is decided is all there is
        await asyncio.to_thread(system.procs["inference"].wait, 30)
        await asyncio.sleep(ack_wait + 10.0)  # unacked decisions redelivered and settled, snapshots current
        decisions = await read_stream(bus, subjects.decision_wildcard(CLUSTER), DecisionRef.of)
        # the reward-calculator's decision consumer, as the reward-calculator sees it
        rc = await Bus.connect(system.nats_url, "agmarl-chaos-rc", auth=NatsAuth(
            seed_file=str(system.creds.seed("reward-calculator")), identity="reward-calculator"))
        try:
            await experiences.settled(quiet=10.0, timeout=settle_timeout)
            experience = set(experiences.ids)
            stored = (await reader.js.stream_info(subjects.EXPERIENCE.name)).state.messages
            reward_consumer = await decision_consumer(rc, "reward-calculator")
            try:  # what it holds and the newest snapshot / bind outcome it has read (its health details)
                health = (await probe_health(bus, "reward-calculator", timeout=5.0)).details
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                health = {"error": f"{type(exc).__name__}: {exc}"}
            reward_consumer["health"] = health
            reward_consumer["last_snapshot_seq"] = rec.last_snapshot.seq if rec.last_snapshot else None
        finally:
            await rc.close()
        # the state-collector's (the binder's): decisions still waiting there are counted as lost above
        sc = await Bus.connect(system.nats_url, "agmarl-chaos-sc", auth=NatsAuth(
            seed_file=str(system.creds.seed("state-collector")), identity="state-collector"))
        try:
            binder_consumer = await decision_consumer(sc, "state-collector")
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            binder_consumer = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            await sc.close()
        unrewarded = scrape(system.metrics_urls()["reward-calculator"], "agmarl_decisions_unrewarded_total")
        published = scrape(system.metrics_urls()["reward-calculator"], "agmarl_experience_published_total")
        recalled = scrape(system.metrics_urls()["reward-calculator"], "agmarl_outcomes_recalled_total")
        credits = scrape(system.metrics_urls()["reward-calculator"], "agmarl_experience_credit_total")
    finally:
        stop.set()
        following.set()
        if supervisor is not None and not supervisor.done():
            await supervisor
        if follower is not None:
            await follower
        for conn in (bus, reader):
            if conn is not None:
                await conn.close()
        system.stop()
    tally(faults, rec, decisions, experience, collector_kills)
    return {"faults": [asdict(f) for f in faults], "decisions": len(decisions), "experience": len(experience),
            "epochs": len(rec.epochs), "supervision": system.report(), "supervisor_log": lines,
            "nodes": nodes, "stop_seconds": stop_seconds, "ack_wait": ack_wait, "unrewarded": unrewarded,
            "experience_published": published, "outcomes_recalled": recalled, "experience_stored_at_end": stored,
            "reward_consumer": reward_consumer, "binder_consumer": binder_consumer, "training": rec.training,
            "credits": credits}


async def decision_consumer(conn: Bus, service: str) -> dict:
    """``service``'s durable DECISIONS consumer as ``conn`` (connected as that service) reads it."""
    info = await conn.js.consumer_info(subjects.DECISIONS.name, subjects.durable(service, CLUSTER))
    return {"pending": info.num_pending, "ack_pending": info.num_ack_pending, "redelivered": info.num_redelivered}


def table(result: dict) -> str:
    head = (f"{'fault':26s} {'recover s':>9s} {'stall s':>7s} {'lost':>5s} {'twice':>6s} {'bound2x':>7s} "
            f"{'no exp':>6s} {'viol':>5s} {'decisions':>9s}")
    rows = [head, "-" * len(head)]
    for f in result["faults"]:
        c = f["counts"]
        rec = "never" if f["recover_s"] is None else f"{f['recover_s']:.1f}"
        rows.append(f"{f['target'] + ' ' + f['kind']:26s} {rec:>9s} {f['stall_s'] or 0.0:7.1f} {c['lost']:5d} "
                    f"{c['decided_twice']:6d} {c['bound_twice']:7d} {c['bound_without_experience']:6d} "
                    f"{c['violations']:5d} {c['decisions']:9d}")
    return "\n".join(rows)


def parse_faults(text: str) -> list[Fault]:
    if text == "all":
        return [Fault(t, k) for t in TARGETS for k in ("kill", "stop")]
    out = []
    for item in text.split(","):
        target, _, kind = item.partition(":")
        if target not in TARGETS or kind not in ("kill", "stop"):
            raise SystemExit(f"chaos: bad fault {item!r}: <{'|'.join(TARGETS)}>:<kill|stop>")
        out.append(Fault(target, kind))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", default="all", help="all, or target:kind,... (kind kill or stop)")
    ap.add_argument("--nodes", type=int, default=50, help="simulated nodes (AGMARL_SIM_NODES)")
    ap.add_argument("--stop-seconds", type=float, default=5.0)
    ap.add_argument("--steady", type=float, default=10.0, help="seconds of steady load after each recovery")
    ap.add_argument("--ack-wait", type=float, default=30.0, help="AGMARL_DECISION_ACK_WAIT for the services")
    ap.add_argument("--recover-timeout", type=float, default=60.0)
    ap.add_argument("--json", help="write the full result here")
    ap.add_argument("--keep", help="run in this directory and keep it (the services' logs: DIR/.state/logs)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="agmarl-chaos-") as tmp:
        root = Path(args.keep or tmp) / ".state"
        result = asyncio.run(run(parse_faults(args.faults), root, args.nodes, args.stop_seconds,
                                 args.steady, args.recover_timeout, args.ack_wait,
                                 log=lambda s: print(s, file=sys.stderr, flush=True)))
    print(table(result))
    print(f"decisions {result['decisions']}, experience {result['experience']} (the stream holds the last "
          f"{result['experience_stored_at_end']}), cluster epochs {result['epochs']}; "
          f"restarts {json.dumps({k: v['restarts'] for k, v in result['supervision'].items() if v['restarts']})}")
    print(f"reward-calculator's unrewarded decisions (last process): {json.dumps(result['unrewarded'])}; its "
          f"decision consumer at the end: {json.dumps(result['reward_consumer'])}")
    print(f"the state-collector's decision consumer at the end (what it has not applied yet): "
          f"{json.dumps(result['binder_consumer'])}")
    print(f"train statuses during the run: {json.dumps(result['training'])}; last reward-calculator's experience "
          f"credits: {json.dumps(result['credits'])}")
    print(f"last reward-calculator: experience by what it lacks {json.dumps(result['experience_published'])}; bind "
          f"outcomes read back from EVENTS at its start {json.dumps(result['outcomes_recalled'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
