"""A real service process with its own NATS identity on an authenticated nats-server: the operator's
`agmarl retrain` reaches the trainer and gets its answer; without the operator's seed the CLI is refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import permissions, subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.natsauth import NatsAuth, ensure_credentials
from agmarl_common.runtime.natsserver import NatsServer
from agmarl_testing.fixtures import wait_healthy

from .conftest import wait_for

AGMARL = [sys.executable, "-m", "agmarl_cli.main"]


@pytest.fixture
def secure_server(tmp_path):
    creds = ensure_credentials(tmp_path / "creds")
    server = NatsServer(store_dir=tmp_path / "store", auth_config=creds.auth_config)
    server.start()
    try:
        yield server, creds
    finally:
        server.cleanup()


async def test_operator_retrain_reaches_the_authenticated_trainer(secure_server, service_processes, tmp_path):
    server, creds = secure_server
    proc = service_processes("agmarl_trainer", env={
        "NATS_URL": server.url, "AGMARL_CLUSTER": "secure-retrain",
        "AGMARL_NATS_NKEY_SEED_FILE": str(creds.seed("trainer"))})
    reader = NatsAuth(seed_file=str(creds.seed(permissions.READ_ONLY)), identity=permissions.READ_ONLY)
    bus = await Bus.connect(server.url, name="test-cli", auth=reader)
    statuses: list[m.TrainStatus] = []

    async def on_status(msg) -> None:
        statuses.append(m.decode(m.TrainStatus, msg.data))

    try:
        await wait_healthy(bus, "trainer", timeout=60, proc=proc)
        await bus.subscribe(subjects.train_status(), on_status)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGMARL_NATS")}
        env.update(NATS_URL=server.url, AGMARL_NATS_CREDS_DIR=str(creds.directory),
                   AGMARL_STATE_DIR=str(tmp_path / "cli-state"))
        out = subprocess.run([*AGMARL, "retrain", "--reason", "secure shift"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.stdout.startswith("trainer: "), out.stdout + out.stderr
        assert await wait_for(lambda: statuses, timeout=10)
        assert statuses[0].detail in out.stdout

        # the same verb with only the read-only seed: no operator identity, the server refuses the CLI
        readonly = tmp_path / "readonly-creds"
        readonly.mkdir()
        shutil.copy(creds.seed(permissions.READ_ONLY), readonly / creds.seed(permissions.READ_ONLY).name)
        env["AGMARL_NATS_CREDS_DIR"] = str(readonly)
        refused = subprocess.run([*AGMARL, "retrain", "--reason", "no operator"], env=env, capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode != 0
        assert "refused" in refused.stderr, refused.stdout + refused.stderr
        assert not [s for s in statuses if "no operator" in s.detail]
    finally:
        await bus.close()
