"""`agmarl retrain --reason` publishes a train request and prints the trainer's answer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_testing.fixtures import wait_healthy

from .conftest import wait_for


@pytest.mark.asyncio
async def test_retrain_prints_trainer_answer_and_status_event(nats_url, service_processes, tmp_path):
    proc = service_processes("agmarl_trainer", env={"NATS_URL": nats_url, "AGMARL_CLUSTER": "retrain"})
    bus = await Bus.connect(nats_url, name="test-retrain")
    try:
        await wait_healthy(bus, "trainer", timeout=60, proc=proc)
        statuses: list[m.TrainStatus] = []

        async def on_status(msg):
            statuses.append(m.decode(m.TrainStatus, msg.data))

        await bus.subscribe(subjects.train_status(), on_status)
        await bus.flush()
        env = dict(os.environ, NATS_URL=nats_url)
        out = subprocess.run([sys.executable, "-m", "agmarl_cli.main", "retrain", "--reason", "workload shifted"],
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.stdout.startswith("trainer: "), out.stdout + out.stderr
        assert "workload shifted" in out.stdout
        assert await wait_for(lambda: statuses, timeout=5)
        assert statuses[0].detail in out.stdout
    finally:
        await bus.close()
