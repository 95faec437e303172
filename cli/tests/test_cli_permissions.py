"""The CLI's operator and read-only NATS identities on a real nats-server with generated credentials: the
operator may switch the policy, the read-only identity may tail the decision log but neither publish a
policy nor purge the stream (docs/security.md)."""
from __future__ import annotations

import asyncio

import pytest
from nats.errors import TimeoutError as NatsTimeout

from agmarl_cli import commands, policy
from agmarl_common.runtime import messages as m
from agmarl_common.runtime import permissions, subjects
from agmarl_common.runtime.bus import Bus


from agmarl_testing.secure_nats import Watched, auth, secure_server


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A real nats-server that knows only the generated identities."""
    yield from secure_server(tmp_path_factory)


async def test_operator_identity_can_policy_set_and_the_read_only_one_cannot(secure, monkeypatch, capsys):
    server, creds = secure
    monkeypatch.setenv("AGMARL_NATS_CREDS_DIR", str(creds.directory))
    assert await policy.policy_set("kube-resources", "full", "operator test", nats_url=server.url) == 0
    assert await policy.policy_show(nats_url=server.url) == 0
    assert "policy=kube-resources" in capsys.readouterr().out
    reader = await Watched().connect(server.url, auth(creds, permissions.READ_ONLY))
    try:
        await reader.nc.publish(subjects.policy_selection(), b"x")
        await asyncio.wait_for(reader.error.wait(), 5.0)
        assert "permissions violation" in reader.errors[0].lower()
    finally:
        await reader.nc.close()


async def test_read_only_cli_tails_the_decision_log_and_cannot_purge_it(secure, monkeypatch, capsys):
    server, creds = secure
    monkeypatch.setenv("AGMARL_NATS_CREDS_DIR", str(creds.directory))
    monkeypatch.setenv("NATS_URL", server.url)
    inference = await Bus.connect(server.url, "inference", auth=auth(creds, "inference"))
    reader = await Watched().connect(server.url, auth(creds, permissions.READ_ONLY))
    try:
        await inference.ensure_streams()
        d = m.Decision(decision_id="tail-1", cluster="tail", namespace="ns", pod_key="ns/p", node="n1",
                       policy="kube-default", mode="full", seen_at=1.0, decided_at=2.0)
        await inference.js_publish(subjects.decision("tail", "ns"), d, msg_id=d.decision_id)
        assert await commands.decisions_tail(None, "tail", last=5, follow_seconds=0) == 0
        assert "ns/p" in capsys.readouterr().out
        js = reader.nc.jetstream(timeout=1.0)
        with pytest.raises(NatsTimeout):  # the attack of issue 14: an anonymous purge of DECISIONS
            await js.purge_stream(subjects.DECISIONS.name)
        await asyncio.wait_for(reader.error.wait(), 5.0)
        assert (await js.stream_info(subjects.DECISIONS.name)).state.messages >= 1
    finally:
        await reader.nc.close()
        await inference.close()
