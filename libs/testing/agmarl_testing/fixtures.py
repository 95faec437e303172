"""pytest fixtures and helpers for tests against a real nats-server and real service processes.

Loaded by the root conftest (``pytest_plugins = ["agmarl_testing.fixtures"]``):

- ``nats_server``: one NatsServer (JetStream, temp store) for the whole session
- ``nats_url``: its URL
- ``service_processes``: factory ``start(module, env=..., args=...) -> ServiceProcess``; every process
  it started is stopped (SIGTERM by PID, then SIGKILL) at teardown
- ``model_keys``: a throwaway model signing key pair (``ModelKeys``); ``trusted_model_env``: this process
  and the services it starts sign with it and trust it (docs/security.md)
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from agmarl_common.serving import signing
from agmarl_common.runtime import subjects
from agmarl_common.runtime.messages import HealthStatus
from agmarl_common.serving.modelstore import TRUSTED_KEYS_DIR, ModelTrust
from agmarl_common.runtime.natsserver import NatsServer

REPO_ROOT = Path(__file__).resolve().parents[3]  # libs/testing/agmarl_testing/fixtures.py -> the checkout


class ServiceProcess:
    """A Python module run as ``python -m <module>`` with its output captured to a log file."""

    def __init__(self, module: str, env: Mapping[str, str] | None = None, args: Sequence[str] = (),
                 log_path: str | Path | None = None, cwd: str | Path | None = None):
        self.module = module
        self.args = list(args)
        self.env = {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.log_path = Path(log_path) if log_path else \
            Path(tempfile.mkdtemp(prefix="agmarl-svc-")) / f"{module.replace('.', '_')}.log"
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def start(self) -> "ServiceProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, *self.args], env=self.env,
                                     cwd=self.cwd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        return self

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM by PID, wait up to ``timeout``, then SIGKILL; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def output(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""


def start_service(module: str, env: Mapping[str, str] | None = None, args: Sequence[str] = (),
                  log_path: str | Path | None = None) -> ServiceProcess:
    return ServiceProcess(module, env, args, log_path).start()


async def ask_health(bus, service: str, timeout: float = 2.0) -> HealthStatus | None:
    """One health answer from ``service``, None when none came within ``timeout`` (not up yet, or busy for a moment
    on a loaded machine): for pollers, which ask again rather than fail on one slow answer."""
    try:
        return await bus.request(subjects.health(service), b"", HealthStatus, timeout=timeout)
    except Exception:  # noqa: BLE001 - no responder yet / timeout
        return None


async def health_until(bus, service: str, check: Callable[[HealthStatus], bool], timeout: float = 15.0,
                       proc: ServiceProcess | None = None, what: str = "") -> HealthStatus:
    """Poll ``subjects.health(service)`` until a reply passes ``check`` (bounded by ``timeout``); fails at once,
    with the process's output, if ``proc`` ends first."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.returncode is not None:
            raise RuntimeError(f"{service} exited with {proc.returncode}:\n{proc.output()[-4000:]}")
        try:
            status = await bus.request(subjects.health(service), b"", HealthStatus, timeout=0.5)
            if check(status):
                return status
            last = status
        except Exception as exc:  # no responder yet / timeout
            last = exc
        await asyncio.sleep(0.05)
    tail = proc.output()[-4000:] if proc is not None else ""
    raise TimeoutError(f"{service} not {what or 'there'} within {timeout}s (last: {last!r})\n{tail}")


async def decisions_taken_up(bus, cluster: str, timeout: float = 15.0, proc: ServiceProcess | None = None) -> None:
    """Wait (bounded) until the reward-calculator has taken up every decision on DECISIONS: none is left to deliver
    and each delivered one not acknowledged yet is among those its health says it holds. A snapshot published then
    settles them; one published before could be handled first and leave them for a next snapshot."""
    durable = subjects.durable("reward-calculator", cluster)
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.returncode is not None:
            raise RuntimeError(f"reward-calculator exited with {proc.returncode}:\n{proc.output()[-4000:]}")
        info = await bus.js.consumer_info(subjects.DECISIONS.name, durable)
        status = await ask_health(bus, "reward-calculator")
        last = (info.num_pending, info.num_ack_pending, status.details.get("held") if status else None)
        if info.num_pending == 0 and status is not None and status.details.get("held") == info.num_ack_pending:
            return
        await asyncio.sleep(0.05)
    tail = proc.output()[-4000:] if proc is not None else ""
    raise TimeoutError(f"decisions not taken up within {timeout}s (to deliver, unacked, held: {last})\n{tail}")


async def health_advances(bus, service: str, key: str, by: int, timeout: float = 15.0,
                          proc: ServiceProcess | None = None) -> HealthStatus:
    """Wait until the counter ``key`` of ``service``'s health details has grown by ``by`` from now (bounded): an
    event to wait on where a test checks that something did *not* happen over some of the service's rounds."""
    now = (await health_until(bus, service, lambda s: key in s.details, timeout, proc, f"reporting {key}")).details[key]
    return await health_until(bus, service, lambda s: s.details.get(key, now) >= now + by, timeout, proc,
                              f"past {key} {now} + {by}")


async def wait_healthy(bus, service: str, timeout: float = 15.0, proc: ServiceProcess | None = None) -> HealthStatus:
    """Poll ``subjects.health(service)`` until it answers "healthy" (bounded by ``timeout``)."""
    return await health_until(bus, service, lambda s: s.status == "healthy", timeout, proc, "healthy")


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(store_dir=tmp_path_factory.mktemp("nats-store"))
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    if not nats_server.running:  # a test may have stopped it
        nats_server.start()
    return nats_server.url


@pytest.fixture
def service_processes(tmp_path: Path) -> Iterator:
    """Factory fixture: ``proc = service_processes("services.inference.app", env={...})``."""
    started: list[ServiceProcess] = []

    def start(module: str, env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> ServiceProcess:
        # work files (the trainer's experience buffer, models) in the test's folder, never the repo's .state
        env = {"AGMARL_STATE_DIR": str(tmp_path / "state"), **(env or {})}
        proc = ServiceProcess(module, env, args, tmp_path / f"{module.replace('.', '_')}-{len(started)}.log")
        started.append(proc.start())
        return proc

    try:
        yield start
    finally:
        for proc in reversed(started):
            proc.stop()


class ModelKeys:
    """A throwaway model signing key pair for tests (never the release key): ``sign(dir)`` signs a model
    folder; ``trusted`` (the shipped keys and this one) and ``env`` are the settings that trust it."""

    def __init__(self, out_dir: Path):
        self.key, self.pub = signing.generate_keypair(out_dir, "test-model-signing")

    @property
    def trusted(self) -> str:
        return os.pathsep.join((str(TRUSTED_KEYS_DIR), str(self.pub)))

    @property
    def env(self) -> dict[str, str]:
        return {"AGMARL_MODEL_SIGNING_KEY": str(self.key), "AGMARL_TRUSTED_MODEL_KEYS": self.trusted}

    def trust(self, allowed_dirs: str | Sequence[str | Path] = "", own_dirs: Sequence[str | Path] = ()) -> ModelTrust:
        return ModelTrust.load(self.trusted, allowed_dirs, own_dirs)

    def sign(self, model_dir: str | Path) -> Path:
        return signing.sign_dir(model_dir, signing.load_private_key(self.key))


@pytest.fixture(scope="session")
def model_keys(tmp_path_factory: pytest.TempPathFactory) -> ModelKeys:
    return ModelKeys(tmp_path_factory.mktemp("model-keys"))


@pytest.fixture
def trusted_model_env(model_keys: ModelKeys, monkeypatch: pytest.MonkeyPatch) -> ModelKeys:
    """This process (the policy registry's ``model:`` names) and the service processes it starts sign with
    and trust ``model_keys``; ``AGMARL_ALLOWED_MODEL_DIRS`` is the test's to set."""
    for name, value in model_keys.env.items():
        monkeypatch.setenv(name, value)
    return model_keys


@pytest.fixture(scope="session")
def smoke_model(tmp_path_factory: pytest.TempPathFactory, model_keys: ModelKeys) -> Path:
    """A small trained model (the smoke config, trained once per session with the trainer's CLI), signed with
    the session's throwaway key."""
    out = tmp_path_factory.getbasetemp() / "agmarl-smoke-model"
    if not (out / "manifest.json").is_file():
        run = subprocess.run([sys.executable, "-m", "agmarl_trainer.cli", "--config", "configs/train/smoke.yaml",
                              "--out", str(out), "--runs-dir", str(out.parent / "agmarl-smoke-runs")],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
    model_keys.sign(out)
    return out
