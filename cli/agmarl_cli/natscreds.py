"""`agmarl nats-creds`: make, rotate and export the NATS identities (docs/security.md).

- ``agmarl nats-creds [--dir DIR]``: an nkey seed per identity (every service, ``cli``, ``operator``;
  existing ones kept) and the server's ``auth.conf`` with the permissions generated from the subject
  catalogue; prints each identity's public key. DIR defaults to $AGMARL_NATS_CREDS_DIR, else
  <state>/nats-creds (what `agmarl up` uses).
- ``--rotate NAME``: a new seed for NAME (repeatable); reload the server, restart that service.
- ``--container-readable``: seeds 0644 inside the 0700 directory, so a container running as another
  user can read its bind-mounted seed (docker-compose); host users other than the owner still cannot.
- ``--k8s [--namespace NS]``: print Kubernetes Secrets instead (``agmarl-nats-auth`` with auth.conf for
  the server, ``agmarl-nats-<service>`` with ``seed.nk`` for each service), for ``| kubectl apply -f -``.
  The cli/operator seeds stay in DIR, with the operator.
"""

from __future__ import annotations

import base64
import json
import os
import sys

import yaml

from agmarl_cli.supervisor import creds_dir
from agmarl_common.runtime import permissions
from agmarl_common.runtime.natsauth import AUTH_CONFIG, Credentials, ensure_credentials

SEED_KEY = "seed.nk"


def secret(name: str, namespace: str, files: dict[str, bytes]) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "agmarl-dks"}},
            "data": {k: base64.b64encode(v).decode() for k, v in files.items()}}


def k8s_secrets(creds: Credentials, namespace: str) -> list[dict]:
    """The server's user list and one seed Secret per service (names the deploy/k8s manifests mount)."""
    out = [secret("agmarl-nats-auth", namespace, {AUTH_CONFIG: creds.auth_config.read_bytes()})]
    for service in permissions.services():
        out.append(secret(f"agmarl-nats-{service}", namespace, {SEED_KEY: creds.seed(service).read_bytes()}))
    return out


def nats_creds(directory: str | None, rotate: list[str], k8s: bool, namespace: str,
               container_readable: bool = False) -> int:
    root = directory or str(creds_dir())
    try:
        creds = ensure_credentials(root, rotate=rotate)
    except KeyError as err:
        print(f"agmarl nats-creds: {err.args[0]}", file=sys.stderr)
        return 2
    if container_readable:
        for identity in creds.keys:
            os.chmod(creds.seed(identity), 0o644)
    if k8s:
        sys.stdout.write(yaml.safe_dump_all(k8s_secrets(creds, namespace), sort_keys=False))
        return 0
    print(json.dumps({"directory": str(creds.directory), "auth_config": str(creds.auth_config),
                      "rotated": sorted(rotate), "public_keys": creds.keys}, indent=2))
    return 0
