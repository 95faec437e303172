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
from pydantic import BaseModel, ConfigDict

from .messages import MAX_MESSAGE_BYTES

S = TypeVar("S", bound=BaseModel)


class CommonSettings(BaseModel):
    """What every service needs; a service subclasses this and adds its own fields."""

    model_config = ConfigDict(extra="forbid")

    nats_url: str = "nats://127.0.0.1:4222"
    cluster: str = "sim"
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    trace_dir: str | None = None
    max_message_bytes: int = MAX_MESSAGE_BYTES
    log_level: str = "INFO"
    parent_pid: int = 0  # when set (by `agmarl up`), the service stops itself if that process goes away
    # NATS identity (docs/security.md): this service's nkey seed file, written by `agmarl up` or
    # `agmarl nats-creds`, mounted from a Secret in Kubernetes; None = connect anonymously
    nats_nkey_seed_file: str | None = None
    nats_tls_ca_file: str | None = None  # CA that signed the server's certificate (TLS on when set)
    nats_tls_cert_file: str | None = None  # client certificate and key, for a server that verifies clients
    nats_tls_key_file: str | None = None


class ModelInputSettings(CommonSettings):
    """What a service that builds the learned policy's inputs needs (inference serves them, the trainer
    turns recorded decisions into training graphs): the objective the models optimise (``features.OBJECTIVES``:
    the composite reward, or GPU allocation, the openb inflation protocol's measure; ``AGMARL_OBJECTIVE``) and
    the composite reward's weighting scheme that weights ``reward_gain`` (``AGMARL_SCHEME``, the variable the
    reward-calculator reads: one setting for all three)."""

    objective: Literal["composite", "allocation"] = "composite"
    scheme: Literal["fixed", "load_conditional", "lexicographic"] = "fixed"


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
