"""Training configuration: typed, frozen dataclasses filled from YAML (unknown keys are errors)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from agmarl_trainer.model import NetConfig


@dataclass(frozen=True)
class ImitationConfig:
    episodes: int = 24  # expert (FGD) inflation episodes on openb sub-clusters
    dynamic_episodes: int = 2  # expert (dynamic_expert) episodes on synthetic dynamic workloads
    record_prob: float = 0.3  # share of decisions kept as samples
    epochs: int = 6
    batch_graphs: int = 32
    lr: float = 3e-3
    expert: str = "fgd"
    dynamic_expert: str = "kube-default"
    # weight of mean(logit^2) added to the cross-entropy: keeps logits in a range where float32 ONNX and
    # torch agree to 1e-4 (cross-entropy alone drives the margins up without bound: +-370 seen)
    logit_penalty: float = 0.0


@dataclass(frozen=True)
class RLConfig:
    iterations: int = 0  # PPO iterations after imitation (0 = imitation only)
    episodes_per_iter: int = 2  # inflation episodes per iteration (one per worker is efficient)
    dynamic_episodes_per_iter: int = 0
    record_prob: float = 1.0
    ppo_epochs: int = 2
    batch_graphs: int = 64
    lr: float = 3e-4
    clip: float = 0.2
    gamma: float = 1.0
    gae_lambda: float = 0.95
    value_coef: float = 0.5
    entropy_coef: float = 0.001
    beta: float = 1.0  # weight of the fragmentation term of the inflation step reward
    critic_warmup: int = 2  # first iterations fit the critic only (the actor is the imitation policy)
    reward_scale: float = 0.01  # rewards (GPUs) times this before GAE: keeps returns O(1) for the critic
    max_grad_norm: float = 1.0


@dataclass(frozen=True)
class SearchConfig:
    """Search-based policy improvement (expert iteration, ``search.py``) on openb inflation sub-clusters."""

    iterations: int = 0  # improvement iterations (0 = none)
    start: str = ""  # model folder (or model.pt) to start from; "" = the weights of this run's imitation phase
    episodes_per_iter: int = 8  # simulator episodes (sub-clusters of sim.nodes_min..nodes_max nodes) per iteration
    decisions: int = 32  # decision points searched per episode
    window: tuple[float, ...] = (0.6, 1.0)  # decision points where this share of GPU capacity has arrived
    top_k: int = 4  # the policy's best k candidates each tried with a rollout
    horizon: int = 200  # rollout length cap in pods (it also stops when 100 % of GPU capacity has arrived)
    rollout_policy: str = "fgd-pack"  # who places the rollout's pods: a registry policy, or "model" (current weights)
    frag_tiebreak: bool = False  # equal allocations: the lower end fragmentation wins (else the policy's pick)
    epochs: int = 3  # distillation passes over the aggregated labels per iteration
    batch_graphs: int = 32
    lr: float = 1e-4
    anchor: float = 1.0  # weight of KL(start || current) per pod, added to the cross-entropy on improved labels
    kl_max: float = 0.05  # trust region: distillation past this mean KL to the start goes back to its last check inside
    buffer: int = 20000  # improved labels kept across iterations (newest first)
    eval_nodes: int = 0  # held-out sub-cluster size (0 = eval.sub_nodes); seeds, pod lists: eval.sub_seeds, .workloads
    # fine-tuning (finetune.py) only: the newest recorded decisions at or above the median reward added to every
    # iteration's distillation as cross-entropy targets (0 = none)
    experience_max: int = 2000
    # "inflation" (search.py: openb sub-clusters, GPU allocation) or "dynamic" (search_dynamic.py: the dynamic
    # simulator on sim.dynamic_workloads, the composite reward; there ``horizon`` is the rollout in seconds and
    # ``window`` shares of the episode's horizon)
    protocol: str = "inflation"
    admission: str = ""  # dynamic only: "capped" = the learned policy places under the load cap (policies.loadcap)


@dataclass(frozen=True)
class SimulatorConfig:
    nodes_min: int = 60  # sub-cluster size range (nodes sampled from the openb node list)
    nodes_max: int = 200
    dynamic_nodes: int = 40  # synthetic cluster size for dynamic episodes
    dynamic_horizon_s: float = 600.0
    dynamic_tick_s: float = 5.0
    dynamic_workloads: tuple[str, ...] = ("diurnal", "batch_online_mix")


@dataclass(frozen=True)
class EvalConfig:
    sub_nodes: int = 200  # quick evaluation during training: held-out sub-cluster seeds
    sub_seeds: tuple[int, ...] = (1000, 1001)
    workloads: tuple[str, ...] = ("default",)


@dataclass(frozen=True)
class GateConfig:
    """The promotion gate of a fine-tune (``finetune.py``): candidate and serving model paired per seed on
    sub-clusters the fine-tune never used (seeds disjoint from ``eval.sub_seeds``, which pick the search's best
    iteration, and from the training episodes' seeds; checked at run time)."""

    seeds: tuple[int, ...] = (2000, 2001, 2002, 2003, 2004, 2005, 2006, 2007)
    sub_nodes: int = 0  # held-out sub-cluster size (0 = eval.sub_nodes); pod lists: eval.workloads
    min_gain: float = 0.05  # the mean paired alloc_at_100 gain (percentage points) must be above this
    require_interval: bool = True  # and its 95 % t interval over the seeds must lie above zero
    dynamic_seeds: int = 2  # the first this many seeds also run the dynamic simulator (the hard_violations guard)
    baselines: tuple[str, ...] = ("fgd", "bestfit")  # evaluated on the same runs, for reference (not gated on)


@dataclass(frozen=True)
class TrainConfig:
    name: str = "default"
    seed: int = 0
    workers: int = 2  # rollout worker processes
    train_workloads: tuple[str, ...] = ("default", "cpu050", "gpushare40")  # openb pod lists trained on
    time_budget_s: float = 1800.0  # RL stops early to stay inside this wall-clock budget
    torch_threads: int = 2
    net: NetConfig = field(default_factory=NetConfig)
    sim: SimulatorConfig = field(default_factory=SimulatorConfig)
    imitation: ImitationConfig = field(default_factory=ImitationConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    gate: GateConfig = field(default_factory=GateConfig)


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {sorted(names)}")
    kwargs = {}
    for key, value in data.items():
        t = hints[key]
        if dataclasses.is_dataclass(t):
            kwargs[key] = _build(t, value or {}, f"{where}.{key}")
        elif typing.get_origin(t) is tuple:
            kwargs[key] = tuple(value)
        elif t is float:
            kwargs[key] = float(value)
        elif t is int:
            if isinstance(value, bool) or int(value) != value:
                raise ValueError(f"{where}.{key}: expected an integer, got {value!r}")
            kwargs[key] = int(value)
        else:
            kwargs[key] = value
    return cls(**kwargs)


def config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    return _build(TrainConfig, data, "config")


def load_config(path: str | Path) -> TrainConfig:
    data = yaml.safe_load(Path(path).read_text()) or {}
    return config_from_dict(data)


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    def conv(v):
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    return conv(dataclasses.asdict(cfg))
