"""The project as the Dockerfile installs it: a wheel built from what its targets COPY, installed without ``-e``
into a fresh virtualenv, run outside the source tree.

Every service ``agmarl up`` starts is started from that install (``python -m agmarl_<service>``) against a
real nats-server and must answer its health probe, serve ``/metrics`` and ``/healthz`` (the images'
HEALTHCHECK), and exit 0 on SIGTERM; the model folders under ``models/`` must be in the install, byte for byte, and inference must
serve ``models/default`` from it.

The fresh virtualenv has no site packages of its own but the wheel: the third-party dependencies (pinned,
already installed in the project's virtualenv) are reached through a ``.pth`` line naming that
virtualenv's site-packages, which adds the path without running its ``.pth`` files, so the editable
install of this project there stays out of sight.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from agmarl_cli.supervisor import SERVICES, System, module_of
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.messages import HealthStatus
from agmarl_testing.fixtures import ask_health

from . import dockerfile

ROOT = Path(__file__).resolve().parents[2]
INSTALL = re.compile(r"pip install --no-deps \.")
STARTUP_TIMEOUT = 60.0  # six interpreters (torch in the trainer) importing at once on 2 cores


def dockerfile_sources(service: str) -> set[str]:
    """What the Dockerfile's ``service`` target COPYs into the build before ``pip install --no-deps .``, through its
    parent stages and the stages it copies from."""
    sources: set[str] = set()
    for word, args in dockerfile.steps(service):
        if word == "RUN" and INSTALL.search(args):
            return sources
        if word == "COPY":
            sources.update(a.rstrip("/") for a in dockerfile.copied(args))
    raise AssertionError(f"{service}: no `RUN pip install --no-deps .` in its Dockerfile target")


@dataclass(frozen=True)
class Install:
    python: Path  # the fresh virtualenv's interpreter
    site: Path  # its site-packages, where the wheel went
    workdir: Path  # an empty working directory outside the source tree


def run(cmd: list[str | Path], cwd: Path, timeout: float = 120.0) -> str:
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    tmp = tmp_path_factory.mktemp("wheel")
    # the build context every service image shares (the trainer's adds configs/)
    common = set.intersection(*(dockerfile_sources(s) for s in SERVICES))
    src = tmp / "src"
    for name in sorted(common):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    # the setuptools of the project's virtualenv (offline: no isolated build environment to download)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist", src], tmp)
    (wheel,) = (tmp / "dist").glob("agmarl_dks-*.whl")

    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
         "--ignore-installed", wheel], tmp)
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).strip())
    deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (site / "zz-project-dependencies.pth").write_text("".join(f"{d}\n" for d in deps))
    # The simulator's synthetic workloads read a utilisation series from the shared data folder, which no
    # wheel or image holds ("never copied into the repo"): the sim code looks for it at
    # <repo>/../shared/data/traces, i.e. <prefix>/shared/data/traces from an install, so it is linked there.
    (venv / "shared").symlink_to(ROOT.parent / "shared", target_is_directory=True)
    workdir = tmp / "work"
    workdir.mkdir()
    return Install(python, site, workdir)


def test_wheel_holds_every_package_and_the_model_folders(install: Install):
    probe = ("import importlib, json, sys; from agmarl_common.serving import modelstore; "
             "mods = sys.argv[1:]; "
             "print(json.dumps({'files': {m: importlib.import_module(m).__file__ for m in mods}, "
             "'models': str(modelstore.MODELS_DIR)}))")
    packages = sorted(p.parent.relative_to(ROOT / root).as_posix().replace("/", ".")
                      for root in ("libs/common", "cli", *(f"services/{s}" for s in SERVICES))
                      for p in (ROOT / root).glob("agmarl_*/**/__init__.py"))
    assert {"agmarl_common.core.adaptive", "agmarl_adaptive_engine", "agmarl_trainer"} <= set(packages)
    found = json.loads(run([install.python, "-c", probe, *packages], install.workdir))
    for module, path in found["files"].items():
        assert Path(path).is_relative_to(install.site), f"{module} imported from {path}, not the wheel"
    models = Path(found["models"])
    assert models.is_relative_to(install.site)
    shipped = [d for d in sorted((ROOT / "models").iterdir()) if d.is_dir()]
    assert "default" in {d.name for d in shipped}
    for folder in shipped:
        for f in sorted(p for p in folder.iterdir() if p.is_file()):
            assert (models / folder.name / f.name).read_bytes() == f.read_bytes(), f"{f} not shipped as is"
    assert "usage" in run([install.python.parent / "agmarl", "--help"], install.workdir).lower()
    # the test rigs (libs/testing) stay out of the product: no rig package, no module that imports pytest
    assert not (install.site / "agmarl_testing").exists()
    shipped_code = sorted(install.site.glob("agmarl_*/**/*.py"))
    assert shipped_code and not [f for f in shipped_code if re.search(r"^\s*(import|from) pytest\b",
                                                                       f.read_text(encoding="utf-8"), re.M)]


async def wait_healthy(bus: Bus, service: str, proc: subprocess.Popen, log: Path) -> HealthStatus:
    """Its health reply once it says "healthy"; fails at once, with its log, if the process ends first."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{service} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        last = await ask_health(bus, service, timeout=1.0)
        if last is not None and last.status == "healthy":
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"{service} not healthy within {STARTUP_TIMEOUT:.0f}s (last: {last})\n{log.read_text()[-4000:]}")


async def wait_until(bus: Bus, service: str, check, timeout: float = 20.0) -> HealthStatus | None:
    """The first health reply of ``service`` that passes ``check``, or None after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await ask_health(bus, service, timeout=1.0)
        if status is not None and check(status):
            return status
        await asyncio.sleep(0.2)
    return None


def stop(procs: dict[str, subprocess.Popen], timeout: float = 15.0) -> dict[str, int]:
    """SIGTERM by PID, then SIGKILL what is still running after ``timeout``."""
    for p in procs.values():
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
    codes = {}
    deadline = time.monotonic() + timeout
    for name, p in procs.items():
        try:
            codes[name] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            codes[name] = p.wait(timeout=5)
    return codes


async def test_every_service_starts_from_the_installed_wheel(install: Install, nats_url: str):
    system = System(root=install.workdir / "state", run_id="wheel", nats_url=nats_url)
    procs: dict[str, subprocess.Popen] = {}
    logs = {s: install.workdir / f"{s}.log" for s in SERVICES}
    try:
        for service in SERVICES:  # the environment `agmarl up` gives each service
            env = {k: v for k, v in system.service_env(service).items() if k != "PYTHONPATH"}
            with open(logs[service], "wb") as log:
                procs[service] = subprocess.Popen([str(install.python), "-m", module_of(service)], env=env,
                                                  cwd=install.workdir, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL)
        default = json.loads((ROOT / "models" / "default" / "manifest.json").read_text())["version"]
        bus = await Bus.connect(nats_url, name="test-wheel")
        try:
            statuses = await asyncio.gather(*(wait_healthy(bus, s, procs[s], logs[s]) for s in SERVICES))
            # inference loads models/default (from the install) once it is up
            loaded = await wait_until(bus, "inference", lambda st: default in st.details.get("models_loaded", []))
        finally:
            await bus.close()
        assert loaded, f"inference never loaded {default}\n{logs['inference'].read_text()[-4000:]}"
        for service, status in zip(SERVICES, statuses):
            assert status.pid == procs[service].pid, service
            with urllib.request.urlopen(f"http://127.0.0.1:{status.metrics_port}/metrics", timeout=5) as r:
                assert r.status == 200 and b"# TYPE" in r.read(), service
            with urllib.request.urlopen(f"http://127.0.0.1:{status.metrics_port}/healthz", timeout=5) as r:
                assert r.status == 200, service  # what the image's HEALTHCHECK asks
    finally:
        codes = stop(procs)
    assert codes == {s: 0 for s in SERVICES}, {s: logs[s].read_text()[-2000:] for s, c in codes.items() if c != 0}
