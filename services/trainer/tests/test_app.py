"""The trainer service shell with a real nats-server: a train request runs the smoke config in a worker
process, the model files land in the Object Store and model_published announces the version."""

from __future__ import annotations

import asyncio
import json
import os

from agmarl_common import messages as m
from agmarl_common import subjects
from agmarl_common.bus import Bus
from agmarl_common.service import ServiceRuntime
from agmarl_trainer.app import TrainerApp, config_for
from agmarl_trainer.settings import TrainerSettings


def request(rid: str, **evidence) -> m.TrainRequest:
    return m.TrainRequest(request_id=rid, reason="test", evidence=evidence, requested_at=0.0)


def test_config_names_are_confined_to_configs_train():
    assert config_for(request("a")).name == "smoke.yaml"
    assert config_for(request("b", train_config="default.yaml")).name == "default.yaml"
    for bad in ("../../pyproject.toml", "nope.yaml"):
        try:
            config_for(request("c", train_config=bad))
        except ValueError:
            continue
        raise AssertionError(f"{bad} accepted")


async def test_train_request_trains_and_publishes_a_model(nats_url):
    settings = TrainerSettings(nats_url=nats_url, cluster="trainer-test")
    rt = ServiceRuntime("trainer", settings)
    app = TrainerApp(rt, settings)
    rt.handle_request(subjects.train_request(), m.TrainRequest, m.TrainStatus)(app.on_request)
    await rt.start()
    bus = await Bus.connect(nats_url, name="test-trainer")
    statuses: list[m.TrainStatus] = []
    published: list[m.ModelPublished] = []
    try:
        async def on_status(msg):
            statuses.append(m.decode(m.TrainStatus, msg.data))

        async def on_published(msg):
            published.append(m.decode(m.ModelPublished, msg.data))

        await bus.subscribe(subjects.train_status(), on_status)
        await bus.subscribe(subjects.model_published(), on_published)
        await bus.flush()
        first = await bus.request(subjects.train_request(), request("r1"), m.TrainStatus, timeout=5)
        second = await bus.request(subjects.train_request(), request("r2"), m.TrainStatus, timeout=5)
        assert first.status == "accepted" and second.status == "rejected" and "r1" in second.detail
        for _ in range(600):  # bounded: the smoke run takes well under two minutes (more on a busy machine)
            if any(s.status in ("done", "failed") for s in statuses):
                break
            await asyncio.sleep(0.5)
        final = [s for s in statuses if s.request_id == "r1"]
        assert [s.status for s in final] == ["accepted", "running", "done"], [s.detail for s in final]
        assert published and published[0].version == final[-1].model_version
        version = published[0].version
        blob = await bus.object_get(subjects.MODELS_BUCKET, f"{version}/actor.onnx")
        manifest = json.loads(await bus.object_get(subjects.MODELS_BUCKET, f"{version}/manifest.json"))
        assert blob and manifest["version"] == version and manifest["files"]["actor.onnx"] == published[0].sha256
        assert not app.running
    finally:
        await bus.close()
        await rt.shutdown()


async def test_stopping_the_service_stops_the_run_and_its_workers(nats_url):
    settings = TrainerSettings(nats_url=nats_url, cluster="trainer-stop")
    rt = ServiceRuntime("trainer", settings)
    app = TrainerApp(rt, settings)
    rt.handle_request(subjects.train_request(), m.TrainRequest, m.TrainStatus)(app.on_request)
    await rt.start()
    bus = await Bus.connect(nats_url, name="test-trainer-stop")
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
        assert len(group) >= 3, "the run and its rollout workers, in the run's own process group"
    finally:
        await bus.close()
        await rt.shutdown()
    await asyncio.sleep(1.0)
    assert not [p for p in group if os.path.exists(f"/proc/{p}") and _state(p) != "Z"]


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
