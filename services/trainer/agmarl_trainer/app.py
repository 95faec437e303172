"""trainer: answers train requests (request/reply), trains in a worker process, publishes the model.

A request is answered at once ("accepted", or "rejected" while another run is in progress) and the same
status is published; the run itself (``agmarl train`` with the smoke config unless the request's
evidence names another file of configs/train/ under ``train_config``) goes to a separate process, so the
event loop stays responsive. Then "running", and at the end "done" with the model version (after every
model file is stored in the Object Store bucket ``agmarl_models`` as ``<version>/<file>`` and a
``model_published`` event announces it) or "failed" with the reason. On shutdown a run in progress is
terminated.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import time
from collections import deque
from pathlib import Path

from prometheus_client import Counter

from agmarl_common import messages as m
from agmarl_common import subjects
from agmarl_common.service import HandlerContext, ServiceRuntime
from agmarl_common.settings import load_settings
from agmarl_trainer.settings import TrainerSettings

SERVICE = "trainer"
# the source checkout (editable install), else the working directory (the container's /app)
REPO_ROOT = next((p for p in (Path(__file__).resolve().parents[3], Path.cwd())
                  if (p / "configs" / "train").is_dir()), Path.cwd())
CONFIG_DIR = REPO_ROOT / "configs" / "train"
DEFAULT_CONFIG = "smoke.yaml"
WORK_DIR = REPO_ROOT / ".state" / "trainer"  # ignored by git
MAX_RUN_S = 3 * 3600.0  # a run still going after this is terminated


def run_job(config_path: str, out_dir: str, runs_dir: str, result_path: str) -> None:
    """Worker process: ``agmarl train``, then the outcome as JSON in ``result_path``.

    It leads its own process group, so stopping the run stops its rollout workers too (``_stop``)."""
    from agmarl_trainer.cli import main

    os.setsid()

    try:
        rc = main(["--config", config_path, "--out", out_dir, "--runs-dir", runs_dir])
        body = {"rc": rc}
    except Exception as err:  # reported to the requester as "failed"
        body = {"rc": 1, "error": f"{type(err).__name__}: {err}"}
    Path(result_path).write_text(json.dumps(body))


def _stop(proc: multiprocessing.Process) -> None:
    """Terminate a run and every process of its group (the run's own rollout workers), by pid."""
    if proc.pid is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the group run_job created: only processes this run started
    except (ProcessLookupError, PermissionError):
        pass
    proc.join(timeout=10)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=5)


def config_for(req: m.TrainRequest) -> Path:
    """The config file a request asks for (a name inside configs/train/), else the smoke config."""
    name = str(req.evidence.get("train_config", "") or DEFAULT_CONFIG)
    path = (CONFIG_DIR / Path(name).name)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        raise ValueError(f"unknown training config {name!r} (files of {CONFIG_DIR})")
    return path


class TrainerApp:
    def __init__(self, rt: ServiceRuntime, settings: TrainerSettings):
        self.rt = rt
        self.settings = settings
        self.requests = Counter("agmarl_trainer_requests_total", "Train requests received", ["status"],
                                registry=rt.registry)
        self.experience: deque[m.Experience] = deque(maxlen=settings.experience_buffer)
        self.experience_total = Counter("agmarl_trainer_experience_total", "Experience transitions received",
                                        registry=rt.registry)
        self.running: str = ""  # request id of the run in progress
        self.proc: multiprocessing.Process | None = None  # its process (the leader of its process group)

    async def on_experience(self, msg: m.Experience, ctx: HandlerContext) -> None:
        """Keep recent transitions (bounded) for fine-tuning; the stream is durable, so none is lost
        while the trainer is down."""
        self.experience.append(msg)
        self.experience_total.inc()

    def answer(self, req: m.TrainRequest) -> tuple[m.TrainStatus, Path | None]:
        def status(s: str, detail: str) -> m.TrainStatus:
            self.requests.labels(status=s).inc()
            return m.TrainStatus(request_id=req.request_id, status=s, detail=detail, time=time.time())
        if self.running:
            return status("rejected", f"a training run is in progress (request {self.running}); "
                                      f"reason given: {req.reason}"), None
        try:
            config = config_for(req)
        except ValueError as err:
            return status("rejected", f"{err}; reason given: {req.reason}"), None
        return status("accepted", f"training with {config.name} (reason given: {req.reason})"), config

    async def on_request(self, req: m.TrainRequest, ctx: HandlerContext) -> m.TrainStatus:
        status, config = self.answer(req)
        await ctx.publish(subjects.train_status(), status)
        if config is not None:
            self.running = req.request_id
            self.rt.spawn(self.train(req, config), name=f"train {req.request_id}")
        return status

    async def _status(self, req: m.TrainRequest, status: str, detail: str, version: str = "") -> None:
        await self.rt.publish(subjects.train_status(), m.TrainStatus(
            request_id=req.request_id, status=status, detail=detail, model_version=version, time=time.time()))

    async def train(self, req: m.TrainRequest, config: Path) -> None:
        work = WORK_DIR / req.request_id
        out, result = work / "model", work / "result.json"
        work.mkdir(parents=True, exist_ok=True)
        # not daemonic: the run starts its own rollout worker processes
        proc = multiprocessing.get_context("spawn").Process(
            target=run_job, args=(str(config), str(out), str(work / "runs"), str(result)))
        self.proc = proc
        try:
            proc.start()
            await self._status(req, "running", f"training with {config.name} in process {proc.pid}")
            deadline = time.monotonic() + MAX_RUN_S
            while proc.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(1.0)
            body = json.loads(result.read_text()) if result.is_file() else {"rc": 1, "error": "no result"}
            if body.get("rc") != 0:
                self.requests.labels(status="failed").inc()
                await self._status(req, "failed", str(body.get("error", f"exit status {body.get('rc')}")))
                return
            version = await self.publish_model(out)
            self.requests.labels(status="done").inc()
            await self._status(req, "done", f"model {version} published", version)
        except Exception as err:
            self.requests.labels(status="failed").inc()
            await self._status(req, "failed", f"{type(err).__name__}: {err}")
        finally:
            _stop(proc)
            self.running, self.proc = "", None

    async def publish_model(self, model_dir: Path) -> str:
        """Every file of ``model_dir`` into the models bucket as <version>/<file>, then model_published."""
        manifest = json.loads((model_dir / "manifest.json").read_text())
        version = manifest["version"]
        for f in sorted(model_dir.iterdir()):
            if f.is_file():
                await self.rt.bus.object_put(subjects.MODELS_BUCKET, f"{version}/{f.name}", f.read_bytes(),
                                             description=f"agmarl model {version}")
        await self.rt.publish(subjects.model_published(), m.ModelPublished(
            version=version, sha256=manifest["files"]["actor.onnx"], object_name=f"{version}/actor.onnx",
            manifest=manifest, time=time.time()))
        return version


async def main() -> int:
    settings = load_settings(TrainerSettings)
    rt = ServiceRuntime(SERVICE, settings)
    app = TrainerApp(rt, settings)
    rt.handle_request(subjects.train_request(), m.TrainRequest, m.TrainStatus)(app.on_request)
    rt.handle_stream(subjects.EXPERIENCE, subjects.experience(settings.cluster), f"trainer-{subjects.token(settings.cluster)}",
                     m.Experience)(
        app.on_experience)
    rt.health_details = lambda: {"experience_buffered": len(app.experience), "training": app.running}
    await rt.start()
    return await rt.run_until_stopped()
