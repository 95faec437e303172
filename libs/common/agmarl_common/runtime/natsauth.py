"""NATS identities on disk: nkey seeds per identity, the server's ``authorization`` block, TLS options.

    creds = ensure_credentials(state / "nats-creds")   # <identity>.nk (0600) for every identity + auth.conf
    NatsServer(auth_config=creds.auth_config)          # the server knows the public keys only
    Bus.connect(url, "inference", auth=NatsAuth(seed_file=creds.seed("inference"), identity="inference"))

A seed (``S...``) is the identity's private key and never leaves its owner; the server's configuration
holds the public keys (``U...``) with the permissions ``permissions.permissions_for`` generates from
the subject catalogue. Rotation: ``ensure_credentials(dir, rotate=["inference"])`` writes a new seed
and a new ``auth.conf``; reload the server (SIGHUP) and restart the service, the old key is refused.

A NATS cluster's routes (deploy/k8s: three servers) have their own credentials, no service's: a random route
password (``route.password`` in the same directory, 0600, kept until rotated) and the ``routes.conf`` the
servers include in their ``cluster`` block (``route_config``: the route user and password every server
demands, and the route URLs carrying them).
"""
from __future__ import annotations

import json
import os
import secrets
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agmarl_common.runtime import permissions, subjects

SEED_SUFFIX = ".nk"
AUTH_CONFIG = "auth.conf"
ROUTES_CONFIG = "routes.conf"  # included in the server's cluster block (deploy/nats/nats-cluster.conf)
ROUTE_PASSWORD_FILE = "route.password"
ROUTE_USER = "agmarl-route"
_USER_PREFIX = 20 << 3  # nkeys.PREFIX_BYTE_USER: public keys start with "U", seeds with "SU"


@dataclass(frozen=True)
class NatsAuth:
    """How one connection proves who it is: an nkey seed file (its identity names the reply inbox) and
    optional TLS files (CA to verify the server; client cert and key for mutual TLS)."""

    seed_file: str | None = None
    identity: str = ""
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @classmethod
    def from_settings(cls, settings: Any, identity: str) -> "NatsAuth":
        return cls(seed_file=getattr(settings, "nats_nkey_seed_file", None) or None, identity=identity,
                   tls_ca_file=getattr(settings, "nats_tls_ca_file", None) or None,
                   tls_cert_file=getattr(settings, "nats_tls_cert_file", None) or None,
                   tls_key_file=getattr(settings, "nats_tls_key_file", None) or None)

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.aio.client.Client.connect``."""
        opts: dict[str, Any] = {}
        if self.seed_file:
            if not Path(self.seed_file).is_file():
                raise FileNotFoundError(f"NATS nkey seed file {self.seed_file} not found")
            opts["nkeys_seed"] = self.seed_file
            if self.identity:
                opts["inbox_prefix"] = permissions.inbox_prefix(self.identity)
        if self.tls_ca_file or self.tls_cert_file:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca_file)
            if self.tls_cert_file:
                ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
            opts["tls"] = ctx
        return opts


def new_seed() -> bytes:
    """A fresh user nkey seed (``SU...``)."""
    import nkeys  # noqa: PLC0415 - only key generation and nats-py's signing need it

    return nkeys.encode_seed(os.urandom(32), _USER_PREFIX)


def public_key(seed: bytes | str) -> str:
    """The ``U...`` public key of a seed."""
    import nkeys  # noqa: PLC0415

    kp = nkeys.from_seed(bytearray(seed.encode() if isinstance(seed, str) else seed))
    try:
        return kp.public_key.decode()
    finally:
        kp.wipe()


def _write_private(path: Path, data: bytes) -> None:
    """Create or replace ``path`` readable by its owner only (0600 from the first byte)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def server_authorization(keys: dict[str, str], catalogue=subjects.CATALOGUE) -> dict[str, Any]:
    """The server's ``authorization`` block: one nkey user per identity with its generated permissions.
    Nobody else gets in (no anonymous user)."""
    users = [{"nkey": key, "permissions": permissions.permissions_for(identity, catalogue).to_config()}
             for identity, key in sorted(keys.items())]
    return {"authorization": {"users": users, "timeout": 5}}


def render_config(block: dict[str, Any]) -> str:
    """NATS configuration text (the server's parser reads JSON maps; quoted ``$JS...`` is no variable)."""
    return "\n".join(f"{key}: {json.dumps(value, indent=2)}" for key, value in block.items()) + "\n"


@dataclass(frozen=True)
class Credentials:
    """A credentials directory: ``<identity>.nk`` seeds and the server's ``auth.conf``."""

    directory: Path
    keys: dict[str, str]  # identity -> public key

    def seed(self, identity: str) -> Path:
        return seed_path(self.directory, identity)

    @property
    def auth_config(self) -> Path:
        return self.directory / AUTH_CONFIG


def seed_path(directory: str | Path, identity: str) -> Path:
    return Path(directory) / f"{subjects.token(identity)}{SEED_SUFFIX}"


def ensure_credentials(directory: str | Path, identities: Iterable[str] | None = None,
                       rotate: Iterable[str] = (), catalogue=subjects.CATALOGUE) -> Credentials:
    """Seeds for every identity (existing ones kept, ``rotate`` ones replaced) and a fresh ``auth.conf``
    whose permissions come from the current catalogue. Files are 0600, the directory 0700."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    wanted = list(identities) if identities is not None else permissions.identities(catalogue)
    replace = set(rotate)
    unknown = replace - set(wanted)
    if unknown:
        raise KeyError(f"cannot rotate unknown identities {sorted(unknown)}")
    keys = {}
    for identity in wanted:
        path = seed_path(root, identity)
        if identity in replace or not path.is_file():
            _write_private(path, new_seed() + b"\n")
        keys[identity] = public_key(path.read_bytes().strip())
    _write_private(root / AUTH_CONFIG, render_config(server_authorization(keys, catalogue)).encode())
    return Credentials(root, keys)


def ensure_route_password(directory: str | Path, rotate: bool = False) -> str:
    """The NATS cluster's route password (64 hex digits, safe in a URL), made once in ``directory``
    (``route.password``, 0600) and kept; ``rotate`` replaces it."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    path = root / ROUTE_PASSWORD_FILE
    if rotate or not path.is_file():
        _write_private(path, secrets.token_hex(32).encode() + b"\n")
    return path.read_text(encoding="ascii").strip()


def route_config(password: str, hosts: Iterable[str], user: str = ROUTE_USER, timeout: float = 5.0) -> str:
    """``routes.conf`` for a server's ``cluster`` block: the route user every server demands of the others,
    and the routes (``host:port``) it connects to with that user. It holds the password: a Secret, never the
    repository."""
    if not password or not all(c.isalnum() for c in password):
        raise ValueError("the route password must be non-empty and alphanumeric (it goes into route URLs)")
    routes = [f"nats-route://{user}:{password}@{host}" for host in hosts]
    return ("# the NATS cluster's route credentials (agmarl nats-creds); keep it secret\n"
            + render_config({"authorization": {"user": user, "password": password, "timeout": timeout},
                             "routes": routes}))
