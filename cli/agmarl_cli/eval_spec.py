"""`agmarl eval` inputs: the run spec, its parsing and validation, and the cluster and workload it names.

Traces are cached per process (a worker loads a trace once for all its jobs). Bad input is an
``EvalError`` (a ``ValueError``) whose message names the problem. Re-exported by ``agmarl_cli.evaluate``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from agmarl_common.core.cluster.model import Node, Pod
from agmarl_common.core.policies.base import Policy
from agmarl_common.core.policies.registry import MODEL_PREFIX  # noqa: F401  (re-exported by agmarl_cli.evaluate)
from agmarl_common.core.sim import catalog, synthetic, traces
from agmarl_common.core.sim.catalog import SYNTHETIC_CLUSTER_SEED  # noqa: F401  (re-exported)

PROTOCOLS = ("inflation", "dynamic")
MAX_SEEDS = 1000
INFLATION_CURVES = ("allocation", "frag", "frag_ratio")
DYNAMIC_SERIES = ("util_cpu", "util_mem", "util_gpu", "pending", "reward")


class EvalError(ValueError):
    """Bad input: the message names the problem (shown to the user as one line)."""


@dataclass(frozen=True)
class EvalSpec:
    protocol: str  # "inflation" | "dynamic"
    workload: str  # "openb:default" | "openb:<name>" | "openb:<csv path>" | "synthetic:<name>"
    nodes: str = ""  # "openb" | "openb:all" | "synthetic:<n>" | "<csv path>"; "" = by workload
    ratio: float = 1.3  # inflation target, x GPU capacity
    horizon_s: float = 3600.0  # dynamic run length; also sizes synthetic workloads
    record_every_s: float = 30.0  # dynamic record interval
    tie_break: str = "node-order"  # inflation: "node-order" (the paper's simulator) | "random" (kube-scheduler)


# ---------------------------------------------------------------------------------------------
# Parsing and validation


def parse_seeds(text: str) -> list[int]:
    """``"42-51"`` (inclusive), ``"42,43,50"`` or ``"42"`` -> seeds; anything else is an EvalError."""
    raw = (text or "").strip()
    try:
        if "-" in raw and "," not in raw:
            lo_s, hi_s = raw.split("-", 1)
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo:
                raise ValueError
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(s) for s in raw.split(",")]
    except ValueError:
        raise EvalError(f"bad seed range {text!r}: use A-B with A <= B, or a comma list of integers") from None
    if not seeds or min(seeds) < 0 or len(seeds) > MAX_SEEDS or len(set(seeds)) != len(seeds):
        raise EvalError(f"bad seed range {text!r}: 1..{MAX_SEEDS} distinct non-negative integers")
    return seeds


def known_policy_names() -> list[str]:
    """Registry names, plus the FGD-paper policies when the registry does not list them (yet)."""
    from agmarl_common.core.policies.fgd import FGD_PAPER_POLICIES  # noqa: PLC0415
    from agmarl_common.core.policies.registry import policy_names  # noqa: PLC0415
    return sorted(set(policy_names()) | set(FGD_PAPER_POLICIES))


def resolve_policy(name: str, seed: int) -> Policy:
    """A fresh policy: the registry first (``model:*`` included when a helper registered it)."""
    from agmarl_common.core.policies.fgd import FGD_PAPER_POLICIES  # noqa: PLC0415
    from agmarl_common.core.policies.registry import get_policy, is_model  # noqa: PLC0415
    try:
        return get_policy(name, seed)
    except KeyError:
        if name in FGD_PAPER_POLICIES:
            return FGD_PAPER_POLICIES[name](seed)
    what = "unknown model policy" if is_model(name) else "unknown policy"
    raise EvalError(f"{what} {name!r}; known: {', '.join(known_policy_names())}")


def parse_policies(text: str) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if not names:
        raise EvalError("no policies given (--policies a,b,...)")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise EvalError(f"policy listed twice: {', '.join(dup)}")
    for n in names:
        resolve_policy(n, 0)
    return names


def _openb_workload_path(ref: str) -> Path:
    try:
        return catalog.openb_workload_path(ref)
    except ValueError as exc:
        raise EvalError(str(exc)) from None


def check_spec(spec: EvalSpec) -> None:
    """Everything a job needs, loaded once here so bad input fails before any run starts."""
    if spec.protocol not in PROTOCOLS:
        raise EvalError(f"unknown protocol {spec.protocol!r}; known: {', '.join(PROTOCOLS)}")
    if spec.tie_break not in ("node-order", "random"):
        raise EvalError(f"--tie-break must be node-order or random, not {spec.tie_break!r}")
    if not spec.ratio > 0 or not spec.horizon_s > 0 or not spec.record_every_s > 0:
        raise EvalError("--ratio, --horizon and --record-every must be > 0")
    kind, _, ref = spec.workload.partition(":")
    if kind == "synthetic":
        if ref not in synthetic.SYNTHETIC_WORKLOADS:
            raise EvalError(f"unknown workload {spec.workload!r}; known synthetic workloads: "
                            f"{', '.join(sorted(synthetic.SYNTHETIC_WORKLOADS))}")
    elif kind == "openb" and ref:
        _openb_pods(str(_openb_workload_path(ref)))
    else:
        raise EvalError(f"unknown workload {spec.workload!r}: use openb:default, openb:<csv path> or "
                        "synthetic:<name>")
    if not load_nodes(spec):
        raise EvalError(f"node list {spec.nodes!r} is empty")


# ---------------------------------------------------------------------------------------------
# Inputs (cached per process: a worker loads a trace once for all its jobs)


@lru_cache(maxsize=8)
def _openb_pods(path: str) -> tuple[Pod, ...]:
    return traces.load_openb_pods(path)


@lru_cache(maxsize=8)
def _nodes(ref: str) -> tuple[Node, ...]:
    if ref.startswith("synthetic:"):
        try:
            return catalog.cluster_nodes(ref)
        except ValueError as exc:
            raise EvalError(str(exc)) from None
    return catalog.cluster_nodes(ref)


def load_nodes(spec: EvalSpec) -> tuple[Node, ...]:
    """The cluster: ``spec.nodes``, or by default openb's GPU nodes for openb, 50 synthetic nodes else."""
    ref = spec.nodes or catalog.default_nodes(spec.workload)
    return _nodes(ref)


def compress_times(pods: tuple[Pod, ...], horizon_s: float) -> tuple[Pod, ...]:
    """A trace longer than the horizon squeezed onto it: creation times and durations scaled by
    horizon / span (durations at least 1 s; 0 stays 0, "runs forever"). Every trace starts at 0."""
    times = [p.creation_time for p in pods]
    lo, span = min(times, default=0.0), max(times, default=0.0) - min(times, default=0.0)
    if span <= horizon_s:
        return tuple(replace_time(p, p.creation_time - lo, p.duration) for p in pods)
    k = horizon_s / span
    return tuple(replace_time(p, (p.creation_time - lo) * k, max(p.duration * k, 1.0) if p.duration > 0 else 0.0)
                 for p in pods)


def replace_time(pod: Pod, creation_time: float, duration: float) -> Pod:
    return replace(pod, creation_time=float(creation_time), duration=float(duration))


def load_workload(spec: EvalSpec, nodes: tuple[Node, ...], seed: int) -> tuple[Pod, ...]:
    kind, _, ref = spec.workload.partition(":")
    if kind == "synthetic":
        return tuple(synthetic.generate(ref, list(nodes), horizon_s=spec.horizon_s, seed=seed))
    pods = _openb_pods(str(_openb_workload_path(ref)))
    return compress_times(pods, spec.horizon_s) if spec.protocol == "dynamic" else pods

