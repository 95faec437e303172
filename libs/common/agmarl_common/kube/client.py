"""One Kubernetes client loader for every component that talks to the API (the state-collector's
watch, inference's batch binder and the extender's bind verb), so that they all honour the same
setting (``KubeSettings.kubeconfig`` / ``kube_context``, i.e. ``AGMARL_KUBECONFIG`` / ``AGMARL_KUBE_CONTEXT``).

Where the credentials come from, first match wins:
1. the ``kubeconfig`` setting (a path; like ``$KUBECONFIG`` it may list several, ``os.pathsep``-separated);
2. ``$KUBECONFIG``;
3. the in-cluster service account, when running in a pod (``$KUBERNETES_SERVICE_HOST`` is set);
4. ``~/.kube/config``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"

Origin = Literal["setting", "env", "in-cluster", "default", "none"]


def resolve(kubeconfig: str = "", environ: Mapping[str, str] | None = None) -> tuple[Origin, str]:
    """Where a client would load its credentials from: (origin, kubeconfig path or "")."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return "setting", kubeconfig
    if env.get("KUBECONFIG"):
        return "env", env["KUBECONFIG"]
    if env.get(SERVICE_HOST_ENV):
        return "in-cluster", ""
    default = Path(env.get("HOME", "~"), ".kube", "config")  # ~/.kube/config of ``environ``'s home
    if default.is_file():
        return "default", str(default)
    return "none", ""


def load_api_client(kubeconfig: str = "", context: str = "", environ: Mapping[str, str] | None = None) -> Any:
    """A ``kubernetes.client.ApiClient`` from the first source in the module docstring's order.
    Raises ``kubernetes.config.ConfigException`` when none of them holds usable credentials."""
    from kubernetes import client, config  # noqa: PLC0415 - the client is heavy; services without the API skip it

    origin, path = resolve(kubeconfig, environ)
    if origin == "none":
        raise config.ConfigException("no Kubernetes credentials: set AGMARL_KUBECONFIG (or $KUBECONFIG), run in a pod, "
                                     "or create ~/.kube/config")
    cfg = client.Configuration()
    if origin == "in-cluster":
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=path, context=context or None, client_configuration=cfg)
    return client.ApiClient(cfg)
