"""Start, supervise and stop the local system: an embedded NATS server (unless NATS_URL is set) and the
six services as separate processes. Every process is ours, tracked by PID and stopped by PID.

``System.supervise()`` restarts what died: a service with the same environment (credentials, metrics and
extender ports; a metrics port taken meanwhile is replaced by a free one), the embedded nats-server on the same port, store and configuration (the services'
connections reconnect by themselves), each after an exponential backoff (``restart_delay``) that starts
over once the process has stayed up ``STABLE_AFTER_S``. Every exit and restart is counted (``report()``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from agmarl_common.runtime import permissions
from agmarl_common.runtime.natsauth import Credentials, NatsAuth, ensure_credentials, seed_path
from agmarl_common.runtime.natsserver import NatsServer, free_port, port_free

SERVICES = ("state-collector", "graph-builder", "inference", "reward-calculator", "adaptive-engine", "trainer")
NATS = "nats-server"  # the embedded server's name in restart reports
RESTART_BASE_S = 0.5  # the first restart's delay; doubled for each quick exit in a row ...
RESTART_CAP_S = 30.0  # ... up to this
STABLE_AFTER_S = 60.0  # a process up this long has its backoff start over


def restart_delay(failures: int, base: float = RESTART_BASE_S, cap: float = RESTART_CAP_S) -> float:
    """Seconds before restarting a process that exited ``failures`` times in a row (1 = the first)."""
    return min(cap, base * 2.0 ** max(0, failures - 1))


class Event(NamedTuple):
    """What one supervision round did to one process: ``kind`` "exited", "restarted" or "failed" (to start)."""

    name: str
    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.name} {self.text}"


@dataclass
class Supervised:
    """One supervised process: its exit codes, how often it was restarted, when the next start is due."""

    restarts: int = 0
    exits: list[int] = field(default_factory=list)
    failures: int = 0  # exits in a row without STABLE_AFTER_S up in between: the backoff's exponent
    started_at: float = 0.0  # monotonic
    due: float | None = None  # when the next start is due; None while it runs

    def exited(self, code: int | None, now: float) -> float:
        """Record an exit (or, ``code`` None, a failed start) at ``now``; returns the delay before the next start."""
        self.failures = 1 if code is not None and now - self.started_at >= STABLE_AFTER_S else self.failures + 1
        if code is not None:
            self.exits.append(code)
        delay = restart_delay(self.failures)
        self.due = now + delay
        return delay

    def restarted(self, now: float) -> int:
        self.due = None
        self.restarts += 1
        self.started_at = now
        return self.restarts

    def report(self) -> dict:
        return {"restarts": self.restarts, "exits": [f"exited {code}" for code in self.exits],
                "running": self.due is None}


def module_of(service: str) -> str:
    return "agmarl_" + service.replace("-", "_")


def state_dir() -> Path:
    """Project-local state: $AGMARL_STATE_DIR or ./.state."""
    return Path(os.environ.get("AGMARL_STATE_DIR", ".state")).resolve()


def creds_dir() -> Path:
    """Where the NATS identities' seeds live: $AGMARL_NATS_CREDS_DIR or <state>/nats-creds."""
    return Path(os.environ.get("AGMARL_NATS_CREDS_DIR") or state_dir() / "nats-creds").resolve()


@dataclass
class System:
    root: Path
    run_id: str
    nats_url: str = ""
    nats: NatsServer | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    http_port: int = field(default_factory=lambda: free_port())  # the extender's port for this run
    # each service's /metrics port for this run (one environment for all six cannot give each its own)
    metrics_ports: dict[str, int] = field(default_factory=lambda: {s: free_port() for s in SERVICES})
    creds: Credentials | None = None  # the NATS identities (None: an external NATS without them)
    supervised: dict[str, Supervised] = field(default_factory=dict)  # services and NATS, by name
    extra_env: dict[str, str] = field(default_factory=dict)  # what start_services was given, for restarts

    @property
    def trace_dir(self) -> Path:
        return self.root / "traces" / self.run_id

    @property
    def log_dir(self) -> Path:
        return self.root / "logs" / self.run_id

    def start_nats(self) -> str:
        url = os.environ.get("NATS_URL", "")
        if url:  # an external server: its identities, when a credentials directory is given
            self.nats_url = url
            if os.environ.get("AGMARL_NATS_CREDS_DIR"):
                self.creds = ensure_credentials(creds_dir())
            return url
        # authenticated by default: seeds kept across runs, permissions regenerated from the catalogue
        self.creds = ensure_credentials(creds_dir())
        self.nats = NatsServer(store_dir=str(self.root / "nats"), auth_config=self.creds.auth_config,
                               sync_interval="always",  # decisions and experience fsynced before the ack
                               die_with_parent=True)  # `agmarl up` killed outright takes its server with it
        self.nats.start()
        self.supervised[NATS] = Supervised(started_at=time.monotonic())
        self.nats_url = self.nats.url
        return self.nats_url

    def cli_auth(self) -> NatsAuth | None:
        """The read-only CLI identity `agmarl up`'s own monitor connects with."""
        if self.creds is None:
            return None
        return NatsAuth(seed_file=str(self.creds.seed(permissions.READ_ONLY)), identity=permissions.READ_ONLY)

    def service_env(self, service: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "NATS_URL": self.nats_url,
            "AGMARL_NATS_URL": self.nats_url,
            "AGMARL_TRACE_DIR": str(self.trace_dir),
            "AGMARL_STATE_DIR": str(self.root),  # the trainer's work files (experience buffer) live under it
            "OTEL_SERVICE_NAME": service,
            "PYTHONUNBUFFERED": "1",
            "AGMARL_PARENT_PID": str(os.getpid()),
        })
        if self.creds is not None:
            env["AGMARL_NATS_NKEY_SEED_FILE"] = str(self.creds.seed(service))
        if service == "inference" and "AGMARL_HTTP_PORT" not in env:
            env["AGMARL_HTTP_PORT"] = str(self.http_port)
        if service in self.metrics_ports:
            env["AGMARL_METRICS_PORT"] = str(self.metrics_ports[service])
        env.update(extra or {})
        return env

    def start_services(self, extra_env: dict[str, str] | None = None,
                       services: tuple[str, ...] = SERVICES) -> None:
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.extra_env = dict(extra_env or {})
        for service in services:
            self.start_service(service)
        self.write_run_file()

    def start_service(self, service: str) -> subprocess.Popen:
        """Start (or restart) one service; its output is appended to its log."""
        log = self.log_dir / f"{service}.log"
        self.logs[service] = log
        with open(log, "ab") as fh:
            self.procs[service] = subprocess.Popen(
                [sys.executable, "-m", module_of(service)], env=self.service_env(service, self.extra_env),
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.supervised.setdefault(service, Supervised()).started_at = time.monotonic()
        return self.procs[service]

    def supervise(self, now: float | None = None) -> list[Event]:
        """One supervision round (blocking: a NATS start waits for the server, up to its startup timeout):
        record what exited, restart what is due. Returns what it did (``str(event)``: a line for the operator)."""
        now = time.monotonic() if now is None else now
        events = self._supervise_nats(now)
        for name, proc in self.procs.items():
            sup = self.supervised.setdefault(name, Supervised(started_at=now))
            if sup.due is None and proc.poll() is not None:
                delay = sup.exited(proc.returncode, now)
                events.append(Event(name, "exited",
                                    f"exited {proc.returncode}; restart {sup.restarts + 1} in {delay:.1f}s"))
            elif sup.due is not None and now >= sup.due:
                if name in self.metrics_ports and not port_free(self.metrics_ports[name]):
                    # taken meanwhile (its start may have died of it): a new one, in run.json and endpoints()
                    self.metrics_ports[name] = free_port()
                pid = self.start_service(name).pid
                events.append(Event(name, "restarted", f"restarted (restart {sup.restarted(now)}, pid {pid})"))
        if any(event.kind == "restarted" for event in events):
            self.write_run_file()
        return events

    def _supervise_nats(self, now: float) -> list[Event]:
        sup = self.supervised.get(NATS)
        if self.nats is None or sup is None:
            return []  # an external server: not ours to restart
        events: list[Event] = []
        if sup.due is None and not self.nats.running:
            code = self.nats.stop()  # reaps it: the exit code
            delay = sup.exited(code if code is not None else 0, now)
            events.append(Event(NATS, "exited", f"exited {sup.exits[-1]}; restart {sup.restarts + 1} in {delay:.1f}s"))
        if sup.due is not None and now >= sup.due:
            try:
                self.nats.start()  # same port, store directory and configuration (credentials)
            except (RuntimeError, TimeoutError, OSError) as exc:
                events.append(Event(NATS, "failed", f"failed to start ({exc}); next try in "
                                                    f"{sup.exited(None, now):.1f}s"))
                return events
            restart = sup.restarted(time.monotonic())
            events.append(Event(NATS, "restarted",
                                f"restarted (restart {restart}, pid {self.nats.pid}, {self.nats_url})"))
        return events

    def report(self) -> dict[str, dict]:
        """Per supervised process: restarts, exits ("exited -9"), running now."""
        return {name: sup.report() for name, sup in self.supervised.items()}

    def write_run_file(self) -> None:
        info = {"run_id": self.run_id, "nats_url": self.nats_url, "trace_dir": str(self.trace_dir),
                "extender_url": f"http://127.0.0.1:{self.http_port}",
                "metrics_urls": self.metrics_urls(),
                "log_dir": str(self.log_dir), "pids": {k: p.pid for k, p in self.procs.items()},
                "nats_creds_dir": str(self.creds.directory) if self.creds else None,
                "nats_pid": self.nats.pid if self.nats else None}
        (self.root / "run.json").write_text(json.dumps(info, indent=2))

    def metrics_urls(self) -> dict[str, str]:
        return {s: f"http://127.0.0.1:{port}/metrics" for s, port in self.metrics_ports.items()}

    def endpoints(self) -> str:
        """One line for the operator: where the extender and each service's metrics listen."""
        metrics = "  ".join(f"{s}=:{port}" for s, port in self.metrics_ports.items())
        return f"extender http://127.0.0.1:{self.http_port}   metrics (/metrics on 127.0.0.1) {metrics}"

    def pids(self) -> dict[str, int | None]:
        """The processes running now: each service and the embedded nats-server."""
        out: dict[str, int | None] = {k: p.pid for k, p in self.procs.items() if p.poll() is None}
        if self.nats is not None:
            out[NATS] = self.nats.pid
        return out

    def exited(self) -> dict[str, int]:
        """Services whose process has ended, with their exit code."""
        return {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}

    def stop_services(self, timeout: float = 20.0) -> dict[str, int | None]:
        """SIGTERM to every service, SIGKILL to those still running after ``timeout`` (a service's own clean
        shutdown may take ~12 s: stop hooks, 5 s for its tasks, 5 s to drain its subscriptions)."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: dict[str, int | None] = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                codes[name] = p.wait(timeout=5)
        return codes

    def stop(self) -> dict[str, int | None]:
        codes = self.stop_services()
        if self.nats is not None:
            self.nats.stop()
        run_file = self.root / "run.json"
        if run_file.exists():
            run_file.unlink()
        return codes


def find_nats_url() -> str:
    """NATS_URL, else the URL of a running `agmarl up` in this state directory."""
    url = os.environ.get("NATS_URL", "")
    if url:
        return url
    run_file = state_dir() / "run.json"
    if run_file.exists():
        return json.loads(run_file.read_text())["nats_url"]
    raise SystemExit("agmarl: no NATS to talk to: set NATS_URL or start the system with `agmarl up`")


def find_nats_auth(write: bool = False) -> NatsAuth | None:
    """The CLI's NATS identity: ``operator`` for write verbs, ``cli`` (read-only) otherwise, from
    $AGMARL_NATS_CREDS_DIR, a running `agmarl up`'s credentials, or <state>/nats-creds; None when there
    are no credentials (an anonymous server)."""
    identity = permissions.OPERATOR if write else permissions.READ_ONLY
    directory = Path(os.environ["AGMARL_NATS_CREDS_DIR"]) if os.environ.get("AGMARL_NATS_CREDS_DIR") else None
    run_file = state_dir() / "run.json"
    if directory is None and not os.environ.get("NATS_URL") and run_file.exists():
        recorded = json.loads(run_file.read_text()).get("nats_creds_dir")
        directory = Path(recorded) if recorded else None
    directory = directory or creds_dir()
    seed = seed_path(directory, identity)
    if not seed.is_file():
        return None
    return NatsAuth(seed_file=str(seed), identity=identity, tls_ca_file=os.environ.get("AGMARL_NATS_TLS_CA_FILE"),
                    tls_cert_file=os.environ.get("AGMARL_NATS_TLS_CERT_FILE"),
                    tls_key_file=os.environ.get("AGMARL_NATS_TLS_KEY_FILE"))


def latest_trace_dir() -> Path | None:
    root = state_dir() / "traces"
    if not root.exists():
        return None
    runs = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None
