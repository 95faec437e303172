"""Per-message timeline of the live path (``benchmarks/live_latency.py --timeline``), benchmark only.

``run_probed(module, out_dir)`` starts a service module (``python -m <module>``) with a probe installed in
its process that records, on the wall clock this machine's processes share:

- ``recv``: each message nats-py's reader hands to the client (time, subject, trace id of its
  ``traceparent`` header), i.e. when the event loop read it off the socket;
- ``write``: each batch nats-py's flusher writes to the socket, with the subject and trace id of every
  publish in it;
- ``jspub``: each JetStream publish, from the call to its PubAck;
- ``slow``: every event-loop callback that ran over 2 ms (start, duration, the task's coroutine chain);
- ``gc``: every garbage collection over 1 ms (start, duration, generation).

It writes them as JSON to ``<out_dir>/<module>-<pid>.json`` when the process exits. ``analyse`` joins them
with the services' spans (``AGMARL_TRACE_DIR``) and the benchmark's arrival times by trace id (a pending
pod's announcement starts its trace, inference's decision carries it) and says, for the slowest 1 % of
decisions, where the time went: in the collector before its socket write, between that write and
inference's read (nats-server, the kernel, inference's loop busy elsewhere), in inference's subscription
queue, in the handler, before the decision's socket write, and from there to the benchmark.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import json
import os
import runpy
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

SLOW_CALLBACK_S = 0.002
SLOW_GC_S = 0.001
TRACEPARENT = b"traceparent: 00-"


def _trace(raw: bytes | None) -> str:
    if not raw:
        return ""
    i = raw.find(TRACEPARENT)
    return raw[i + len(TRACEPARENT):i + len(TRACEPARENT) + 32].decode() if i >= 0 else ""


def _chain(callback) -> str:
    """What a slow callback ran: the task's coroutines, outermost first, as they are suspended now."""
    task = getattr(callback, "__self__", None)
    coro = task.get_coro() if isinstance(task, asyncio.Task) else None
    if coro is None:
        return getattr(callback, "__qualname__", repr(callback))
    names = []
    while coro is not None and len(names) < 12:
        names.append(getattr(coro, "__qualname__", type(coro).__name__))
        frame = getattr(coro, "cr_frame", None)
        sub = frame.f_locals.get("self") if frame is not None else None
        if names[-1].endswith("_wait_for_msgs") and sub is not None:
            names[-1] += f"[{getattr(sub, '_subject', '')}]"
        coro = getattr(coro, "cr_await", None)
    return " > ".join(names)


def _kind(callback) -> str:
    """A callback's owner, for the CPU table: its task's outermost coroutine (and subscription subject)."""
    task = getattr(callback, "__self__", None)
    coro = task.get_coro() if isinstance(task, asyncio.Task) else None
    if coro is None:
        return getattr(callback, "__qualname__", type(callback).__name__)
    name = getattr(coro, "__qualname__", type(coro).__name__)
    if name.endswith("_wait_for_msgs"):
        frame = getattr(coro, "cr_frame", None)
        sub = frame.f_locals.get("self") if frame is not None else None
        subject = getattr(sub, "_subject", "")
        name += f"[{'_INBOX' if subject.startswith('_INBOX') else subject}]"
    return name


def install(out_dir: str) -> None:
    """Patch nats-py, asyncio's callbacks and the GC of this process to record the timeline (module doc)."""
    from nats.aio import client as nats_client
    from nats.aio import transport as nats_transport
    from nats.js.client import JetStreamContext

    now = time.time
    rec: dict[str, list] = {"recv": [], "write": [], "jspub": [], "slow": [], "gc": []}
    cpu: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # kind -> [callbacks, CPU s, wall s]

    process_msg = nats_client.Client._process_msg
    schedstat = open("/proc/thread-self/schedstat", "rb", buffering=0) if os.path.exists("/proc/thread-self") \
        else None

    def run_delay() -> float:
        """Seconds the event-loop thread has waited for a core so far (Linux schedstat)."""
        if schedstat is None:
            return float("nan")
        schedstat.seek(0)
        return int(schedstat.read().split()[1]) / 1e9

    async def _process_msg(self, sid, subject, reply, data, headers):
        rec["recv"].append((now(), subject.decode(errors="replace"), _trace(headers), run_delay()))
        return await process_msg(self, sid, subject, reply, data, headers)

    nats_client.Client._process_msg = _process_msg

    writelines = nats_transport.TcpTransport.writelines

    def _writelines(self, payload):
        pubs = []
        for cmd in payload:
            if cmd[:4] == b"HPUB" or cmd[:3] == b"PUB":
                line_end = cmd.find(b"\r\n")
                pubs.append((cmd[:line_end].split(b" ", 2)[1].decode(errors="replace"), _trace(cmd[:600])))
        rec["write"].append((now(), pubs))
        return writelines(self, payload)

    nats_transport.TcpTransport.writelines = _writelines

    js_publish = JetStreamContext.publish

    async def _js_publish(self, subject, payload=b"", *args, **kwargs):
        start = now()
        headers = kwargs.get("headers") or {}
        try:
            return await js_publish(self, subject, payload, *args, **kwargs)
        finally:
            rec["jspub"].append((start, now(), subject, headers.get("traceparent", "")[3:35]))

    JetStreamContext.publish = _js_publish

    handle_run = asyncio.events.Handle._run
    clock = time.perf_counter

    thread_time = time.thread_time

    def _run(self):
        began, began_cpu = clock(), thread_time()
        handle_run(self)
        took, used = clock() - began, thread_time() - began_cpu
        entry = cpu[_kind(self._callback)]
        entry[0] += 1
        entry[1] += used
        entry[2] += took
        if took > SLOW_CALLBACK_S:
            rec["slow"].append((now() - took, took, _chain(self._callback)))

    asyncio.events.Handle._run = _run

    gc_began = [0.0]
    gc_all = rec.setdefault("gc_all", [0, 0, 0, 0.0, 0.0, 0.0])  # collections of gen 0, 1, 2; their seconds

    def _gc(phase, info):
        if phase == "start":
            gc_began[0] = clock()
            return
        took = clock() - gc_began[0]
        gen = info.get("generation", 0)
        gc_all[gen] += 1
        gc_all[3 + gen] += took
        if took > SLOW_GC_S:
            rec["gc"].append((now() - took, took, gen))

    gc.callbacks.append(_gc)

    def dump():
        path = Path(out_dir) / f"{os.path.basename(sys.argv[0]) or 'service'}-{os.getpid()}.json"
        rec["cpu"] = dict(cpu)
        rec["cpu_total"] = time.process_time()
        path.write_text(json.dumps(rec))

    atexit.register(dump)


def run_probed(module: str, out_dir: str) -> None:
    """``python -m module`` with the probe installed (what ``live_latency.py --timeline`` starts)."""
    sys.argv[0] = module
    install(out_dir)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def probed_command(module: str, out_dir: str) -> list[str]:
    here = str(Path(__file__).resolve().parent)
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {here!r}); import live_timeline; "
            f"live_timeline.run_probed({module!r}, {out_dir!r})"]


# --- analysis ------------------------------------------------------------------------------------------------

def _load(out_dir: Path) -> dict[str, dict]:
    recs = {}
    for f in sorted(out_dir.glob("*.json")):
        recs[f.name.split("-")[0].removeprefix("agmarl_")] = json.loads(f.read_text())
    return recs


def _spans(trace_dir: Path) -> dict[tuple[str, str], list[dict]]:
    """(service, span name) -> spans (start_ns, end_ns, trace id)."""
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for f in trace_dir.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            s = json.loads(line)
            out[(s["service"], s["name"])].append(s)
    return out


def _overlapping(events: list, start: float, end: float) -> list:
    return [e for e in events if e[0] < end and e[0] + e[1] > start]


def analyse(out_dir: Path, trace_dir: Path, arrivals: list[tuple[float, str, float]], worst: float = 0.01,
            show: int = 12) -> dict:
    """``arrivals``: (arrival at the benchmark, the decision's trace id, its seen_at) of the measured decisions."""
    recs = _load(out_dir)
    spans = _spans(trace_dir)
    col, inf = recs.get("state_collector", {}), recs.get("inference", {})
    col_write = {t: at for at, pubs in col.get("write", []) for subj, t in pubs if ".pending." in subj or
                 subj.endswith(".pending") or "pending" in subj}
    inf_recv = {t: at for at, subj, t, _ in inf.get("recv", []) if "pending" in subj and t}
    inf_delay = {t: d for _, subj, t, d in inf.get("recv", []) if "pending" in subj and t}
    recv_times = np.array([r[0] for r in inf.get("recv", [])] or [0.0])
    recv_delays = np.array([r[3] for r in inf.get("recv", [])] or [0.0])

    def waited(trace: str, since: float) -> float:
        """Run-queue wait of inference's loop thread from its last read before ``since`` to this pod's read."""
        k = int(np.searchsorted(recv_times, since, side="right")) - 1
        return inf_delay.get(trace, np.nan) - recv_delays[k] if k >= 0 else np.nan

    inf_write = {t: at for at, pubs in inf.get("write", []) for subj, t in pubs if "decision" in subj}
    inf_ack = {t: end for _, end, _, t in inf.get("jspub", [])}
    handler = {s["trace_id"]: (s["start_ns"] / 1e9, s["end_ns"] / 1e9)
               for s in spans.get(("inference", "inference pending_pod"), [])}
    rows = []
    for at, trace, seen in arrivals:
        h = handler.get(trace, (np.nan, np.nan))
        marks = [seen, col_write.get(trace, np.nan), inf_recv.get(trace, np.nan), h[0], h[1],
                 inf_write.get(trace, np.nan), inf_ack.get(trace, np.nan), at,
                 waited(trace, col_write.get(trace, np.nan))]
        rows.append((trace, marks))
    names = ["collector: stamped -> socket write", "socket write -> inference read (server, kernel, inference loop)",
             "inference read -> handler start (subscription queue, decode)", "handler",
             "handler end -> decision socket write", "decision write -> benchmark arrival",
             "(decision write -> PubAck at inference)",
             "(inference's loop thread waiting for a core, its read before the write -> this read)"]

    def segments(m):
        return [m[1] - m[0], m[2] - m[1], m[3] - m[2], m[4] - m[3], m[5] - m[4], m[7] - m[5], m[6] - m[5], m[8]]

    seg = np.array([segments(m) for _, m in rows]) * 1000
    total = np.array([(m[7] - m[0]) * 1000 for _, m in rows])
    order = np.argsort(total)[::-1]
    n_worst = max(1, int(len(rows) * worst))
    out = {"decisions": len(rows), "matched": int(np.isfinite(seg).all(axis=1).sum()),
           "median_ms": dict(zip(names, np.nanmedian(seg, axis=0).round(3).tolist())),
           "worst_mean_ms": dict(zip(names, np.nanmean(seg[order[:n_worst]], axis=0).round(3).tolist())),
           "worst": []}
    for i in order[:show]:
        trace, m = rows[i]
        item = {"total_ms": round(float(total[i]), 2), "seen_at": m[0],
                "segments_ms": dict(zip(names, np.round(seg[i], 2).tolist())), "busy": {}}
        for svc, r in recs.items():
            busy = [(round(1000 * (s - m[0]), 1), round(1000 * d, 1), name)
                    for s, d, name in _overlapping(r.get("slow", []), m[0], m[7])]
            busy += [(round(1000 * (s - m[0]), 1), round(1000 * d, 1), f"gc gen {g}")
                     for s, d, g in _overlapping(r.get("gc", []), m[0], m[7])]
            if busy:
                item["busy"][svc] = sorted(busy)
        out["worst"].append(item)
    slow_total = {svc: {"callbacks_over_2ms": len(r.get("slow", [])),
                        "their_ms": round(1000 * sum(d for _, d, _ in r.get("slow", [])), 1),
                        "gc_over_1ms": len(r.get("gc", [])),
                        "gc_by_generation": [r.get("gc_all", [0] * 6)[:3],
                                             [round(1000 * x, 1) for x in r.get("gc_all", [0.0] * 6)[3:]]],
                        "gc_ms": round(1000 * sum(d for _, d, _ in r.get("gc", [])), 1)} for svc, r in recs.items()}
    out["per_process"] = slow_total
    out["loop_cpu_ms_per_decision"] = {
        svc: {k: [round(v[0] / len(rows), 2), round(1000 * v[1] / len(rows), 3), round(1000 * v[2] / len(rows), 3)]
              for k, v in sorted(r.get("cpu", {}).items(), key=lambda kv: -kv[1][1])[:8]}
        for svc, r in recs.items()}
    t0, t1 = min((m[0] for _, m in rows), default=0.0), max((m[7] for _, m in rows), default=0.0)
    out["longest_callbacks"] = {svc: [(round(s - t0, 2), round(1000 * d, 1), name[:100])
                                      for s, d, name in sorted(_overlapping(r.get("slow", []), t0, t1),
                                                               key=lambda x: -x[1])[:5]]
                                for svc, r in recs.items()}
    out["gc_while_measured"] = {svc: {"gen2": [(round(s - t0, 2), round(1000 * d, 1))
                                               for s, d, g in _overlapping(r.get("gc", []), t0, t1) if g == 2],
                                      "over_1ms_ms": round(1000 * sum(d for _, d, _ in
                                                                      _overlapping(r.get("gc", []), t0, t1)), 1)}
                                for svc, r in recs.items()}
    writes = sorted(at for at in col_write.values() if t0 <= at <= t1)
    gaps = np.diff(writes) * 1000 if len(writes) > 1 else np.zeros(0)
    out["announcements"] = {"gap_p50_ms": round(float(np.median(gaps)), 2) if gaps.size else None,
                            "largest_gaps_ms": sorted(np.round(gaps, 1).tolist())[-5:],
                            "within_1ms_of_the_previous": int((gaps < 1.0).sum())}
    kinds: dict[str, list[float]] = defaultdict(list)
    for svc, r in recs.items():
        for _, d, name in r.get("slow", []):
            kinds[f"{svc}: {name}"].append(1000 * d)
    out["slow_callbacks"] = sorted(({"what": k, "n": len(v), "p50_ms": round(float(np.median(v)), 2),
                                     "max_ms": round(max(v), 1)} for k, v in kinds.items()),
                                   key=lambda x: -x["n"] * x["p50_ms"])[:15]
    return out


def print_report(rep: dict) -> None:
    print(f"timeline: {rep['matched']} of {rep['decisions']} decisions matched in every record")
    print("segment                                                         median    slowest 1 % (mean)")
    for k, v in rep["median_ms"].items():
        print(f"  {k:62s} {v:7.2f} ms {rep['worst_mean_ms'][k]:8.2f} ms")
    print("per process (whole run):", json.dumps(rep["per_process"]))
    print("event-loop callbacks per decision (whole run / measured decisions): [callbacks, CPU ms, wall ms]")
    for svc, kinds in rep["loop_cpu_ms_per_decision"].items():
        print(f"  {svc}: " + "; ".join(f"{k[:60]} {v}" for k, v in kinds.items()))
    print("longest event-loop callbacks (s from the first measured pod, ms, what):")
    for svc, items in rep["longest_callbacks"].items():
        print(f"  {svc}: " + "; ".join(f"{s}+{d} {name[:70]}" for s, d, name in items))
    print("collector's pod announcements (socket writes): " + json.dumps(rep["announcements"]))
    print("garbage collections while measured (full ones: s, ms; all over 1 ms: total ms): "
          + json.dumps(rep["gc_while_measured"]))
    print("slow callbacks (> 2 ms) by what ran:")
    for s in rep["slow_callbacks"]:
        print(f"  {s['n']:5d} x p50 {s['p50_ms']:6.2f} ms max {s['max_ms']:6.1f} ms  {s['what'][:150]}")
    print("slowest decisions (ms from seen_at; busy: start, duration, what):")
    for w in rep["worst"]:
        segs = ", ".join(f"{v:.1f}" for v in w["segments_ms"].values())
        print(f"  {w['total_ms']:7.2f} ms  segments [{segs}]")
        for svc, busy in w["busy"].items():
            print(f"      {svc}: " + "; ".join(f"{s}+{d} {name[:90]}" for s, d, name in busy[:6]))
