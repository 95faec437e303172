"""`agmarl up`: run the whole system locally, with a live view or headless for a duration."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

from agmarl_cli.keys import local_model_keys
from agmarl_cli.monitor import Monitor, check_health, latency_split, process_cpu_seconds, traces_complete
from agmarl_cli.supervisor import SERVICES, System, state_dir
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.telemetry import read_spans

STARTUP_TIMEOUT = 60.0  # the start gate: every service healthy within this, however loaded the machine
PROBE_TIMEOUTS = (1.0, 2.0, 4.0, 8.0)  # one health probe's wait, longer on each try (the last one repeats)


def render(mon: Monitor, elapsed: float, services: dict[str, str]) -> str:
    s = mon.stats
    lat = mon.latency_summary()
    load = mon.load_summary() if elapsed >= 2.0 else {}  # rates over the run so far, once there is one
    offered = f"   pods announced/s {load['announced_per_s']:.1f}" if "announced_per_s" in load else ""
    if load.get("keeping_up") is False:
        offered += "  (decisions falling behind: the latency includes a growing queue)"
    lines = [
        f"AGMARL-DKS  cluster {mon.cluster}   t={elapsed:6.0f}s   (Ctrl-C to stop)",
        "",
        f"scheduled/s {mon.rate():6.1f}   pending {int(s.get('pending', 0)):5d}   bound total {mon.pods_bound:6d}"
        f"   decisions {mon.decisions:6d}   refused binds {mon.bind_rejected}",
        f"utilisation cpu {s.get('utilisation_cpu', 0):5.1%}  mem {s.get('utilisation_memory', 0):5.1%}"
        f"  gpu {s.get('utilisation_gpu', 0):5.1%}   balance (std) {s.get('balance', 0):.3f}"
        f"   violations {int(s.get('violations', 0))}",
        f"decision latency (pod published -> decided) p50 {lat['p50']:.1f} ms  p99 {lat['p99']:.1f} ms"
        f"   decided/s {load.get('decided_per_s', 0.0):.1f}{offered}",
        "services: " + "  ".join(f"{k}={'ok' if v == 'healthy' else v}" for k, v in services.items()),
        "",
        "recent decisions:",
    ]
    for d in reversed(mon.recent):
        node = d.node or "(unschedulable)"
        lines.append(f"  {d.pod_key:40.40s} -> {node:16.16s} {d.policy:14.14s} score {d.score:6.1f}"
                     f"  trace {d.trace_id[:16]}")
    return "\n".join(lines)


async def run_up(duration: float | None, summary_path: str | None, view: bool, env: dict[str, str],
                 cluster: str = "sim", result: str | None = None) -> int:
    """``result``: a trace replay's result file; the run ends once it is written (and prints it)."""
    system = System(root=state_dir(), run_id=time.strftime("%Y%m%d-%H%M%S"))
    system.root.mkdir(parents=True, exist_ok=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    bus: Bus | None = None
    mon = Monitor(cluster=cluster)
    services: dict[str, str] = {s: "starting" for s in SERVICES}
    started = time.monotonic()
    ended = "stopped by a signal"  # why the run ended (Ctrl-C is the end of a run without --duration)
    failed: SystemExit | None = None
    try:
        url = system.start_nats()
        # the trainer signs with a key of this state directory, the services trust it (docs/security.md)
        system.start_services({**local_model_keys(system.root), **env, "AGMARL_CLUSTER": cluster})
        bus = await Bus.connect(url, name="agmarl-cli", auth=system.cli_auth())  # reconnects after a NATS restart
        await mon.attach(bus)
        await wait_healthy(bus, system, services, stop)
        mon.start_measuring(cpu=process_cpu_seconds(system.pids()))  # latency: pods announced from now on
        print(f"agmarl: cluster {cluster}: {system.endpoints()}", flush=True)
        started = time.monotonic()
        last_print = last_probe = 0.0
        while not stop.is_set():
            elapsed = time.monotonic() - started
            if duration is not None and elapsed >= duration:
                ended = "duration"
                break
            if result is not None and Path(result).exists():
                done = json.loads(Path(result).read_text())
                print(f"agmarl: replay finished: {done['pods']} pods, {done['scheduled']} scheduled, GPU allocation "
                      f"at 100 % arrived {done['gpu_alloc_100']:.2f} %, at 130 % {done['gpu_alloc_130']:.2f} % "
                      f"({result})", flush=True)
                ended = "replay finished"
                break
            for event in await asyncio.to_thread(system.supervise):  # restarts what died, with backoff
                print(f"agmarl: {event}", file=sys.stderr, flush=True)
                if event.name in services:
                    services[event.name] = "starting" if event.kind == "restarted" else event.text
            if elapsed - last_probe >= 5.0 and bus.is_connected and any(v != "healthy" for v in services.values()):
                last_probe = elapsed  # the restarted ones: healthy again?
                services.update(await probe_health(bus, [k for k, v in services.items() if v != "healthy"], 2.0))
            if view:
                sys.stdout.write("\x1b[2J\x1b[H" + render(mon, elapsed, services) + "\n")
                sys.stdout.flush()
            elif elapsed - last_print >= 5.0:
                last_print = elapsed
                restarts = sum(r["restarts"] for r in system.report().values())
                print(f"t={elapsed:5.0f}s decisions={mon.decisions} bound={mon.pods_bound} "
                      f"pending={int(mon.stats.get('pending', 0))} restarts={restarts}"
                      f"{'' if bus.is_connected else ' nats=reconnecting'}", flush=True)
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
        mon.stop_measuring(cpu=process_cpu_seconds(system.pids()))
        if bus is not None and bus.is_connected:
            services = await probe_health(bus, list(SERVICES), 3.0)  # busy services (2 cores) answer late
            late = [name for name, status in services.items() if status.startswith("no answer")]
            if late:  # one more chance, longer: an event loop busy for a few seconds is not a dead service
                services.update(await probe_health(bus, late, 6.0))
    except SystemExit as exc:  # the start gate failed: the summary still says what happened
        failed = exc
        ended = f"startup failed: {exc}"
    finally:
        elapsed = time.monotonic() - started
        if bus is not None:
            await bus.close()
        codes = system.stop()
    for name, code in codes.items():
        if services.get(name) == "healthy" and code not in (0, None, -signal.SIGTERM):
            services[name] = f"exited with code {code} on shutdown"
    for name, code in system.exited().items():
        if services.get(name) != "healthy":
            services[name] = services.get(name) if services.get(name) not in ("starting", None) else \
                f"exited with code {code}; see {system.logs.get(name)}"
    summary = build_summary(mon, services, system, elapsed)
    bounded = duration is not None or result is not None  # a run meant to end by itself, not by Ctrl-C
    summary.update(ended=ended, requested_duration_s=duration,
                   short_run=failed is not None or (ended == "stopped by a signal" and bounded),
                   supervision=system.report(),
                   restarts=sum(r["restarts"] for r in system.report().values()))
    if summary_path:
        Path(summary_path).parent.mkdir(parents=True, exist_ok=True)
        Path(summary_path).write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary[k] for k in ("decisions", "pods_bound", "constraint_violations",
                                              "traces_complete", "decision_latency_ms", "ended", "restarts")}))
    load = summary["load"]
    if load.get("keeping_up") is False:
        print(f"agmarl: decisions did not keep up with the arrivals: {load['announced_per_s']:.1f} pods announced/s,"
              f" {load['decided_per_s']:.1f} decided/s on {load['cpus']} cores (1-minute load {load['load_1m'][0]}"
              f" -> {load['load_1m'][1]}); the decision latency above includes that growing queue"
              f" (decision_latency_ms.queue_ms); --rate lowers the arrivals", file=sys.stderr)
    exits = {name: r for name, r in summary["supervision"].items() if r["exits"]}
    if exits:
        print(f"agmarl: exits and restarts: {json.dumps(exits)}", file=sys.stderr)
    if failed is not None:
        raise failed
    unhealthy = {name: status for name, status in services.items() if status != "healthy"}
    if unhealthy:
        print(f"agmarl: not healthy at the end: {unhealthy}; logs in {system.log_dir}", file=sys.stderr)
    return 1 if unhealthy else 0


async def probe_health(bus: Bus, names: list[str], timeout: float) -> dict[str, str]:
    """``check_health`` of several services at once (each waits ``timeout``, not one after the other)."""
    answers = await asyncio.gather(*(check_health(bus, (name,), timeout=timeout) for name in names))
    return {k: v for answer in answers for k, v in answer.items()}


async def wait_healthy(bus: Bus, system: System, services: dict[str, str], stop: asyncio.Event) -> None:
    """The start gate: every service answers "healthy" within STARTUP_TIMEOUT. Probes of the services not
    healthy yet go out together and wait longer on each try (PROBE_TIMEOUTS), never past the deadline:
    a service busy loading on a loaded machine answers late, not never."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    attempt = 0
    while time.monotonic() < deadline and not stop.is_set():
        waiting = [name for name, status in services.items() if status != "healthy"]
        timeout = min(PROBE_TIMEOUTS[min(attempt, len(PROBE_TIMEOUTS) - 1)], max(0.5, deadline - time.monotonic()))
        services.update(await probe_health(bus, waiting, timeout))
        attempt += 1
        if all(v == "healthy" for v in services.values()):
            return
        if system.exited():
            raise SystemExit(f"agmarl: services failed to start: {system.exited()}; logs in {system.log_dir}")
        await asyncio.sleep(0.5)
    if not stop.is_set():
        bad = {k: v for k, v in services.items() if v != "healthy"}
        raise SystemExit(f"agmarl: services not healthy after {STARTUP_TIMEOUT:.0f}s: {bad}; logs in {system.log_dir}")


def build_summary(mon: Monitor, services: dict[str, str], system: System, elapsed: float) -> dict:
    spans = read_spans(str(system.trace_dir)) if system.trace_dir.exists() else []
    complete = traces_complete(mon.trace_ids, spans)
    latency = {**mon.latency_summary(),
               "measured": "pod published (state-collector) -> decision made (inference), pods announced after "
                           "every service was healthy", **latency_split(mon.measured, spans)}
    return {
        "duration_s": round(elapsed, 2),
        "decisions": mon.decisions,
        "unschedulable_decisions": mon.unschedulable,
        "unassisted_placements": mon.unassisted,  # logged, not decided (agmarl_inference.catchup)
        "pods_bound": mon.pods_bound,
        "bind_rejected": mon.bind_rejected,
        "constraint_violations": mon.max_violations,
        "services": services,
        "traces_complete": complete,
        "traces_complete_ratio": round(complete / mon.decisions, 4) if mon.decisions else 0.0,
        "decision_latency_ms": latency,
        "startup": mon.startup_summary(),
        "load": mon.load_summary(),
        "utilisation": {k[len("utilisation_"):]: v for k, v in mon.stats.items() if k.startswith("utilisation_")},
        "balance_std": mon.stats.get("balance", 0.0),
        "trace_dir": str(system.trace_dir),
        "log_dir": str(system.log_dir),
    }
