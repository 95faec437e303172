"""Small CLI commands that talk to a running system over NATS or read its local traces."""

from __future__ import annotations

import asyncio
import time
import uuid

from agmarl_cli.supervisor import find_nats_auth, find_nats_url, latest_trace_dir
from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.telemetry import read_spans, span_tree


def format_decision(d: m.Decision) -> str:
    node = d.node or "(unschedulable)"
    policy = d.policy or f"({d.source})"  # unassisted: kube-scheduler placed it alone, no policy decided
    return (f"{time.strftime('%H:%M:%S', time.localtime(d.decided_at))}  {d.pod_key:40s} -> {node:18s} "
            f"policy={policy} score={d.score:.1f} mode={d.mode} trace={d.trace_id}")


async def decisions_tail(namespace: str | None, cluster: str, last: int, follow_seconds: float | None) -> int:
    """Print the decision log (JetStream DECISIONS stream): the last N, then follow new ones.

    ``follow_seconds`` None follows until Ctrl-C; 0 prints the backlog and exits.
    """
    from nats.js.api import ConsumerConfig, DeliverPolicy  # noqa: PLC0415

    bus = await Bus.connect(find_nats_url(), name="agmarl-tail", auth=find_nats_auth())
    subject = subjects.decision(cluster, namespace) if namespace else subjects.decision_wildcard(cluster)
    try:
        await bus.ensure_streams()
        info = await bus.js.stream_info(subjects.DECISIONS.name)
        start = max(1, info.state.last_seq - last + 1)
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
        sub = await bus.js.subscribe(subject, ordered_consumer=True, config=config)
        deadline = None if follow_seconds is None else time.monotonic() + follow_seconds
        backlog = info.state.last_seq >= start
        while True:
            wait = 0.5 if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                msg = await sub.next_msg(timeout=max(wait, 0.05))
            except asyncio.TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                continue
            try:
                print(format_decision(m.decode(m.Decision, msg.data)), flush=True)
            except m.DecodeError as exc:
                print(f"(undecodable decision: {exc.reason})", flush=True)
            if backlog and msg.metadata.sequence.stream >= info.state.last_seq and follow_seconds == 0:
                break
        await sub.unsubscribe()
        return 0
    finally:
        await bus.close()


async def retrain(reason: str, timeout: float, config: str = "") -> int:
    """Publish a train request (``config``: a file of configs/train/ for the fine-tune, "" = the trainer's
    default) and print the trainer's first answer."""
    bus = await Bus.connect(find_nats_url(), name="agmarl-retrain", auth=find_nats_auth(write=True))
    try:
        evidence = {"source": "cli", **({"train_config": config} if config else {})}
        req = m.TrainRequest(request_id=uuid.uuid4().hex, reason=reason, evidence=evidence,
                             requested_at=time.time())
        status = await bus.request(subjects.train_request(), req, m.TrainStatus, timeout=timeout)
        print(f"trainer: {status.status}: {status.detail}" + (f" (model {status.model_version})"
                                                               if status.model_version else ""))
        return 0 if status.status in ("accepted", "running", "done") else 1
    except asyncio.TimeoutError:
        print(f"agmarl: the trainer did not answer within {timeout:.0f}s")
        return 2
    finally:
        await bus.close()




def trace(query: str, trace_dir: str | None) -> int:
    """Print the span tree of a decision, by trace id or by pod (namespace/name or name)."""
    directory = trace_dir or (str(latest_trace_dir()) if latest_trace_dir() else None)
    if not directory:
        print("agmarl: no local traces found (run `agmarl up` first, or pass --dir)")
        return 2
    spans = read_spans(directory)
    trace_ids = [query] if any(s["trace_id"] == query for s in spans) else []
    if not trace_ids:
        for s in spans:
            pod = str(s.get("attributes", {}).get("agmarl.pod", ""))
            if pod and (pod == query or pod.split("/")[-1] == query) and s["trace_id"] not in trace_ids:
                trace_ids.append(s["trace_id"])
    if not trace_ids:
        print(f"agmarl: no trace for {query!r} in {directory}")
        return 2
    for t in trace_ids:
        print(span_tree(spans, t))
    return 0
