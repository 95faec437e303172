"""Decision latency through the services (issue 11): a pending pod published by the state-collector to its
decision acknowledged on the JetStream DECISIONS stream, on the openb cluster (1,523 nodes by default),
at a steady arrival rate.

Real parts: an embedded nats-server, the state-collector replaying openb's default pod list (inflation
order, ``--rate`` pods per second, announced one at a time on a 10 ms tick), graph-builder and inference
as processes, the policy pinned. The benchmark reads the DECISIONS stream with an ordered push consumer:
latency = arrival on the stream consumer - the PendingPod's ``seen_at`` (set when the collector
publishes it), so it includes inference's decision, the JetStream publish and its acknowledgement, and
the delivery back; and ``stored on DECISIONS``: the time the stream stored each decision (JetStream's own
timestamp, taken right before its PubAck, read from the ack subject the consumer receives it with) - the
``seen_at``, i.e. until the decision is acknowledged on the stream, without the delivery to this benchmark's
process. Prints p50 / p90 / p99 / max over the measured decisions (after ``--warmup``),
inference's own share (``decided_at - seen_at``), the inference process's CPU time per measured decision
(user + system, from /proc: the figure that moves least with other jobs on a shared machine; of it, its
event-loop thread's, the rest being the span exporter's and the metrics server's threads), the CPU per
measured decision of the path's other processes (state-collector, graph-builder, nats-server, this
benchmark: they share the cores with inference) and the 1-minute load average at the start and the end.

    nice .venv/bin/python benchmarks/live_latency.py --nodes openb:all --rate 100 --pods 3000 --policy model:default

Inference explains every decision (the model's attention and feature contributions in ``explanation.model``)
as the service does by default; ``--no-explain`` runs it with ``AGMARL_EXPLAIN_MODEL=false`` (before
2026-12-02 09:00 that was this benchmark's default).

``--sync always``: nats-server fsyncs every stored message before its PubAck, as the server ``agmarl up``
embeds and ``deploy/nats/nats.conf`` run it (issue 14's durability); without it, nats-server's default.

``--profile FILE``: py-spy (in the venv) samples the inference process over the measured decisions, to FILE.
py-spy samples threads that are running or runnable (wall clock), not CPU time: on a loaded machine a
syscall that wakes another process (the socket write to nats-server) looks far more expensive than it is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError
from nats.js.api import DeliverPolicy

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.natsserver import NatsServer
from agmarl_testing.fixtures import wait_healthy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import live_timeline  # noqa: E402 - the benchmark's own probe (--timeline), next to this file

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("graph-builder", "inference", "state-collector")


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU time of a process (or of its thread ``tid``) so far (Linux /proc; nan elsewhere)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_delay_seconds(pid: int) -> float:
    """Time the process's threads spent runnable, waiting for a core, so far (Linux schedstat; nan elsewhere)."""
    total = 0.0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")
    return total


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


async def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="agmarl-live-latency-"))
    ns = NatsServer(store_dir=work / "js", sync_interval=args.sync or None)
    ns.start()
    cluster = "bench"
    env = {**os.environ, "NATS_URL": ns.url, "AGMARL_CLUSTER": cluster, "AGMARL_HTTP_PORT": "0",
           "AGMARL_STATE_DIR": str(work / "state"), "AGMARL_TRACE_DIR": str(work / "traces"),
           "AGMARL_REPLAY_WORKLOAD": args.workload, "AGMARL_REPLAY_NODES": args.nodes,
           "AGMARL_REPLAY_RATE": str(args.rate), "AGMARL_REPLAY_IN_FLIGHT": "100000",
           "AGMARL_SIM_SEED": str(args.seed), "AGMARL_TICK_SECONDS": "0.01", "AGMARL_SNAPSHOT_SECONDS": "30",
           "AGMARL_PINNED_POLICY": args.policy, "AGMARL_BRIEF_WORKLOAD": args.workload,
           "AGMARL_OBJECTIVE": args.objective, "AGMARL_EXPLAIN_MODEL": "true" if args.explain else "false",
           "AGMARL_LOG_LEVEL": "WARNING"}
    procs = {}
    bus = None
    probes = work / "timeline"
    probes.mkdir()
    arrivals: list[tuple[float, str, float]] = []  # (arrival, trace id, seen_at) of the measured decisions

    def start(service: str) -> subprocess.Popen:
        module = "agmarl_" + service.replace("-", "_")
        cmd = live_timeline.probed_command(module, str(probes)) if args.timeline else [sys.executable, "-m", module]
        return subprocess.Popen(cmd, env=env, stdout=open(work / f"{service}.log", "w"), stderr=subprocess.STDOUT)

    try:
        for s in SERVICES[:2]:  # the collector last: it starts announcing at once
            procs[s] = start(s)
        bus = await Bus.connect(ns.url, name="bench-live-latency")
        for s in SERVICES[:2]:
            await wait_healthy(bus, s, timeout=120)
        await bus.ensure_streams()
        got: list[tuple[float, m.Decision]] = []
        stored: list[float] = []  # when DECISIONS stored each decision (its PubAck follows), as got
        done = asyncio.Event()
        cpu = {}  # inference's CPU seconds when the measured decisions start and end
        profiler: list[subprocess.Popen] = []
        load_start = os.getloadavg()[0]

        def others_cpu() -> dict[str, float]:
            """CPU so far of the other processes of the path (they share the cores with inference)."""
            pids = {s: p.pid for s, p in procs.items() if s != "inference"}
            pids.update({"nats-server": ns.pid, "benchmark": os.getpid()})
            return {s: cpu_seconds(pid) for s, pid in pids.items() if pid}

        def waits() -> dict[str, float]:
            """Run-queue wait so far of every process of the path, inference included."""
            pids = {s: p.pid for s, p in procs.items()}
            pids.update({"nats-server": ns.pid, "benchmark": os.getpid()})
            return {s: run_delay_seconds(pid) for s, pid in pids.items() if pid}

        async def on_decision(msg) -> None:
            at = time.time()
            got.append((at, m.decode(m.Decision, msg.data)))
            stored.append(stored_at(msg.reply))
            if len(got) == args.warmup:
                pid = procs["inference"].pid
                cpu["start"], cpu["loop_start"] = cpu_seconds(pid), cpu_seconds(pid, pid)
                cpu["others_start"], cpu["wait_start"] = others_cpu(), waits()
                if args.profile:  # py-spy over the measured decisions (it samples from outside the process)
                    profiler.append(subprocess.Popen(
                        [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(procs["inference"].pid),
                         "-o", args.profile, "-f", "speedscope" if args.profile.endswith(".json") else "raw",
                         "-r", "200", "-d", str(int(args.pods / args.rate) + 1), "--nonblocking"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if len(got) >= args.warmup + args.pods and not done.is_set():
                pid = procs["inference"].pid
                cpu["end"], cpu["loop_end"] = cpu_seconds(pid), cpu_seconds(pid, pid)
                cpu["others_end"], cpu["wait_end"] = others_cpu(), waits()
                done.set()

        js = bus.nc.jetstream()
        await js.subscribe(subjects.decision_wildcard(cluster), cb=on_decision, ordered_consumer=True,
                           deliver_policy=DeliverPolicy.NEW)
        procs["state-collector"] = start("state-collector")
        limit = 120 + (args.warmup + args.pods) / args.rate * 3
        try:
            await asyncio.wait_for(done.wait(), timeout=limit)
        except asyncio.TimeoutError:
            print(f"only {len(got)} decisions within {limit:.0f} s", file=sys.stderr)
        measured = got[args.warmup:args.warmup + args.pods]
        arrivals.extend((at, d.trace_id, d.seen_at) for at, d in measured)
        e2e = [1000 * (at - d.seen_at) for at, d in measured]
        own = [1000 * (d.decided_at - d.seen_at) for _, d in measured]
        acked = [1000 * (t - d.seen_at) for t, (_, d) in zip(stored[args.warmup:args.warmup + args.pods], measured)]
        span = (measured[-1][0] - measured[0][0]) if len(measured) > 1 else float("nan")
        out = {"nodes": args.nodes, "rate": args.rate, "policy": args.policy, "objective": args.objective,
               "explanations": args.explain, "sync": args.sync or "default",
               "decisions": len(measured), "achieved_rate": len(measured) / span if span else float("nan"),
               "scheduled": sum(1 for _, d in measured if d.node),
               "latency_ms": {"p50": pct(e2e, 50), "p90": pct(e2e, 90), "p99": pct(e2e, 99), "max": max(e2e or [0])},
               "inference_ms": {"p50": pct(own, 50), "p99": pct(own, 99)},
               "stored_ms": {"p50": pct(acked, 50), "p90": pct(acked, 90), "p99": pct(acked, 99), "max": max(acked or [0])},
               "inference_cpu_ms_per_decision": 1000 * (cpu["end"] - cpu["start"]) / len(measured)
               if "end" in cpu and "start" in cpu and measured else float("nan"),
               "inference_loop_cpu_ms_per_decision": 1000 * (cpu["loop_end"] - cpu["loop_start"]) / len(measured)
               if "end" in cpu and "start" in cpu and measured else float("nan"),
               "others_cpu_ms_per_decision": {
                   s: 1000 * (cpu["others_end"][s] - t) / len(measured) for s, t in cpu["others_start"].items()
                   if s in cpu["others_end"]} if "others_end" in cpu and measured else {},
               "run_queue_wait_ms_per_decision": {
                   s: 1000 * (cpu["wait_end"][s] - t) / len(measured) for s, t in cpu["wait_start"].items()
                   if s in cpu["wait_end"]} if "wait_end" in cpu and measured else {},
               "load_avg_1m": {"start": load_start, "end": os.getloadavg()[0]}}
        for p in profiler:
            p.wait(timeout=limit)
        return out
    finally:
        if bus is not None:
            await bus.close()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        ns.stop()
        if args.timeline and arrivals:
            report = live_timeline.analyse(probes, work / "traces", arrivals)
            live_timeline.print_report(report)
            Path(args.timeline).write_text(json.dumps(report, indent=2))
        if args.keep:
            print(f"logs and JetStream store kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


def stored_at(reply: str) -> float:
    """When the stream stored a message (its PubAck is sent right after): the timestamp of the JetStream ack
    subject a consumer receives it with, as nats-py reads it (``Msg.metadata``, both subject forms). NaN without
    one."""
    try:
        return Msg(_client=None, reply=reply or "").metadata.timestamp.timestamp()
    except NotJSMessageError:
        return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="openb:all")
    ap.add_argument("--workload", default="openb:default")
    ap.add_argument("--rate", type=float, default=100.0, help="pending pods per second")
    ap.add_argument("--pods", type=int, default=3000, help="decisions measured")
    ap.add_argument("--warmup", type=int, default=200, help="decisions not measured (start-up)")
    ap.add_argument("--policy", default="model:default")
    ap.add_argument("--objective", default="composite", choices=("composite", "allocation"))
    ap.add_argument("--explain", action=argparse.BooleanOptionalAction, default=True,
                    help="the model's explanation (attention, feature contributions) in each decision, as the "
                         "service does by default (AGMARL_EXPLAIN_MODEL); --no-explain: without it")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--sync", default="", help="nats-server's JetStream sync_interval (e.g. always: every stored "
                    "message fsynced before its PubAck, as `agmarl up` runs it); default: nats-server's own (2 min)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the run's folder (service logs, JetStream store)")
    ap.add_argument("--profile", default=None,
                    help="py-spy the inference process over the measured decisions into this file (collapsed "
                         "stacks, or speedscope when it ends in .json); its sampling adds to inference's CPU")
    ap.add_argument("--timeline", default=None,
                    help="record each message's timeline in the services (benchmarks/live_timeline.py: socket "
                         "reads and writes, slow event-loop callbacks, garbage collections) and write where the "
                         "slowest 1 %% of decisions spent their time to this JSON file")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    lat, own, acked = out["latency_ms"], out["inference_ms"], out["stored_ms"]
    print(f"live decision latency, {out['nodes']} nodes, {args.rate:.0f} pods/s, {out['policy']} "
          f"({out['objective']}, explanations {'on' if args.explain else 'off'}, nats-server sync "
          f"{args.sync or 'default'}): {out['decisions']} decisions at {out['achieved_rate']:.1f}/s: "
          f"p50 {lat['p50']:.2f} ms, p90 {lat['p90']:.2f} ms, p99 {lat['p99']:.2f} ms, max {lat['max']:.1f} ms "
          f"(inference's own: p50 {own['p50']:.2f}, p99 {own['p99']:.2f} ms; stored on DECISIONS: p50 "
          f"{acked['p50']:.2f}, p90 {acked['p90']:.2f}, p99 {acked['p99']:.2f} ms); inference CPU "
          f"{out['inference_cpu_ms_per_decision']:.2f} ms per decision (event-loop thread "
          f"{out['inference_loop_cpu_ms_per_decision']:.2f}; the others: "
          + ", ".join(f"{s} {v:.2f}" for s, v in out["others_cpu_ms_per_decision"].items())
          + "; run-queue wait per decision: "
          + ", ".join(f"{s} {v:.2f}" for s, v in out["run_queue_wait_ms_per_decision"].items())
          + f"); load {out['load_avg_1m']['start']:.2f} -> "
          f"{out['load_avg_1m']['end']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
