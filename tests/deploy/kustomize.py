"""Helpers of the Kubernetes manifest tests: build an overlay with `kubectl kustomize` (cached) and
read the rendered objects (workloads, RBAC rules and bindings, the scheduler configuration)."""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
OVERLAYS = {"shadow": "shadow", "hybrid": "hybrid", "canary": "canary", "full": "full", "batch": "full"}
EXTENDER_OVERLAYS = ["shadow", "hybrid", "canary", "full"]
NAMESPACE = "agmarl"
# kube-scheduler: plugin scores are 0..MaxNodeScore, extender scores 0..MaxExtenderPriority and are
# multiplied by weight * MaxNodeScore / MaxExtenderPriority before being added.
MAX_NODE_SCORE, MAX_EXTENDER_PRIORITY = 100, 10
EXTENDER_KEYS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
                 "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"}
SCHEDULER_CONFIG_KEYS = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
                         "healthzBindAddress", "metricsBindAddress", "enableProfiling", "enableContentionProfiling",
                         "percentageOfNodesToScore", "podInitialBackoffSeconds", "podMaxBackoffSeconds",
                         "profiles", "extenders", "delayCacheUntilActive"}
NATS_BIN = ROOT / ".venv/bin/nats-server"


def kubectl() -> str:
    path = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if not path:
        pytest.fail("kubectl not found: install it (see docs/deploy.md, deploy/tools/install-kubectl.sh)")
    return path


@functools.lru_cache(maxsize=None)
def build(path: str) -> tuple[dict, ...]:
    proc = subprocess.run([kubectl(), "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def objects(overlay: str, kind: str | None = None) -> list[dict]:
    return [o for o in build(f"overlays/{overlay}") if kind is None or o["kind"] == kind]


def one(overlay: str, kind: str, name: str) -> dict:
    found = [o for o in objects(overlay, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{overlay}: {kind}/{name}: found {len(found)}"
    return found[0]


def configmap(overlay: str, name: str) -> dict:
    """The generated ConfigMap whose name is ``name`` plus kustomize's hash suffix."""
    found = [o for o in objects(overlay, "ConfigMap") if re.fullmatch(rf"{name}-[a-z0-9]{{10}}", o["metadata"]["name"])]
    assert len(found) == 1, f"{overlay}: ConfigMap {name}-<hash>: found {len(found)}"
    return found[0]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def workloads(overlay: str) -> list[dict]:
    return [o for o in objects(overlay) if o["kind"] in ("Deployment", "StatefulSet")]


def rules_of(overlay: str, kind: str, name: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples a Role/ClusterRole grants."""
    out = set()
    for rule in one(overlay, kind, name)["rules"]:
        assert not rule.get("resourceNames")
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def bound_roles(overlay: str, service_account: str) -> set[tuple[str, str]]:
    """(roleRef kind, roleRef name) bound to ServiceAccount agmarl/<service_account>."""
    out = set()
    for b in objects(overlay):
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for s in b.get("subjects", []):
                if s["kind"] == "ServiceAccount" and s["name"] == service_account and s.get("namespace") == NAMESPACE:
                    out.add((b["roleRef"]["kind"], b["roleRef"]["name"]))
    return out


def scheduler_config(overlay: str) -> dict:
    """The KubeSchedulerConfiguration the agmarl-scheduler Deployment reads (--config)."""
    dep = one(overlay, "Deployment", "agmarl-scheduler")
    container = pod_spec(dep)["containers"][0]
    (config_path,) = [a.split("=", 1)[1] for a in container["command"] if a.startswith("--config=")]
    mount = next(m for m in container["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod_spec(dep)["volumes"] if v["name"] == mount["name"])
    cm = one(overlay, "ConfigMap", volume["configMap"]["name"])
    return yaml.safe_load(cm["data"][config_path[len(mount["mountPath"]) + 1:]])


def parse_duration(text: str) -> float:
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"bad duration {text!r}"
    return sum(float(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for n, u in parts)
