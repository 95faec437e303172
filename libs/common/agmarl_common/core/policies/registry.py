"""Policy registry: name -> factory(seed) -> Policy.

Built-in kube-scheduler and load-aware baselines are registered here; other modules add theirs
with ``register_policy`` at import time (e.g. FGD-paper policies), and list them in
``EXTENSION_MODULES`` so that ``get_policy`` finds them without the caller importing them first.
"""

from __future__ import annotations

import importlib
from typing import Callable

from agmarl_common.core.policies.base import Policy
from agmarl_common.core.policies.kube import (
    KubeDefaultPolicy,
    KubeResourcesPolicy,
    MostAllocatedPolicy,
    RequestedToCapacityRatioPolicy,
)
from agmarl_common.core.policies.loadaware import (
    KoordLoadAwarePolicy,
    LoadVariationRiskBalancingPolicy,
    TargetLoadPackingPolicy,
)

PolicyFactory = Callable[[int], Policy]

# modules that call register_policy on import; imported lazily, skipped when absent
EXTENSION_MODULES: list[str] = ["agmarl_common.core.policies.fgd", "agmarl_common.core.policies.fgdpack",
                                 "agmarl_common.core.policies.headroom", "agmarl_common.core.policies.gpupack",
                                 "agmarl_common.core.sim.lookahead"]  # lookahead: a simulator-only reference

_REGISTRY: dict[str, PolicyFactory] = {}
_loaded = False
MODEL_PREFIX = "model:"  # a learned model served by ONNX Runtime: ``model:<default|path|version>``
# name prefixes resolved by a function ``resolve(rest_of_name, seed) -> Policy`` ("module:function",
# imported on first use): ``model:<default|path|version>`` is the learned policy served by ONNX Runtime
PREFIX_RESOLVERS: dict[str, str] = {MODEL_PREFIX: "agmarl_common.serving.onnx_model:resolve_model_policy"}
# wrappers: ``<prefix><policy>`` is <policy> wrapped by ``wrap(policy, seed) -> Policy`` ("module:function"):
# ``capped:`` the load cap as admission (policies.loadcap); ``cpu-first:`` and ``fgd-shares:`` a placement rule
# (policies.rules). They compose (``fgd-shares:cpu-first:model:default``); a name wrapping a model is a model
# selection (``is_model``), and a promotion keeps its wrappers (``with_model``)
WRAPPERS: dict[str, str] = {"capped:": "agmarl_common.core.policies.loadcap:wrap_capped",
                            "cpu-first:": "agmarl_common.core.policies.rules:wrap_cpu_first",
                            "fgd-shares:": "agmarl_common.core.policies.rules:wrap_fgd_shares"}


def unwrap(name: str) -> tuple[str, str]:
    """(the wrapper prefixes, the policy they wrap): ``cpu-first:model:v1`` -> ("cpu-first:", "model:v1"),
    ``fgd`` -> ("", "fgd")."""
    i = 0
    while True:
        prefix = next((p for p in WRAPPERS if name.startswith(p, i)), None)
        if prefix is None:
            return name[:i], name[i:]
        i += len(prefix)


def is_model(name: str) -> bool:
    """True for a learned model's selection: ``model:<ref>``, wrapped or not (``cpu-first:model:<ref>``)."""
    return unwrap(name)[1].startswith(MODEL_PREFIX)


def model_ref(name: str) -> str:
    """The ``<ref>`` of the model a model selection serves (``is_model``): ``cpu-first:model:v1`` -> "v1"."""
    base = unwrap(name)[1]
    if not base.startswith(MODEL_PREFIX):
        raise ValueError(f"{name!r} does not name a model")
    return base[len(MODEL_PREFIX):]


def with_model(name: str, ref: str) -> str:
    """``name``'s wrappers around ``model:<ref>``: what a promotion of ``ref`` over the selection ``name`` serves
    (``cpu-first:model:v1``, ``v2`` -> ``cpu-first:model:v2``; a baseline's wrappers are not kept)."""
    wrappers = unwrap(name)[0] if is_model(name) else ""
    return f"{wrappers}{MODEL_PREFIX}{ref}"


def wrap(wrappers: str, policy: Policy, seed: int = 0) -> Policy:
    """``policy`` wrapped by the prefixes ``wrappers`` (``unwrap``'s first part), the innermost last; KeyError
    when one is not a wrapper or comes twice."""
    prefixes = wrappers.split(":")[:-1]
    if unwrap(wrappers) != (wrappers, "") or len(set(prefixes)) < len(prefixes):
        raise KeyError(f"{wrappers!r}: each wrapper ({', '.join(WRAPPERS)}) at most once")
    for prefix in reversed(prefixes):
        module, _, fn = WRAPPERS[prefix + ":"].partition(":")
        policy = getattr(importlib.import_module(module), fn)(policy, seed)
    return policy


def register_policy(name: str, factory: PolicyFactory, *, replace: bool = False) -> None:
    """Register ``factory(seed) -> Policy`` under ``name``; re-registering needs ``replace=True``."""
    if name in _REGISTRY and not replace and _REGISTRY[name] is not factory:
        raise ValueError(f"policy {name!r} is already registered")
    _REGISTRY[name] = factory


def _load_extensions() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in EXTENSION_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:  # the module exists but one of its imports is missing: a real bug
                raise


def policy_names() -> list[str]:
    _load_extensions()
    return sorted(_REGISTRY)


def get_policy(name: str, seed: int = 0) -> Policy:
    """A fresh policy instance; unknown names raise KeyError listing the known ones."""
    _load_extensions()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        wrappers, base = unwrap(name)
        if wrappers:
            if not base:
                raise KeyError(f"{name!r}: a wrapper needs one policy name after it") from None
            return wrap(wrappers, get_policy(base, seed), seed)
        for prefix, target in PREFIX_RESOLVERS.items():
            if name.startswith(prefix):
                module, _, fn = target.partition(":")
                return getattr(importlib.import_module(module), fn)(name[len(prefix):], seed)
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None
    return factory(seed)


for _cls in (KubeDefaultPolicy, KubeResourcesPolicy, MostAllocatedPolicy, RequestedToCapacityRatioPolicy,
             TargetLoadPackingPolicy, LoadVariationRiskBalancingPolicy, KoordLoadAwarePolicy):
    register_policy(_cls.name, lambda seed, _cls=_cls: _cls())


def _register_reward_aware() -> None:
    """``reward-aware`` (fixed-scheme weights) and one variant per other reward scheme."""
    from agmarl_common.core.policies.rewardaware import RewardAwarePolicy  # noqa: PLC0415
    from agmarl_common.core.scoring.rewardaware import RewardAwareConfig  # noqa: PLC0415
    from agmarl_common.core.reward import SCHEMES  # noqa: PLC0415

    for scheme in SCHEMES:
        policy = RewardAwarePolicy(RewardAwareConfig(scheme=scheme))
        register_policy(policy.name, lambda seed, _s=scheme: RewardAwarePolicy(RewardAwareConfig(scheme=_s)))


_register_reward_aware()
