"""The kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``) as kube-scheduler
v1.36 sends and accepts it (recorded in /work/shared/k8s/): capitalised Go field names, scores 0..10.
Keys are matched case-insensitively on input, as Go's encoding/json does; unknown keys are ignored.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_EXTENDER_SCORE = 10  # kube-scheduler's MaxExtenderPriority
NEUTRAL_SCORE = 0


class _GoArgs(BaseModel):
    """Input model: unknown keys ignored, keys matched case-insensitively (Go encoding/json)."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _fold_case(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        names = {n.lower(): n for n in cls.model_fields}
        return {names.get(str(k).lower(), k): v for k, v in data.items()}


class NodeList(BaseModel):
    model_config = ConfigDict(extra="allow")
    metadata: dict[str, Any] = {}
    items: list[dict[str, Any]] = []


class ExtenderArgs(_GoArgs):
    Pod: dict[str, Any]
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(BaseModel):
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = {}
    FailedAndUnresolvableNodes: dict[str, str] = {}
    Error: str = ""


class HostPriority(BaseModel):
    Host: str
    Score: int = Field(ge=0, le=MAX_EXTENDER_SCORE)


class ExtenderBindingArgs(_GoArgs):
    PodName: str
    PodNamespace: str
    PodUID: str = ""
    Node: str


class ExtenderBindingResult(BaseModel):
    Error: str = ""


class MetaPod(_GoArgs):
    UID: str


class MetaVictims(_GoArgs):
    Pods: list[MetaPod] = []
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(_GoArgs):
    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Any] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = None


class ExtenderPreemptionResult(BaseModel):
    NodeNameToMetaVictims: dict[str, MetaVictims] = {}


class BadRequest(Exception):
    """A well-formed JSON body that does not describe a pod/node we can read (answered 400)."""


def request_names(args: ExtenderArgs) -> list[str]:
    """The node names of a request, in request order (from the NodeList or NodeNames)."""
    if args.Nodes is not None:
        return [str((o.get("metadata") or {}).get("name", "")) for o in args.Nodes.items]
    return list(args.NodeNames or [])


def priorities_json(scores: dict[str, int]) -> bytes:
    """A HostPriorityList, written directly: no per-host objects (1,500 of them per call otherwise)."""
    dumps = json.dumps
    return ("[" + ",".join(f'{{"Host":{dumps(h)},"Score":{int(s)}}}' for h, s in scores.items()) + "]").encode()
