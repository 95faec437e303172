"""Decision-log catch-up: the pods kube-scheduler bound while no inference process answered its extender calls.

The extender is ``ignorable`` (docs/deploy.md): while inference restarts, kube-scheduler places the pods of its
profile alone, and no decision entry names them. Once this process listens, it reads back the last
``unlogged_lookback_seconds`` of the EVENTS stream (the state-collector's ``pod_bound`` events: every binding its
watch saw) and of the DECISIONS stream (every entry of this cluster), and logs each pod of an extender scheduler
(``extender_scheduler_names``) bound that no entry names and this process was not asked about: a Decision with source
``unassisted``, ``node`` and ``bound_node`` where it went, no policy, no scores, and the reason in its
explanation. A pod whose entry the previous process held for its binding when it ended is logged the same way
(its entry was lost with it). The entry's id comes from the event (``unassisted-<epoch>-<seq>``), so two
processes starting together log a pod once (JetStream's duplicate window) and a later start finds the entry.

Pods are matched by key (namespace/name): a pod deleted and created again under the same name within the window,
logged once, is not logged again. Bindings older than the window stay unlogged (docs/deploy.md "Pods placed while
inference was down").
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects

REASON = ("bound by kube-scheduler without a decision of the services: no inference process answered its extender "
          "calls (the extender is ignorable), or the one that did ended before logging it")


def unlogged(events: Iterable[m.ClusterEvent], logged: set[str], schedulers: Sequence[str],
             known: Mapping[str, str] | None = None) -> list[m.ClusterEvent]:
    """The last ``pod_bound`` event of each pod of ``schedulers`` whose key is not in ``logged`` (the log's entries
    and the pods this process was asked about), in event order (pure). A pod's scheduler is the one its event
    carries, else ``known[key]`` (the cluster view's: an event whose pod the state-collector's cache did not hold
    yet carries none). Not the event's time: under load the state-collector stamps a binding seconds late."""
    known = known or {}
    last: dict[str, m.ClusterEvent] = {}
    for ev in events:
        scheduler = str(ev.pod.get("scheduler_name", "")) if ev.pod else known.get(ev.pod_key, "")
        if ev.type == "pod_bound" and ev.node and ev.pod_key not in logged \
                and scheduler in schedulers:
            last.pop(ev.pod_key, None)
            last[ev.pod_key] = ev
    return list(last.values())


def event_of(data: bytes) -> m.ClusterEvent | None:
    try:
        return m.decode(m.ClusterEvent, data)
    except m.DecodeError:
        return None


def pod_key_of(data: bytes, cluster: str) -> str | None:
    """The pod key a decision entry of ``cluster`` names, read without building the whole entry (the lookback's log
    can be tens of thousands of entries with their scores); None for anything else."""
    found, key = m.peek_all(data, ("cluster", "pod_key"))
    return key if found == cluster else None


def unassisted_decision(ev: m.ClusterEvent, mode: str) -> m.Decision:
    namespace = str(ev.pod.get("namespace", "")) or ev.pod_key.partition("/")[0] or "default"
    return m.Decision(
        decision_id=f"{m.UNASSISTED}-{ev.epoch}-{ev.seq}", cluster=ev.cluster, namespace=namespace, pod_key=ev.pod_key,
        node=ev.node, gpus=list(ev.gpus), bound_node=ev.node, policy="", mode=mode,
        explanation={"reason": REASON, "binding": "watch", "bound_at": ev.time}, seen_at=ev.time,
        decided_at=ev.time, source=m.UNASSISTED)


@dataclass(frozen=True)
class CatchUp:
    logged: int = 0  # entries published (pods bound alone)
    events: int = 0  # events read back
    entries: int = 0  # decision-log entries read back
    seconds: float = 0.0


async def catch_up(bus: Any, publish: Any, cluster: str, schedulers: Sequence[str], lookback_s: float,
                   listening_at: float, mode: str, timeout: float = 2.0,
                   known: Callable[[], Mapping[str, str]] = dict, seen: Callable[[], set[str]] = set) -> CatchUp:
    """Log the pods bound without a decision (module docstring) through ``publish(decision)``; ``known()``: pod
    key -> scheduler name of the pods the cluster view holds (for events that do not carry the pod); ``seen()``:
    the pods this process's extender was asked about (its entries may not be published yet), taken before the
    log is read."""
    if lookback_s <= 0 or not schedulers:
        return CatchUp()
    started = time.monotonic()
    since = datetime.datetime.fromtimestamp(listening_at - lookback_s, datetime.timezone.utc)
    await bus.ensure_stream(subjects.EVENTS)
    events = [e for e in await bus.read_back(subjects.event(cluster), since, event_of, timeout)
              if e.cluster == cluster]
    schedulers_of, asked = known(), set(seen())
    if not unlogged(events, asked, schedulers, schedulers_of):  # none of ours: the log need not be read
        return CatchUp(events=len(events), seconds=time.monotonic() - started)
    keys = await bus.read_back(subjects.decision_wildcard(cluster), since, lambda d: pod_key_of(d, cluster), timeout)
    found = unlogged(events, asked | set(keys), schedulers, schedulers_of)
    for ev in found:
        await publish(unassisted_decision(ev, mode))
    return CatchUp(len(found), len(events), len(keys), time.monotonic() - started)
