"""JSON builders of the stand-in Kubernetes API server (``agmarl_testing.k8s_api``), for tests.

v1.Node, v1.Pod and v1.Status objects as the API serves them, the request record, and two small
helpers the server and its HTTP handler share. Re-exported by ``agmarl_testing.k8s_api``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KINDS = {"nodes": "Node", "pods": "Pod"}


@dataclass(frozen=True)
class Request:
    at: float  # time.monotonic()
    method: str
    path: str
    query: Mapping[str, str]


def node_json(name: str, cpu: str = "4", memory: str = "8Gi", gpus: int = 0, labels: Mapping[str, str] | None = None,
              taints: list[dict] | None = None, ready: bool = True, pods: str = "110") -> dict:
    """A v1.Node as the API serves it (allocatable and capacity alike)."""
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": list(taints or [])},
            "status": {"allocatable": dict(alloc), "capacity": dict(alloc),
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod_json(name: str, namespace: str = "default", cpu: str = "500m", memory: str = "512Mi", gpus: int = 0,
             scheduler_name: str = "default-scheduler", node_name: str = "", phase: str = "Pending",
             labels: Mapping[str, str] | None = None, node_selector: Mapping[str, str] | None = None) -> dict:
    """A v1.Pod with one container requesting ``cpu`` / ``memory`` (/ ``gpus``)."""
    requests = {"cpu": cpu, "memory": memory}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {"schedulerName": scheduler_name,
                            "containers": [{"name": "main", "image": "busybox",
                                            "resources": {"requests": requests,
                                                          "limits": {"nvidia.com/gpu": str(gpus)} if gpus else {}}}]}
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "labels": dict(labels or {}), "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": spec, "status": {"phase": phase}}


def status_json(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure" if code >= 400 else "Success",
            "message": message, "reason": reason, "code": code}


def _key(obj: dict) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


def _truthy(value: str | None) -> bool:
    return str(value).lower() in ("true", "1")
