"""`agmarl nats-creds`: make, rotate and export the NATS identities (docs/security.md).

- ``agmarl nats-creds [--dir DIR]``: an nkey seed per identity (every service, ``cli``, ``operator``;
  existing ones kept) and the server's ``auth.conf`` with the permissions generated from the subject
  catalogue; prints each identity's public key. DIR defaults to $AGMARL_NATS_CREDS_DIR, else
  <state>/nats-creds (what `agmarl up` uses).
- ``--rotate NAME``: a new seed for NAME (repeatable); reload the server, restart that service.
  ``--rotate routes``: a new password for the NATS cluster's routes (``route.password``).
- ``--container-readable``: seeds 0644 inside the 0700 directory, so a container running as another
  user can read its bind-mounted seed (docker-compose); host users other than the owner still cannot.
- ``--k8s [--namespace NS]``: print Kubernetes Secrets instead (``agmarl-nats-auth`` with auth.conf for
  the server, ``agmarl-nats-routes`` with routes.conf (the route user, password and URLs of the three-server
  NATS cluster of deploy/k8s), ``agmarl-nats-<service>`` with ``seed.nk`` for each service), for
  ``| kubectl apply -f -``. The cli/operator seeds stay in DIR, with the operator.
"""

from __future__ import annotations

import base64
import json
import os
import sys

import yaml

from agmarl_cli.supervisor import creds_dir
from agmarl_common.runtime import permissions
from agmarl_common.runtime.natsauth import (AUTH_CONFIG, ROUTE_PASSWORD_FILE, ROUTES_CONFIG, Credentials,
                                             ensure_credentials, ensure_route_password, route_config)

SEED_KEY = "seed.nk"
ROUTES = "routes"  # --rotate routes: the cluster's route password, not an identity
NATS_SERVERS = 3  # the StatefulSet nats of deploy/k8s/base/nats.yaml
ROUTE_PORT = 6222


def k8s_route_hosts(namespace: str, servers: int = NATS_SERVERS) -> list[str]:
    """The route address of each server of the StatefulSet ``nats`` (headless Service ``nats-headless``)."""
    return [f"nats-{i}.nats-headless.{namespace}.svc:{ROUTE_PORT}" for i in range(servers)]


def secret(name: str, namespace: str, files: dict[str, bytes]) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "agmarl-dks"}},
            "data": {k: base64.b64encode(v).decode() for k, v in files.items()}}


def k8s_secrets(creds: Credentials, namespace: str, route_password: str) -> list[dict]:
    """The server's user list, the cluster's route credentials and one seed Secret per service (names the
    deploy/k8s manifests mount)."""
    out = [secret("agmarl-nats-auth", namespace, {AUTH_CONFIG: creds.auth_config.read_bytes()}),
           secret("agmarl-nats-routes", namespace,
                  {ROUTES_CONFIG: route_config(route_password, k8s_route_hosts(namespace)).encode()})]
    for service in permissions.services():
        out.append(secret(f"agmarl-nats-{service}", namespace, {SEED_KEY: creds.seed(service).read_bytes()}))
    return out


def nats_creds(directory: str | None, rotate: list[str], k8s: bool, namespace: str,
               container_readable: bool = False) -> int:
    root = directory or str(creds_dir())
    try:
        creds = ensure_credentials(root, rotate=[r for r in rotate if r != ROUTES])
        route_password = ensure_route_password(root, rotate=ROUTES in rotate)
    except KeyError as err:
        print(f"agmarl nats-creds: {err.args[0]}", file=sys.stderr)
        return 2
    if container_readable:
        for identity in creds.keys:
            os.chmod(creds.seed(identity), 0o644)
    if k8s:
        sys.stdout.write(yaml.safe_dump_all(k8s_secrets(creds, namespace, route_password), sort_keys=False))
        return 0
    print(json.dumps({"directory": str(creds.directory), "auth_config": str(creds.auth_config),
                      "route_password_file": str(creds.directory / ROUTE_PASSWORD_FILE),
                      "rotated": sorted(rotate), "public_keys": creds.keys}, indent=2))
    return 0
