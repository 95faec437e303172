"""Authenticated, least-privilege NATS on a real nats-server: who gets in, who may publish what."""
from __future__ import annotations

import asyncio
import socket
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from nats.errors import TimeoutError as NatsTimeout

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import permissions, subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.natsauth import NatsAuth, ensure_credentials
from agmarl_common.runtime.natsserver import DEFAULT_MAX_PAYLOAD, NatsServer
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_common.runtime.settings import CommonSettings


from agmarl_testing.secure_nats import Watched, auth, secure_server


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A real nats-server that knows only the generated identities."""
    yield from secure_server(tmp_path_factory)


def test_credentials_are_private_files(secure):
    _, creds = secure
    assert stat.S_IMODE(creds.directory.stat().st_mode) == 0o700
    for identity in permissions.identities():
        path = creds.seed(identity)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text().startswith("SU")
    conf = creds.auth_config.read_text()
    assert stat.S_IMODE(creds.auth_config.stat().st_mode) == 0o600
    for identity in permissions.identities():  # the server holds public keys only
        assert creds.seed(identity).read_text().strip() not in conf
    assert all(key in conf for key in creds.keys.values())


async def test_anonymous_client_is_refused(secure):
    server, _ = secure
    with pytest.raises(ConnectionError, match="refused"):
        await Bus.connect(server.url, "anonymous", connect_wait=5.0)


async def test_unknown_key_is_refused(secure, tmp_path):
    server, _ = secure
    stranger = ensure_credentials(tmp_path / "stranger", identities=["inference"])
    with pytest.raises(ConnectionError, match="refused"):
        await Bus.connect(server.url, "stranger", connect_wait=5.0, auth=auth(stranger, "inference"))


async def test_publish_outside_permissions_is_refused_and_never_delivered(secure):
    server, creds = secure
    reader = await Bus.connect(server.url, "reader", auth=auth(creds, permissions.OPERATOR))
    forger = await Watched().connect(server.url, auth(creds, "graph-builder"))
    producer = await Bus.connect(server.url, "inference", auth=auth(creds, "inference"))
    got: list[bytes] = []
    arrived = asyncio.Event()

    async def on_decision(msg) -> None:
        got.append(msg.data)
        arrived.set()

    try:
        await reader.subscribe(subjects.decision_wildcard("secure"), on_decision)
        await forger.nc.publish(subjects.decision("secure", "default"), b"forged")
        await asyncio.wait_for(forger.error.wait(), 5.0)
        assert "permissions violation" in forger.errors[0].lower()
        assert subjects.decision("secure", "default") in forger.errors[0]
        await producer.publish(subjects.decision("secure", "default"), b"real")
        await asyncio.wait_for(arrived.wait(), 5.0)
        await reader.flush()
        assert got == [b"real"]
    finally:
        await forger.nc.close()
        await producer.close()
        await reader.close()


async def test_a_service_may_not_subscribe_to_what_it_does_not_consume(secure):
    server, creds = secure
    spy = await Watched().connect(server.url, auth(creds, "graph-builder"))
    try:
        await spy.nc.subscribe(subjects.experience("secure"))
        await spy.nc.flush()
        await asyncio.wait_for(spy.error.wait(), 5.0)
        assert "permissions violation for subscription" in spy.errors[0].lower()
    finally:
        await spy.nc.close()


async def test_only_the_catalogue_producer_and_the_operator_write_the_active_policy(secure):
    server, creds = secure
    assert "adaptive-engine" in permissions._producers_of("policy_selection", subjects.CATALOGUE)
    engine = await Bus.connect(server.url, "adaptive-engine", auth=auth(creds, "adaptive-engine"))
    intruder = await Watched().connect(server.url, auth(creds, "inference"))
    try:
        sel = m.PolicySelection(policy="kube-default", mode="full", reason="test", time=1.0)
        await engine.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, sel)
        js = intruder.nc.jetstream(timeout=1.0)
        kv = await js.key_value(subjects.CONFIG_BUCKET)
        with pytest.raises(NatsTimeout):  # the server drops the write: no ack ever comes
            await kv.put(subjects.KEY_ACTIVE_POLICY, m.encode(sel.model_copy(update={"policy": "random"})))
        await asyncio.wait_for(intruder.error.wait(), 5.0)
        assert any("$kv.agmarl_config.active_policy" in e.lower() for e in intruder.errors), intruder.errors
        assert (await kv.get(subjects.KEY_ACTIVE_POLICY)).value == m.encode(sel)  # reading is allowed
    finally:
        await intruder.nc.close()
        await engine.close()


async def test_service_runtime_connects_with_its_identity_and_answers_health(secure):
    server, creds = secure
    settings = CommonSettings(nats_url=server.url, cluster="secure", nats_nkey_seed_file=str(creds.seed("trainer")))
    rt = ServiceRuntime("trainer", settings)
    cli = await Bus.connect(server.url, "cli", auth=auth(creds, permissions.READ_ONLY))
    try:
        await rt.start()
        status = await cli.request(subjects.health("trainer"), b"", m.HealthStatus, timeout=5.0)
        assert status.service == "trainer" and status.status == "healthy"
        replies = await cli.request_many(subjects.health_all(), b"", m.HealthStatus, timeout=1.0)
        assert [r.service for r in replies] == ["trainer"]
    finally:
        await cli.close()
        await rt.shutdown()


async def test_rotated_key_replaces_the_old_one_after_a_reload(tmp_path):
    creds = ensure_credentials(tmp_path / "creds")
    old_seed = creds.seed("reward-calculator").read_bytes()
    old = tmp_path / "old.nk"
    old.write_bytes(old_seed)
    server = NatsServer(store_dir=tmp_path / "store", auth_config=creds.auth_config).start()
    try:
        rotated = ensure_credentials(tmp_path / "creds", rotate=["reward-calculator"])
        assert rotated.seed("reward-calculator").read_bytes() != old_seed
        assert rotated.keys["inference"] == creds.keys["inference"]  # the others keep theirs
        server.reload()
        fresh = await Bus.connect(server.url, "new", auth=auth(rotated, "reward-calculator"), connect_wait=10.0)
        await fresh.close()
        with pytest.raises(ConnectionError, match="refused"):
            await Bus.connect(server.url, "old", auth=NatsAuth(str(old), "reward-calculator"), connect_wait=5.0)
    finally:
        server.cleanup()


def _raw_publish(port: int, subject: str, size: int, send_payload: bool) -> bytes:
    """Speak the NATS protocol by hand (no client-side size check): CONNECT, PUB header announcing ``size``
    bytes, then (``send_payload``) the payload and a PING; returns what the server answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.recv(65536)  # INFO
        sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\n' + f"PUB {subject} {size}\r\n".encode())
        if send_payload:
            sock.sendall(b"x" * size + b"\r\nPING\r\n")
        data = b""
        while b"PONG" not in data and b"-ERR" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


async def test_server_refuses_oversized_messages_before_any_subscriber(tmp_path):
    assert DEFAULT_MAX_PAYLOAD == m.MAX_MESSAGE_BYTES + 16 * 1024
    with NatsServer(store_dir=tmp_path / "store") as server:
        bus = await Bus.connect(server.url, "listener")
        got: list[int] = []
        done = asyncio.Event()

        async def on_msg(msg) -> None:
            got.append(len(msg.data))
            done.set()

        try:
            assert bus.nc.max_payload == DEFAULT_MAX_PAYLOAD
            await bus.subscribe("big.test", on_msg)
            refused = await asyncio.to_thread(_raw_publish, server.port, "big.test", 8 * 1024 * 1024, False)
            assert b"Maximum Payload" in refused
            accepted = await asyncio.to_thread(_raw_publish, server.port, "big.test", m.MAX_MESSAGE_BYTES, True)
            assert b"PONG" in accepted
            await asyncio.wait_for(done.wait(), 5.0)
            assert got == [m.MAX_MESSAGE_BYTES]  # the 8 MiB one never arrived
        finally:
            await bus.close()


def test_security_doc_shows_the_generated_permissions():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "security.md").read_text(encoding="utf-8")
    assert "<!-- permissions:begin" in doc
    assert permissions.render_markdown() in doc, "docs/security.md: run `python tools/gen_proto.py`"


async def test_only_the_producer_updates_a_stream_and_the_others_start_anyway(secure, caplog):
    server, creds = secure
    producer = await Bus.connect(server.url, "reward-calculator", auth=auth(creds, "reward-calculator"))
    other = await Bus.connect(server.url, "inference", auth=auth(creds, "inference"))
    changed = replace(subjects.EXPERIENCE, duplicate_window=subjects.EXPERIENCE.duplicate_window + 60.0)
    try:
        await producer.ensure_stream(subjects.EXPERIENCE)
        await other.ensure_stream(subjects.EXPERIENCE)  # as specified already: no update needed
        info = await other.ensure_stream(changed)  # refused (a timeout), logged, the stream stays as it was
        assert info.config.duplicate_window == subjects.EXPERIENCE.duplicate_window
        assert "may not update it" in caplog.text
        info = await producer.ensure_stream(changed)
        assert info.config.duplicate_window == changed.duplicate_window
    finally:
        await producer.ensure_stream(subjects.EXPERIENCE)
        await other.close()
        await producer.close()


def make_tls(d: Path) -> None:
    """A CA and a certificate for 127.0.0.1 it signed, made by the openssl command line."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
            "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=nats", "-keyout", f"{d}/tls.key", "-out", f"{d}/tls.csr")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", f"{d}/tls.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key", "-CAcreateserial",
            "-days", "1", "-extfile", f"{d}/san.ext", "-out", f"{d}/tls.crt")


async def test_embedded_server_with_tls_and_identities(tmp_path):
    make_tls(tmp_path)
    creds = ensure_credentials(tmp_path / "creds")
    server = NatsServer(store_dir=tmp_path / "store", auth_config=creds.auth_config,
                        tls_cert_file=str(tmp_path / "tls.crt"), tls_key_file=str(tmp_path / "tls.key"))
    with server:
        assert server.url.startswith("tls://")
        a = NatsAuth(seed_file=str(creds.seed("trainer")), identity="trainer", tls_ca_file=str(tmp_path / "ca.crt"))
        bus = await Bus.connect(server.url, "trainer", auth=a)
        try:
            assert bus.nc.connected_url.scheme == "tls"
            await bus.publish(subjects.train_status(), b"")  # its own subject: allowed
            await bus.flush()
        finally:
            await bus.close()
