"""The decision log is a JetStream stream with file storage: it survives a NATS restart, and
`agmarl decisions tail` reads it back (filtered by namespace)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.natsserver import NatsServer


def decision(i: int, ns: str) -> m.Decision:
    now = time.time()
    return m.Decision(decision_id=f"d{i}", cluster="logtest", namespace=ns, pod_key=f"{ns}/pod-{i}",
                      node=f"node-{i % 3}", gpus=[], policy="kube-resources", model_version="", mode="full",
                      score=50.0 + i, scores={}, model_scores={}, default_scores={}, explanation={},
                      trace_id=f"{i:032x}", seen_at=now, decided_at=now, source="loop")


@pytest.mark.asyncio
async def test_decisions_survive_nats_restart_and_tail_filters_namespace(tmp_path):
    server = NatsServer(store_dir=str(tmp_path / "store"))
    server.start()
    try:
        bus = await Bus.connect(server.url, name="test-log")
        await bus.ensure_streams()
        for i in range(6):
            ns = "team-a" if i % 2 == 0 else "team-b"
            await bus.js_publish(subjects.decision("logtest", ns), decision(i, ns), msg_id=f"d{i}")
        await bus.close()

        server.restart()

        env = dict(os.environ, NATS_URL=server.url)
        out = subprocess.run([sys.executable, "-m", "agmarl_cli.main", "decisions", "tail", "--cluster", "logtest",
                              "--namespace", "team-a", "--follow", "0"], env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
        assert [ln.split()[1] for ln in lines] == ["team-a/pod-0", "team-a/pod-2", "team-a/pod-4"]
        assert all("policy=kube-resources" in ln and "trace=" in ln for ln in lines)
    finally:
        server.cleanup()
