"""Where `agmarl up` takes its cluster from: the built-in simulator (default) or a real Kubernetes
cluster seen from a workstation (``--source kubernetes``, or ``AGMARL_SOURCE=kubernetes``).

For a real cluster every service gets the settings the deploy files use: the cluster name ``default``
(deploy/k8s/base), ``AGMARL_SOURCE=kubernetes`` for the state-collector, and one kubeconfig
(``AGMARL_KUBECONFIG`` / ``AGMARL_KUBE_CONTEXT``) for every component that talks to the API
(``agmarl_common.kube.client``): the state-collector's watch, inference's batch binder and bind verb.
A flag wins over the same ``AGMARL_*`` variable in the shell, which wins over the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agmarl_common.core.cluster.specs import AGMARL_SCHEDULER
from agmarl_common.kube.client import resolve
from agmarl_common.kube.names import is_dns1123

SIM_CLUSTER = "sim"
KUBE_CLUSTER = "default"  # AGMARL_CLUSTER in deploy/k8s/base/kustomization.yaml


@dataclass(frozen=True)
class UpSource:
    source: str | None = None  # simulator | kubernetes; None = $AGMARL_SOURCE, else simulator
    cluster: str | None = None  # None = $AGMARL_CLUSTER, else "sim" (simulator) or "default" (kubernetes)
    kubeconfig: str | None = None  # None = $AGMARL_KUBECONFIG, else $KUBECONFIG, else ~/.kube/config
    context: str | None = None  # None = $AGMARL_KUBE_CONTEXT, else the kubeconfig's current context
    batch_scheduler: str | None = None  # schedulerName batch mode places; None = $AGMARL_BATCH_SCHEDULER_NAME, else off


def _name(flag: str, value: str) -> str:
    if not is_dns1123(value):  # a DNS-1123 label: safe as a subject token too
        raise SystemExit(f"agmarl: {flag} {value!r}: use 1-63 lowercase letters, digits and '-' (a DNS-1123 label)")
    return value


def source_env(spec: UpSource, environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], str]:
    """(the AGMARL_* environment every service gets, the cluster name). Raises SystemExit with the reason
    when a real cluster is asked for and no kubeconfig is found, or a name is unusable."""
    env_in = os.environ if environ is None else environ
    source = spec.source or env_in.get("AGMARL_SOURCE") or "simulator"
    if source not in ("simulator", "kubernetes"):
        raise SystemExit(f"agmarl: source {source!r}: simulator or kubernetes")
    default_cluster = KUBE_CLUSTER if source == "kubernetes" else SIM_CLUSTER
    cluster = _name("--cluster", spec.cluster or env_in.get("AGMARL_CLUSTER") or default_cluster)
    env = {"AGMARL_CLUSTER": cluster, "AGMARL_SOURCE": source}
    if source != "kubernetes":
        if spec.kubeconfig or spec.context or spec.batch_scheduler:
            raise SystemExit("agmarl: --kubeconfig, --context and --batch-scheduler need --source kubernetes")
        return env, cluster
    origin, path = resolve(spec.kubeconfig or env_in.get("AGMARL_KUBECONFIG", ""), env_in)
    if origin == "none":
        raise SystemExit("agmarl: --source kubernetes: no kubeconfig (give --kubeconfig, set KUBECONFIG, "
                         "or create ~/.kube/config)")
    if path:  # one kubeconfig for every service, whatever each process's $KUBECONFIG says
        files = [Path(p).expanduser().resolve() for p in path.split(os.pathsep) if p]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise SystemExit(f"agmarl: kubeconfig not found: {', '.join(missing)}")
        env["AGMARL_KUBECONFIG"] = os.pathsep.join(str(f) for f in files)
    context = spec.context or env_in.get("AGMARL_KUBE_CONTEXT", "")
    if context:
        env["AGMARL_KUBE_CONTEXT"] = context
    batch = spec.batch_scheduler or env_in.get("AGMARL_BATCH_SCHEDULER_NAME", "")
    if batch:
        if _name("--batch-scheduler", batch) == AGMARL_SCHEDULER:
            raise SystemExit(f"agmarl: --batch-scheduler {batch!r}: that is kube-scheduler's with the extender "
                             "(deploy/k8s); name the batch scheduler differently, e.g. agmarl-batch-scheduler")
        env["AGMARL_BATCH_SCHEDULER_NAME"] = batch
    return env, cluster
