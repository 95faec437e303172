"""A real nats-server that knows only the project's generated NATS identities, and a raw client that collects
the server's asynchronous errors (permission violations): for the permission tests of the library and the CLI."""
from __future__ import annotations

import asyncio

import nats

from agmarl_common.runtime.natsauth import NatsAuth, ensure_credentials
from agmarl_common.runtime.natsserver import NatsServer


def secure_server(tmp_path_factory):
    """Generator for a module-scoped fixture: (a real nats-server that knows only the generated identities,
    their credentials)."""
    creds = ensure_credentials(tmp_path_factory.mktemp("creds"))
    server = NatsServer(store_dir=tmp_path_factory.mktemp("store"), auth_config=creds.auth_config)
    server.start()
    try:
        yield server, creds
    finally:
        server.cleanup()


def auth(creds, identity: str) -> NatsAuth:
    return NatsAuth(seed_file=str(creds.seed(identity)), identity=identity)


class Watched:
    """A raw nats-py connection whose asynchronous server errors are collected (permission violations)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.error = asyncio.Event()
        self.nc = None

    async def connect(self, url: str, a: NatsAuth) -> "Watched":
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))
            self.error.set()
        self.nc = await nats.connect(url, error_cb=on_error, allow_reconnect=False, **a.connect_options())
        return self
