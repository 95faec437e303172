"""The trainer service shell with a real nats-server: a retrain request fine-tunes the serving model in a
worker process from the experience the EXPERIENCE stream delivered plus the simulator, and the promotion
gate decides: a better candidate lands in the Object Store and model_published announces it; one that is
not better is reported "rejected" with the gate's reason and nothing is published."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.serving import modelstore
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, bind, state_to_dict, to_dict
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_common.core.sim import synthetic
from agmarl_testing.fixtures import wait_healthy
from agmarl_testing.processes import ProcessWatch, descendants
from agmarl_trainer.app import (
    TrainerApp,
    config_for,
    nice_session,
    private_tmp,
    session_niceness,
    verdict_detail,
)
from agmarl_trainer.settings import TrainerSettings


def request(rid: str, **evidence) -> m.TrainRequest:
    return m.TrainRequest(request_id=rid, reason="test", evidence=evidence, requested_at=0.0)


def test_config_names_are_confined_to_configs_train():
    assert config_for(request("a")).name == "finetune.yaml"
    assert config_for(request("b", train_config="finetune_smoke.yaml")).name == "finetune_smoke.yaml"
    for bad in ("../../pyproject.toml", "nope.yaml"):
        try:
            config_for(request("c", train_config=bad))
        except ValueError:
            continue
        raise AssertionError(f"{bad} accepted")


def test_verdict_detail_names_every_policy_and_the_reason():
    body = {"gate": {"reason": "not better: alloc_at_100 90.000 vs incumbent 91.000"},
            "incumbent": {"policy": "model:default"}, "experience": {"samples": 2, "transitions": 5},
            "evaluation": {"policies": {"candidate": {"alloc_at_100": 90.0}, "incumbent": {"alloc_at_100": 91.0},
                                        "fgd": {"alloc_at_100": 92.0}, "bestfit": {"alloc_at_100": 89.5}}}}
    line = verdict_detail(body)
    assert line.startswith("promotion gate: not better")
    for part in ("candidate 90.000", "incumbent 91.000", "fgd 92.000", "bestfit 89.500", "model:default",
                 "experience samples 2 of 5"):
        assert part in line


def recorded_decisions(cluster: str, n: int = 8) -> list[m.Experience]:
    """Decisions on a small synthetic cluster as the scheduler would record them: the state before, the pod,
    the node picked (the first feasible one), a reward."""
    nodes = synthetic.synthetic_cluster(6, seed=3)
    pods = synthetic.generate("diurnal", nodes, horizon_s=300, seed=3)
    st, out = ClusterState.empty(nodes), []
    for pod in pods:
        cand = feasible_nodes(pod, st)
        if not cand.size:
            continue
        node = st.nodes[int(cand[0])].name
        out.append(m.Experience(id=f"{cluster}-{len(out)}", cluster=cluster,
                                state={"cluster": state_to_dict(st), "pending": [to_dict(pod)]},
                                action={"pod_key": pod.key, "node": node, "policy": "test"},
                                reward=0.1 * (len(out) % 4), next_state={}, time=float(len(out))))
        st = bind(st, pod, int(cand[0]), () if not pod.num_gpu else tuple(range(pod.num_gpu)))
        if len(out) == n:
            break
    return out


class Harness:
    """A TrainerApp on a real nats-server, a test client, every train_status and model_published seen, and
    KV active_policy set for the test (restored afterwards)."""

    def __init__(self, nats_url: str, tmp_path, active_policy: str, model_keys=None):
        self.cluster = f"trainer-{uuid.uuid4().hex[:6]}"
        keys = {} if model_keys is None else {"model_signing_key": str(model_keys.key),
                                              "trusted_model_keys": model_keys.trusted}
        self.settings = TrainerSettings(nats_url=nats_url, cluster=self.cluster, **keys)
        self.rt = ServiceRuntime("trainer", self.settings)
        self.app = TrainerApp(self.rt, self.settings, work_dir=tmp_path / "trainer")
        self.active_policy = active_policy
        self.statuses: list[m.TrainStatus] = []
        self.published: list[m.ModelPublished] = []

    async def __aenter__(self) -> "Harness":
        self.rt.handle_request(subjects.train_request(), m.TrainRequest, m.TrainStatus)(self.app.on_request)
        self.rt.handle_stream(subjects.EXPERIENCE, subjects.experience(self.cluster), f"trainer-{self.cluster}",
                              m.Experience)(self.app.on_experience)
        await self.rt.start()
        self.bus = await Bus.connect(self.settings.nats_url, name="test-trainer")
        self.previous = await self.bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
        await self.bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.PolicySelection(
            policy=self.active_policy, reason="test", time=time.time()))

        async def on_status(msg):
            self.statuses.append(m.decode(m.TrainStatus, msg.data))

        async def on_published(msg):
            self.published.append(m.decode(m.ModelPublished, msg.data))

        await self.bus.subscribe(subjects.train_status(), on_status)
        await self.bus.subscribe(subjects.model_published(), on_published)
        await self.bus.flush()
        return self

    async def __aexit__(self, *exc) -> None:
        kv = await self.bus.kv(subjects.CONFIG_BUCKET)
        if self.previous:
            await kv.put(subjects.KEY_ACTIVE_POLICY, self.previous)
        else:
            await kv.delete(subjects.KEY_ACTIVE_POLICY)
        await self.bus.close()
        await self.rt.shutdown()

    async def run(self, rid: str, config: str) -> tuple[list[m.TrainStatus], dict]:
        reply = await self.bus.request(subjects.train_request(), request(rid, train_config=config), m.TrainStatus,
                                       timeout=5)
        assert reply.status == "accepted", reply.detail
        for _ in range(480):  # bounded: a smoke fine-tune takes well under a minute (more on a busy machine)
            if any(s.request_id == rid and s.status in ("done", "rejected", "failed") for s in self.statuses):
                break
            await asyncio.sleep(0.25)
        result = self.app.work_dir / rid / "result.json"
        for _ in range(100):  # the run writes its result before its last status; bounded, in case it did not
            if result.exists():
                break
            await asyncio.sleep(0.05)
        return [s for s in self.statuses if s.request_id == rid], json.loads(result.read_text())


async def test_a_candidate_that_is_not_better_is_not_published(nats_url, tmp_path):
    # the shipped model serves, inside a placement rule; the dry-run config makes no optimisation step, so the
    # candidate is the incumbent's own weights: evaluated on the same seeds it scores the same and the gate must
    # refuse it (the rule is the serving selection's, not the weights': both are compared without it)
    async with Harness(nats_url, tmp_path, "cpu-first:model:default") as h:
        final, result = await h.run("worse", "finetune_dryrun.yaml")
        assert [s.status for s in final] == ["accepted", "running", "rejected"], [s.detail for s in final]
        assert "promotion gate: not better" in final[-1].detail and "fgd" in final[-1].detail
        assert not h.published and not (h.app.work_dir / "worse" / "model" / "manifest.json").exists()
        policies = result["evaluation"]["policies"]
        assert set(policies) == {"candidate", "incumbent", "fgd", "bestfit"}
        assert result["incumbent"] == {"policy": "cpu-first:model:default",
                                       "model_dir": str(modelstore.DEFAULT_MODEL_DIR)}
        assert result["start_from"].endswith("model.pt")
        assert policies["candidate"]["alloc_at_100"] == policies["incumbent"]["alloc_at_100"]  # started from it
        assert result["gate"]["promote"] is False and result["published"] == ""
        assert not h.app.running


async def test_a_better_candidate_is_published_and_recorded_experience_is_used(nats_url, tmp_path, model_keys):
    # a weak baseline serves (random placement); the candidate starts from the newest model's weights
    async with Harness(nats_url, tmp_path, "random", model_keys) as h:
        decisions = recorded_decisions(h.cluster)
        for e in decisions:
            await h.bus.js_publish(subjects.experience(h.cluster), e, msg_id=e.id)
        for _ in range(100):  # bounded: the durable consumer delivers them
            if len(h.app.buffer) == len(decisions):
                break
            await asyncio.sleep(0.1)
        assert len(h.app.buffer) == len(decisions) == 8
        final, result = await h.run("better", "finetune_smoke.yaml")
        assert [s.status for s in final] == ["accepted", "running", "done"], [s.detail for s in final]
        assert "8 transitions" in final[1].detail
        policies = result["evaluation"]["policies"]
        assert policies["candidate"]["alloc_at_100"] > policies["incumbent"]["alloc_at_100"]
        assert result["gate"]["promote"] is True and result["incumbent"]["policy"] == "random"
        assert result["experience"]["transitions"] == 8 and result["experience"]["samples"] > 0
        assert result["simulator_samples"] > 0 and result["fit"]["steps"] > 0
        assert h.published and h.published[0].version == final[-1].model_version == result["published"]
        version = h.published[0].version
        blob = await h.bus.object_get(subjects.MODELS_BUCKET, f"{version}/actor.onnx")
        manifest = json.loads(await h.bus.object_get(subjects.MODELS_BUCKET, f"{version}/manifest.json"))
        assert blob and manifest["version"] == version and manifest["files"]["actor.onnx"] == h.published[0].sha256
        assert manifest["evaluation"]["verdict"]["promote"] is True
        # signed with the trainer's key: what inference fetches verifies against it, and only against it
        artifact = await modelstore.fetch_version(h.bus, version, trust=model_keys.trust())
        assert artifact.version == version and modelstore.SIGNATURE_FILE in artifact.files
        with pytest.raises(modelstore.ModelIntegrityError) as refused:
            await modelstore.fetch_version(h.bus, version, trust=modelstore.ModelTrust.load())  # release key only
        assert refused.value.reason == "untrusted"
        assert h.app.latest == version  # the next run's incumbent when no selection names another


async def test_stopping_the_service_stops_the_run_and_its_workers(nats_url, tmp_path):
    settings = TrainerSettings(nats_url=nats_url, cluster="trainer-stop")
    rt = ServiceRuntime("trainer", settings)
    app = TrainerApp(rt, settings, work_dir=tmp_path / "trainer")
    rt.handle_request(subjects.train_request(), m.TrainRequest, m.TrainStatus)(app.on_request)
    await rt.start()
    bus = await Bus.connect(nats_url, name="test-trainer-stop")
    # the session's NATS is shared: another test's selection (a model signed by its own throwaway key) would
    # be this run's incumbent and be refused; a baseline selection makes the run start from the shipped model
    previous = await bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
    await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.PolicySelection(
        policy="kube-resources", reason="test: the run starts from the shipped model", time=time.time()))
    statuses: list[m.TrainStatus] = []

    async def on_status(msg):
        statuses.append(m.decode(m.TrainStatus, msg.data))

    await bus.subscribe(subjects.train_status(), on_status)
    try:
        reply = await bus.request(subjects.train_request(), request("s1"), m.TrainStatus, timeout=5)
        assert reply.status == "accepted"
        group = []
        for _ in range(240):  # wait until the run has started its rollout workers (bounded)
            await asyncio.sleep(0.5)
            leader = app.proc.pid if app.proc is not None else None
            group = [int(p) for p in os.listdir("/proc") if p.isdigit() and leader and _pgid(int(p)) == leader]
            if len(group) >= 3:
                break
        assert len(group) >= 3, ("the run and its rollout workers, in the run's own process group",
                                 [(st.status, st.detail[:200]) for st in statuses])
    finally:
        if previous is not None:  # the shared selection as it was
            await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, previous)
        await bus.close()
        await rt.shutdown()
    def alive() -> list[int]:
        return [p for p in group if os.path.exists(f"/proc/{p}") and _state(p) not in ("Z", "gone")]

    for _ in range(200):  # SIGTERM to the group at shutdown: the processes end (bounded wait, 10 s)
        if not alive():
            break
        await asyncio.sleep(0.05)
    assert not alive()


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


async def test_a_trainer_killed_outright_takes_every_process_of_its_run_with_it(nats_url, service_processes):
    """SIGKILL to the trainer service while a run is in flight: its fork server, the run forked from it, the
    run's own fork server and rollout workers, and the resource tracker all end (a CI run left such chains
    running under init: every fork-server child held the server's "alive" pipe, so the server outlived the
    trainer, and the run, whose parent is the server, never got its parent-death signal)."""
    cluster = f"trainer-kill-{uuid.uuid4().hex[:6]}"
    proc = service_processes("agmarl_trainer", env={"AGMARL_NATS_URL": nats_url, "AGMARL_CLUSTER": cluster})
    bus = await Bus.connect(nats_url, name="test-trainer-kill")
    previous = await bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
    await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.PolicySelection(
        policy="kube-resources", reason="test: the run starts from the shipped model", time=time.time()))
    try:
        await wait_healthy(bus, "trainer", timeout=60, proc=proc)
        reply = await bus.request(subjects.train_request(), request("k1"), m.TrainStatus, timeout=5)
        assert reply.status == "accepted", reply.detail
        tree: dict[int, tuple[int, str]] = {}
        for _ in range(480):  # until a rollout worker is up: trainer > fork server > run > its fork server > worker
            tree = descendants(proc.pid)
            if max((depth for depth, _ in tree.values()), default=0) >= 4 or proc.returncode is not None:
                break
            await asyncio.sleep(0.25)
        assert max((depth for depth, _ in tree.values()), default=0) >= 4, (tree, proc.output()[-3000:])
    finally:
        if previous is not None:  # the shared selection as it was
            await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, previous)
        await bus.close()
    with ProcessWatch(tree) as watch:
        os.kill(proc.pid, signal.SIGKILL)
        proc.proc.wait(timeout=10)
        # bounded: each server ends once its starter has (a Python exit, slow only on a starved CPU: ~100 s seen
        # with the test in a nice-19 autogroup on a loaded 2-core machine)
        survivors = watch.running(timeout=240)
        watch.kill(survivors)
    assert not survivors, [f"{p}: {tree[p][1][:120]}" for p in survivors]
    # what the killed processes left (their fork servers' sockets) is in the trainer's one folder
    left = Path(tempfile.gettempdir()) / f"agmarl-trainer-{proc.pid}"
    assert list(left.glob("pymp-*")), sorted(p.name for p in Path(tempfile.gettempdir()).glob("agmarl-trainer-*"))
    shutil.rmtree(left)  # as the next trainer to start would


def test_a_trainer_keeps_its_temporary_files_in_one_folder_and_clears_what_dead_ones_left(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", "/tmp"))  # restored after the test
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead, live = int(done.stdout), os.getppid()
    for pid in (dead, live):
        (tmp_path / f"agmarl-trainer-{pid}" / "pymp-x").mkdir(parents=True)
    (tmp_path / "agmarl-trainer-notes").mkdir()
    mine = private_tmp(tmp_path)
    assert mine == tmp_path / f"agmarl-trainer-{os.getpid()}" and mine.is_dir()
    assert os.environ["TMPDIR"] == str(mine) and tempfile.gettempdir() == str(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"agmarl-trainer-{live}", f"agmarl-trainer-{os.getpid()}", "agmarl-trainer-notes"])
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == str(mine)  # the run, its workers and their fork servers inherit it


def test_health_details_say_whether_the_experience_file_is_behind_and_how_many_it_missed(tmp_path):
    def app(work_dir):
        settings = TrainerSettings(cluster="trainer-health")
        return TrainerApp(ServiceRuntime("trainer", settings), settings, work_dir=work_dir)

    e = m.Experience(id="e0", cluster="t", state={}, action={}, reward=1.0, next_state={}, time=0.0)
    ok = app(tmp_path / "ok")
    ok.buffer.add(e)
    assert ok.health_details() == {"experience_buffered": 1, "training": "", "latest_published": "",
                                   "experience_mirror_behind": False, "experience_mirror_failures": 0}
    (tmp_path / "blocked").write_text("a file where the trainer's state directory should be")
    blocked = app(tmp_path / "blocked" / "trainer")
    blocked.buffer.add(e)
    details = blocked.health_details()
    assert details["experience_buffered"] == 1
    assert details["experience_mirror_behind"] is True and details["experience_mirror_failures"] == 1


def test_force_is_read_from_the_evidence():
    from agmarl_trainer.app import forced

    assert forced(request("f", force=True)) and forced(request("g", force="true"))
    assert not forced(request("h")) and not forced(request("i", force=False)) and not forced(request("j", force="no"))


async def test_request_ids_that_are_not_one_path_component_are_refused_and_nothing_is_written(nats_url, tmp_path):
    state = tmp_path / "state"
    async with Harness(nats_url, state, "model:default") as h:
        bad = ["../../escape", "../escape", "/tmp/agmarl-escape-abs", "a/../../escape", "..", ".hidden", "a/b",
               "x" * 129, "", "a\nb", "run..1"]
        for rid in bad:
            reply = await h.bus.request(subjects.train_request(), request(rid), m.TrainStatus, timeout=5)
            assert reply.status == "rejected" and "not a safe path component" in reply.detail, (rid, reply.detail)
        assert h.rt.registry.get_sample_value("agmarl_trainer_invalid_request_ids_total") == len(bad)
        assert not h.app.running
    # nothing was created outside the trainer's work folder, nor any run folder inside it
    assert {p.name for p in tmp_path.iterdir()} <= {"state"}
    assert not os.path.exists("/tmp/agmarl-escape-abs")
    assert not [p for p in state.rglob("*") if p.is_dir() and p != state / "trainer"]


async def test_without_a_signing_key_nothing_is_published(nats_url, tmp_path):
    settings = TrainerSettings(nats_url=nats_url, cluster="trainer-unsigned")
    app = TrainerApp(ServiceRuntime("trainer", settings), settings, work_dir=tmp_path / "trainer")
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.json").write_text(json.dumps({"version": "unsigned-1", "files": {}}))
    with pytest.raises(RuntimeError, match="no model signing key"):
        await app.publish_model(model)
    assert not (model / modelstore.SIGNATURE_FILE).exists()


def test_a_run_takes_what_the_services_leave_it_runs_nicer(tmp_path):
    """run_job lowers its own priority by ``train_nice`` (its rollout workers inherit it): a fine-tune sharing
    cores with the scheduler does not slow it (a chaos run on 2 cores fell behind while one ran at the
    services' priority). A run that fails at once still says how nice it ran."""
    from agmarl_trainer.app import run_context, run_job

    result = tmp_path / "result.json"
    proc = run_context().Process(target=run_job, args=(
        str(tmp_path / "no-such-config.yaml"), {"policy": "fgd", "model_dir": ""}, str(tmp_path / "none.jsonl"),
        str(tmp_path / "out"), str(tmp_path / "runs"), str(result), False, "composite", "fixed", 7))
    proc.start()
    proc.join(120)
    body = json.loads(result.read_text())
    assert body["rc"] == 1 and body["niceness"] == min(19, os.nice(0) + 7)  # 19: the least priority there is
    # its own session's scheduling group is niced as well: with autogroups a nice value alone only orders the
    # processes of one session, and the run leads its own
    writable = os.access("/proc/self/autogroup", os.W_OK)  # no autogroups (or not ours to set): nothing to check
    assert body["session_niceness"] == (body["niceness"] if writable else session_niceness())
    assert TrainerSettings().train_nice == 10


def test_nice_session_writes_the_autogroup_and_reads_it_back(tmp_path):
    """The autogroup file takes a nice value (clamped to -20..19) and reads back as "/autogroup-N nice V";
    without the file (no autogroups) nothing is done and nothing fails."""
    group = tmp_path / "autogroup"
    group.write_text("/autogroup-42 nice 0\n")
    assert nice_session(25, str(group)) and group.read_text() == "19\n"
    group.write_text("/autogroup-42 nice 10\n")
    assert session_niceness(str(group)) == 10
    assert not nice_session(10, str(tmp_path / "missing" / "autogroup"))
    assert session_niceness(str(tmp_path / "missing")) is None


def test_the_service_process_does_not_import_torch():
    """The service only answers requests and keeps the experience buffer; torch is imported by a run's own
    process (``run_job``), so the service starts in a fraction of the time and memory."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, agmarl_trainer.app, agmarl_trainer.__main__; "
                                                "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
