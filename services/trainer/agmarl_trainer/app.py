"""trainer: answers retrain requests, improves the serving model in a worker process (search-based
improvement on simulator episodes plus the recorded experience, ``finetune.py``), and publishes the result
only when the promotion gate says it beats what serves on held-out seeds.

A request is answered at once ("accepted", or "rejected" while another run is in progress) and the same
status is published. The run: the incumbent is what serves (KV ``agmarl_config/active_policy``; with no
selection, the newest model this trainer published, else ``models/default``, as the inference service
does); its model folder comes from disk or the Object Store. The experience buffer (the EXPERIENCE
stream's transitions, bounded, mirrored to ``<work>/experience.jsonl``) is copied for the run, and
``finetune.run_finetune`` (with ``configs/train/finetune.yaml`` unless the request's evidence names another
file of configs/train/ under ``train_config``) goes to a separate process (forked from a server that has its
modules loaded, ``run_context``), so the event loop stays responsive. Then "running", and at the end:

- "done" with the model version when the gate promoted the candidate: its manifest is signed with the
  trainer's key (``model_signing_key``; ``manifest.sig``, docs/security.md), every model file is stored in
  the Object Store bucket ``agmarl_models`` as ``<version>/<file>`` and ``model_published`` announces it;
- "rejected" with the gate's reason (the paired gain on the held-out seeds) and the metrics of candidate,
  incumbent and the baselines (nothing published);
- "failed" with the reason (no signing key configured among them).

A request id becomes the run's folder ``<work>/<request id>``: one that is not a single safe path component
(``pathnames``) is rejected before anything is written (``agmarl_trainer_invalid_request_ids_total``). The
incumbent model is verified as inference verifies it (signed by a trusted key, digests, allowed directory).

``evidence["force"] = true`` publishes a candidate the gate refused (the status says so). Every run's
``<work>/<request id>/result.json`` holds the evaluation, the verdict and what was published. On shutdown
a run in progress is terminated.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import multiprocessing.util
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from prometheus_client import Counter

from agmarl_common.runtime import messages as m
from agmarl_common.serving import modelstore, signing
from agmarl_common.runtime import subjects
from agmarl_common.core.pathnames import check_path_component, is_path_component
from agmarl_common.core.policies.registry import is_model, model_ref, with_model
from agmarl_common.runtime.lifetime import die_with_parent, process_alive
from agmarl_common.runtime.service import HandlerContext, ServiceRuntime
from agmarl_common.runtime.settings import load_settings
from agmarl_trainer.experience import ExperienceBuffer
from agmarl_trainer.settings import TrainerSettings

SERVICE = "trainer"
# the source checkout (editable install), else the working directory (the container's /app)
REPO_ROOT = next((p for p in (Path(__file__).resolve().parents[3], Path.cwd())
                  if (p / "configs" / "train").is_dir()), Path.cwd())
CONFIG_DIR = REPO_ROOT / "configs" / "train"
DEFAULT_CONFIG = "finetune.yaml"
WORK_DIR = REPO_ROOT / ".state" / "trainer"  # ignored by git
AUTOGROUP = "/proc/self/autogroup"  # this process's session's scheduling group (Linux, CONFIG_SCHED_AUTOGROUP)
MAX_RUN_S = 3 * 3600.0  # a run still going after this is terminated


def write_result(path: str | Path, body: dict) -> None:
    """A run's result.json."""
    Path(path).write_text(json.dumps(body, indent=2, default=str) + "\n")


def run_job(config_path: str, incumbent: dict, experience_path: str, out_dir: str, runs_dir: str,
            result_path: str, force: bool, objective: str = "composite", scheme: str = "fixed",
            niceness: int = 0) -> None:
    """Worker process: ``finetune.run_finetune``, its result (or the error) as JSON in ``result_path``.

    It leads its own process group, so stopping the run stops its rollout workers too (``_stop``), and runs
    ``niceness`` steps below the services (its workers inherit it): a fine-tune sharing cores with the
    scheduler takes what they leave."""
    from agmarl_trainer.finetune import Incumbent, run_finetune

    die_with_parent()  # a trainer killed outright takes its run (and, below, the run's workers) with it
    os.setsid()
    if niceness > 0:
        nice_session(os.nice(niceness))  # the session's group as nice as the run itself now is
    try:
        body = run_finetune(config_path, Incumbent(**incumbent), experience_path, out_dir, runs_dir, force=force,
                            objective=objective, scheme=scheme)
    except Exception as err:  # reported to the requester as "failed"
        body = {"rc": 1, "error": f"{type(err).__name__}: {err}"}
    body["niceness"] = os.nice(0)  # what the run ran at
    body["session_niceness"] = session_niceness()
    write_result(result_path, body)


def nice_session(niceness: int, path: str = AUTOGROUP) -> bool:
    """Set this session's autogroup nice value to ``niceness`` (True when done). Where the kernel groups processes
    by session (``sched_autogroup_enabled``, the default on desktop and VM kernels), a process's nice value
    only orders it among its own session: the run's new session (``setsid``) would take as much CPU as each
    service's session, whatever its nice value (a full chaos run on 2 cores: the run's 2 rollout workers at
    nice 19 took ~46 % of the cores and the reward-calculator fell thousands of decisions behind). Without
    autogroups (no such file; a container in its own cgroup) the nice value alone does it."""
    try:
        Path(path).write_text(f"{max(-20, min(19, niceness))}\n")
    except OSError:
        return False
    return True


def session_niceness(path: str = AUTOGROUP) -> int | None:
    """This session's autogroup nice value ("/autogroup-42 nice 10"); None without autogroups."""
    try:
        return int(Path(path).read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


TMP_PREFIX = "agmarl-trainer-"


def private_tmp(root: Path | None = None) -> Path:
    """``<root>/agmarl-trainer-<pid>`` (root: the system's temporary directory), this process's temporary
    directory from now on, and its children's (``TMPDIR``: the fork server, the runs forked from it, their
    workers and their own fork servers inherit it). A process ended by a signal leaves its multiprocessing
    folders (``pymp-*``: a fork server's listening socket) behind; here they stay inside this one folder, and the
    folders of trainers that no longer run are removed now, so trainers killed outright (SIGKILL, OOM) leave
    at most one folder each until the next trainer starts. Short on purpose: a fork server's socket path must
    fit AF_UNIX's 108 bytes (a folder inside a deep work directory did not)."""
    root = Path(root if root is not None else tempfile.gettempdir())
    for entry in root.glob(f"{TMP_PREFIX}*"):
        pid = entry.name[len(TMP_PREFIX):]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
    mine = root / f"{TMP_PREFIX}{os.getpid()}"
    mine.mkdir(mode=0o700, exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = str(mine)
    # at an orderly exit, after multiprocessing removed its own folders in it (their finalizers: priority -100)
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(str(mine),), kwargs={"ignore_errors": True},
                                  exitpriority=-200)
    return mine


def run_context() -> multiprocessing.context.BaseContext:
    """Where a run's process comes from: a fork server (started with the first run, ended with the service)
    that has imported the fine-tune's modules (torch among them) once, so a run starts without importing them
    again (~4 s of CPU each on the 2-core machine); the service process itself never imports torch."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, "agmarl_trainer.finetune"])
    return ctx


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
    """The config file a request asks for (a name inside configs/train/), else the fine-tuning config."""
    name = str(req.evidence.get("train_config", "") or DEFAULT_CONFIG)
    path = (CONFIG_DIR / Path(name).name)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        raise ValueError(f"unknown training config {name!r} (files of {CONFIG_DIR})")
    return path


def forced(req: m.TrainRequest) -> bool:
    return req.evidence.get("force") in (True, "true", "1", 1)


def verdict_detail(body: dict) -> str:
    """One line: the gate's reason, then alloc_at_100 of every evaluated policy and the experience used."""
    policies = body.get("evaluation", {}).get("policies", {})
    scores = ", ".join(f"{name} {p.get('alloc_at_100', float('nan')):.3f}" for name, p in policies.items())
    exp = body.get("experience", {})
    return (f"promotion gate: {body['gate']['reason']}; alloc_at_100 {scores} (incumbent "
            f"{body.get('incumbent', {}).get('policy', '?')}); experience samples {exp.get('samples', 0)} "
            f"of {exp.get('transitions', 0)} transitions")


class TrainerApp:
    def __init__(self, rt: ServiceRuntime, settings: TrainerSettings, work_dir: Path = WORK_DIR):
        self.rt = rt
        self.settings = settings
        self.work_dir = Path(work_dir)
        self.requests = Counter("agmarl_trainer_requests_total", "Train requests received", ["status"],
                                registry=rt.registry)
        self.buffer = ExperienceBuffer(settings.experience_buffer, self.work_dir / "experience.jsonl",
                                       max_bytes=settings.experience_buffer_bytes)
        self.experience_total = Counter("agmarl_trainer_experience_total", "Experience transitions received",
                                        registry=rt.registry)
        latest = self.work_dir / "latest_published"
        self.latest = latest.read_text().strip() if latest.is_file() else ""  # newest version published here
        self.running: str = ""  # request id of the run in progress
        self.invalid_ids = Counter("agmarl_trainer_invalid_request_ids_total",
                                   "Train requests refused: request_id is not a safe path component", registry=rt.registry)
        self.signing_key = signing.load_private_key(settings.model_signing_key) if settings.model_signing_key else None
        self.trust = modelstore.ModelTrust.load(settings.trusted_model_keys, settings.allowed_model_dirs,
                                                own_dirs=[self.work_dir / "models"])
        self.proc: multiprocessing.Process | None = None  # its process (the leader of its process group)

    def health_details(self) -> dict:
        """The trainer's health details: transitions kept, the run in progress, the newest version published
        here, and whether the experience file is behind the buffer (``experience_mirror_behind``: it will be
        rewritten on the next successful try) and how many kept transitions it could not take."""
        return {"experience_buffered": len(self.buffer), "training": self.running, "latest_published": self.latest,
                "experience_mirror_behind": self.buffer.mirror_behind,
                "experience_mirror_failures": self.buffer.mirror_failures}

    async def on_experience(self, msg: m.Experience, ctx: HandlerContext) -> None:
        """Keep recent transitions (bounded, deduplicated by id, mirrored to a file) for fine-tuning; the
        stream is durable, so none is lost while the trainer is down."""
        if self.buffer.add(msg):
            self.experience_total.inc()

    def answer(self, req: m.TrainRequest) -> tuple[m.TrainStatus, Path | None]:
        def status(s: str, detail: str) -> m.TrainStatus:
            self.requests.labels(status=s).inc()
            return m.TrainStatus(request_id=req.request_id, status=s, detail=detail, time=time.time())
        if not is_path_component(req.request_id):
            self.invalid_ids.inc()
            self.rt.log.warning("train request refused: request_id %r is not a safe path component",
                                req.request_id[:80])
            return status("rejected", f"request_id {req.request_id[:80]!r} is not a safe path component (1-128 of "
                                      "A-Z a-z 0-9 . _ -, starting with a letter or digit, no '..')"), None
        if self.running:
            return status("rejected", f"a training run is in progress (request {self.running}); "
                                      f"reason given: {req.reason}"), None
        try:
            config = config_for(req)
        except ValueError as err:
            return status("rejected", f"{err}; reason given: {req.reason}"), None
        return status("accepted", f"fine-tuning with {config.name} (reason given: {req.reason})"), config

    async def on_request(self, req: m.TrainRequest, ctx: HandlerContext) -> m.TrainStatus:
        status, config = self.answer(req)
        await ctx.publish(subjects.train_status(), status)
        if config is not None:
            self.running = req.request_id
            self.rt.spawn(self.train(req, config), name=f"train {req.request_id}")
        return status

    async def _status(self, req: m.TrainRequest, status: str, detail: str, version: str = "") -> None:
        self.requests.labels(status=status).inc()
        await self.rt.publish(subjects.train_status(), m.TrainStatus(
            request_id=req.request_id, status=status, detail=detail, model_version=version, time=time.time()))

    # --- the incumbent ---------------------------------------------------------------------------

    async def model_dir(self, ref: str) -> Path | None:
        """A model folder on disk (``default``, a version under models/ or .state/models/), else fetched from
        the Object Store into ``<work>/models/<version>``; None when there is no such model. Either is
        verified first (``ModelIntegrityError``: unsigned, untrusted, tampered with, not allowed)."""
        local = modelstore.local_dir(ref)
        if local is None and is_path_component(ref):
            local = modelstore.local_dir(str(self.work_dir / "models" / ref))
        if local is not None:
            modelstore.load_dir(local, trust=self.trust)
            return local
        try:
            artifact = await modelstore.fetch_version(self.rt.bus, ref, trust=self.trust)
        except modelstore.ModelNotFoundError:
            return None
        return modelstore.save(artifact, self.work_dir / "models")

    async def incumbent(self) -> dict:
        """What serves now, and the model folder the fine-tune starts from (see the module docstring)."""
        raw = await self.rt.bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
        policy = ""
        if raw:
            try:
                policy = m.decode(m.PolicySelection, raw).policy
            except m.DecodeError as err:
                self.rt.log.warning("active_policy in KV is not a selection (%s): ignored", err)
        newest = self.latest or "default"
        if policy and not is_model(policy):  # a baseline serves: start from the newest model
            path = await self.model_dir(newest)
            return {"policy": policy, "model_dir": str(path or "")}
        ref = model_ref(policy) if policy else ""
        ref = newest if ref in ("", "latest") else ref
        path = await self.model_dir(ref)
        if path is None:
            raise LookupError(f"the serving model {ref!r} is neither on disk nor in the Object Store")
        return {"policy": with_model(policy, ref), "model_dir": str(path)}

    # --- the run ---------------------------------------------------------------------------------

    async def train(self, req: m.TrainRequest, config: Path) -> None:
        work = self.work_dir / check_path_component(req.request_id, "request_id")  # answer() refused others
        out, result = work / "model", work / "result.json"
        work.mkdir(parents=True, exist_ok=True)
        proc = None
        try:
            incumbent = await self.incumbent()
            n = self.buffer.write(work / "experience.jsonl")
            # not daemonic: the run starts its own rollout worker processes
            proc = run_context().Process(target=run_job, args=(
                str(config), incumbent, str(work / "experience.jsonl"), str(out), str(work / "runs"), str(result),
                forced(req), self.settings.objective, self.settings.scheme, self.settings.train_nice))
            self.proc = proc
            proc.start()
            await self._status(req, "running", f"fine-tuning {incumbent['policy']} with {config.name} and {n} "
                                               f"transitions of experience in process {proc.pid}")
            deadline = time.monotonic() + MAX_RUN_S
            while proc.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            body = json.loads(result.read_text()) if result.is_file() else {"rc": 1, "error": "no result"}
            if body.get("rc") != 0:
                await self._status(req, "failed", str(body.get("error", f"exit status {body.get('rc')}")))
                return
            await self.conclude(req, body, out, result)
        except Exception as err:
            await self._status(req, "failed", f"{type(err).__name__}: {err}")
        finally:
            if proc is not None:
                _stop(proc)
            self.running, self.proc = "", None

    async def conclude(self, req: m.TrainRequest, body: dict, out: Path, result: Path) -> None:
        """Publish a promoted (or forced) candidate, else report the gate's refusal; the outcome goes into
        result.json too."""
        gate = body["gate"]
        version = ""
        if (gate["promote"] or gate.get("forced")) and body.get("version"):
            version = self.latest = await self.publish_model(out)
            (self.work_dir / "latest_published").write_text(version + "\n")
        body["published"] = version
        write_result(result, body)
        if not version:
            await self._status(req, "rejected", verdict_detail(body))
            return
        how = "published without the gate's approval (evidence force)" if gate.get("forced") else "published"
        await self._status(req, "done", f"model {version} {how}; {verdict_detail(body)}", version)

    async def publish_model(self, model_dir: Path) -> str:
        """Sign the manifest (``manifest.sig``), every file of ``model_dir`` into the models bucket as
        <version>/<file>, then model_published. Without a signing key nothing is published (RuntimeError)."""
        if self.signing_key is None:
            raise RuntimeError("no model signing key configured (AGMARL_MODEL_SIGNING_KEY; `agmarl keys generate`): "
                               "an unsigned model would be refused by inference, so it is not published")
        manifest = json.loads((model_dir / "manifest.json").read_text())
        version = check_path_component(str(manifest["version"]), "model version")
        signing.sign_dir(model_dir, self.signing_key)
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
    private_tmp()
    app = TrainerApp(rt, settings, Path(settings.state_dir) / "trainer" if settings.state_dir else WORK_DIR)
    rt.handle_request(subjects.train_request(), m.TrainRequest, m.TrainStatus)(app.on_request)
    rt.handle_stream(subjects.EXPERIENCE, subjects.experience(settings.cluster), f"trainer-{subjects.token(settings.cluster)}",
                     m.Experience)(
        app.on_experience)
    rt.health_details = app.health_details
    await rt.start()
    return await rt.run_until_stopped()
