"""Typed settings: defaults < YAML file < environment.

``load_settings(MySettings)`` reads the YAML file named by the argument or ``AGMARL_CONFIG``, then
applies ``AGMARL_<FIELD>`` environment variables (``__`` separates nested fields, e.g.
``AGMARL_INFERENCE__BLEND_WEIGHT=0.7``); pydantic coerces the strings. Values for list/dict/model
fields may be given as JSON. ``NATS_URL`` is honoured for ``nats_url`` below ``AGMARL_NATS_URL``.
"""
from __future__ import annotations

import json
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, field_validator

from agmarl_common.core.cluster.specs import AGMARL_SCHEDULER
from agmarl_common.runtime.messages import MAX_MESSAGE_BYTES

S = TypeVar("S", bound=BaseModel)

# Closed choices, one type each wherever a setting takes them (``docs/configuration.md`` lists the values).
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
Objective = Literal["composite", "allocation"]  # = features.OBJECTIVES
Scheme = Literal["fixed", "load_conditional", "lexicographic"]  # = reward.SCHEMES
RolloutMode = Literal["shadow", "recommend", "canary", "hybrid", "full"]
Source = Literal["simulator", "kubernetes"]


class CommonSettings(BaseModel):
    """What every service needs; a service subclasses this and adds its own fields."""

    model_config = ConfigDict(extra="forbid")

    nats_url: str = "nats://127.0.0.1:4222"  # the NATS server (JetStream on)
    cluster: str = "sim"  # the cluster's name in every subject; the deploy files use "default"
    metrics_host: str = "127.0.0.1"  # Prometheus /metrics listen address
    metrics_port: int = 0  # Prometheus /metrics port; 0 = any free port (`agmarl up` picks one per service)
    trace_dir: str | None = None  # also write finished spans as JSON lines here (`agmarl trace` reads them)
    max_message_bytes: int = MAX_MESSAGE_BYTES  # largest message decoded; snapshots above it are sent in chunks
    log_level: LogLevel = "INFO"  # level of the agmarl loggers (case-insensitive)
    parent_pid: int = 0  # when set (by `agmarl up`), the service stops itself if that process goes away
    # NATS identity (docs/security.md): this service's nkey seed file, written by `agmarl up` or
    # `agmarl nats-creds`, mounted from a Secret in Kubernetes; None = connect anonymously
    nats_nkey_seed_file: str | None = None
    nats_tls_ca_file: str | None = None  # CA that signed the server's certificate (TLS on when set)
    nats_tls_cert_file: str | None = None  # client certificate and key, for a server that verifies clients
    nats_tls_key_file: str | None = None  # the client certificate's private key (PEM)
    nats_grace_seconds: float = 30.0  # NATS unreachable longer than this fails /healthz (Kubernetes restarts it)
    handler_stuck_seconds: float = 60.0  # a handler (or the event loop) stuck longer than this fails /healthz
    stream_replicas: int = 0  # replicas of the JetStream streams a service creates (3 on deploy/k8s's NATS cluster); 0 = 1

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_log_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class ModelInputSettings(CommonSettings):
    """What a service that builds the learned policy's inputs needs (inference serves them, the trainer
    turns recorded decisions into training graphs): the objective the models optimise (``features.OBJECTIVES``:
    the composite reward, or GPU allocation, the openb inflation protocol's measure; ``AGMARL_OBJECTIVE``) and
    the composite reward's weighting scheme that weights ``reward_gain`` (``AGMARL_SCHEME``, the variable the
    reward-calculator reads: one setting for all three)."""

    objective: Objective = "composite"  # what the model optimises: composite reward or GPU allocation
    scheme: Scheme = "fixed"  # the composite reward's weighting scheme (the reward-calculator's too)


class KubeSettings(BaseModel):
    """What a service that talks to the Kubernetes API needs: the state-collector's watch, and inference's
    batch binder and bind verb. One kubeconfig story (``kubeclient.load_api_client``): ``kubeconfig``, else
    ``$KUBECONFIG``, else the in-cluster service account, else ``~/.kube/config``. One batch scheduler: pods whose
    ``schedulerName`` is ``batch_scheduler_name`` are announced on the bus by the state-collector and placed by
    inference's batch mode; pods of any other scheduler (``agmarl-scheduler``, kube-scheduler with the extender)
    never reach the NATS loop. A mixin: a service settings class lists it after ``CommonSettings``."""

    kubeconfig: str = ""  # kubeconfig path; "" = $KUBECONFIG, else in-cluster, else ~/.kube/config
    kube_context: str = ""  # kubeconfig context; "" = the current one
    batch_scheduler_name: str = ""  # the batch scheduler's schedulerName (e.g. agmarl-batch-scheduler); "" = off

    @field_validator("batch_scheduler_name")
    @classmethod
    def _not_the_extender_profile(cls, value: str) -> str:
        if value == AGMARL_SCHEDULER:
            raise ValueError(f"{AGMARL_SCHEDULER!r} is the schedulerName of kube-scheduler with the extender "
                             "(deploy/k8s overlays): its pods are decided by kube-scheduler; name the batch "
                             "scheduler differently (e.g. agmarl-batch-scheduler)")
        return value


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _is_plain_str(annotation: Any) -> bool:
    if annotation is str:
        return True
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return False
    return all(a is str or a is type(None) for a in typing.get_args(annotation))


def _field_type(cls: type[BaseModel], path: list[str]) -> Any:
    """Annotation at ``path`` inside ``cls`` (None when the path leaves known models)."""
    current: Any = cls
    annotation: Any = None
    for name in path:
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or name not in current.model_fields:
            return None
        annotation = current.model_fields[name].annotation
        models = [a for a in (annotation, *typing.get_args(annotation))
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        current = models[0] if models else annotation
    return annotation


def _env_value(raw: str, annotation: Any) -> Any:
    if _is_plain_str(annotation):
        return raw
    text = raw.strip()
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return raw
    return raw


def _nest(path: list[str], value: Any) -> dict[str, Any]:
    out: Any = value
    for name in reversed(path):
        out = {name: out}
    return out


def env_overrides(cls: type[BaseModel], environ: Mapping[str, str], env_prefix: str = "AGMARL_") -> dict[str, Any]:
    """The nested dict of overrides that ``environ`` holds for ``cls`` (unknown names ignored)."""
    data: dict[str, Any] = {}
    if "nats_url" in cls.model_fields and environ.get("NATS_URL"):
        data["nats_url"] = environ["NATS_URL"]
    for key in sorted(environ):
        if not key.upper().startswith(env_prefix.upper()):
            continue
        path = [part.lower() for part in key[len(env_prefix):].split("__") if part]
        if not path:
            continue
        annotation = _field_type(cls, path)
        if annotation is None:
            continue
        data = _deep_merge(data, _nest(path, _env_value(environ[key], annotation)))
    return data


def load_settings(cls: type[S], yaml_path: str | None = None, env_prefix: str = "AGMARL_",
                  environ: Mapping[str, str] | None = None) -> S:
    """Build ``cls`` from defaults < YAML (``yaml_path`` or ``<prefix>CONFIG``) < environment."""
    env = os.environ if environ is None else environ
    path = yaml_path or env.get(f"{env_prefix}CONFIG")
    data: dict[str, Any] = {}
    if path:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, Mapping):
            raise ValueError(f"settings file {path}: expected a mapping at the top level")
        data = dict(loaded)
    data = _deep_merge(data, env_overrides(cls, env, env_prefix))
    return cls.model_validate(data)
