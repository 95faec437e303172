"""Liveness and readiness of one service process, as plain data.

The runtime's heartbeat (a task on the service's event loop) records a ``Beat`` twice a second: whether
the service has started, whether its NATS connection is up and since when it is down, and the oldest
handler still running. ``judge`` turns the last beat into the answers of ``/healthz`` (liveness: restart
me when false) and ``/readyz`` (readiness: send me work when true), served from the metrics server's
thread, so a blocked event loop shows as a beat that stopped.

- live: the event loop beats (last beat younger than ``handler_stuck_s``), NATS is connected or has been
  reconnecting for at most ``nats_grace_s``, and no handler has run longer than ``handler_stuck_s``.
- ready: live, started (handlers subscribed), NATS connected now, and the service's own checks pass.

No clock inside: the caller passes ``now`` (monotonic seconds).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HealthLimits:
    nats_grace_s: float = 30.0  # NATS down (reconnecting) longer than this: not live
    handler_stuck_s: float = 60.0  # a handler running, or the event loop silent, longer than this: not live


@dataclass(frozen=True)
class Beat:
    at: float  # when the event loop recorded it (monotonic)
    started: bool  # handlers subscribed
    connected: bool  # NATS connection up now
    disconnected_since: float | None = None  # when the connection was last seen going down (None: up)
    oldest_handler: tuple[str, float] | None = None  # (subject, start time) of the longest-running handler
    unhealthy: str | None = None  # the first reason a service's own health check gave (add_health_check)


@dataclass(frozen=True)
class Verdict:
    live: bool
    ready: bool
    problems: tuple[str, ...] = ()  # why not live or not ready ("" when both)
    details: dict[str, float | bool | str] = field(default_factory=dict)

    def body(self, probe: str) -> dict:
        ok = self.live if probe == "live" else self.ready
        return {"status": "ok" if ok else ("not live" if probe == "live" else "not ready"),
                "live": self.live, "ready": self.ready, "problems": list(self.problems), **self.details}


def judge(beat: Beat | None, now: float, limits: HealthLimits) -> Verdict:
    """The verdict on the last beat at ``now``. No beat yet: live (starting; the startup probe's time), not ready."""
    if beat is None:
        return Verdict(live=True, ready=False, problems=("starting",))
    fatal: list[str] = []  # not live (and so not ready)
    unready: list[str] = []  # not ready only
    silent = now - beat.at
    if silent > limits.handler_stuck_s:
        fatal.append(f"event loop silent for {silent:.1f}s")
    if not beat.connected:
        down = now - beat.disconnected_since if beat.disconnected_since is not None else 0.0
        (fatal if down > limits.nats_grace_s else unready).append(f"nats disconnected for {down:.1f}s")
    if beat.oldest_handler is not None:
        subject, since = beat.oldest_handler
        running = now - since
        if running > limits.handler_stuck_s:
            fatal.append(f"handler on {subject} running for {running:.1f}s")
    if not beat.started:
        unready.append("starting")
    if beat.unhealthy:
        unready.append(beat.unhealthy)
    details = {"beat_age_s": round(silent, 3), "nats_connected": beat.connected}
    return Verdict(live=not fatal, ready=not fatal and not unready, problems=tuple(fatal + unready),
                   details=details)
