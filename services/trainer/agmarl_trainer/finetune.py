"""Fine-tuning, top to bottom: serving weights -> search-based improvement on simulator episodes plus
recorded experience -> paired promotion gate on held-out seeds -> export.

1. Start from the weights of the model that serves (``model.pt`` of the incumbent's model folder; when a
   baseline serves, of the newest model; from scratch only when no model folder has a ``model.pt``).
   The network shape is the incumbent's, whatever the config's ``net`` says.
2. Improvement: ``search.train_search`` (the method ``agmarl train --config configs/train/search.yaml`` uses)
   from those weights: ``search.iterations`` rounds of simulator episodes of the current policy on openb
   sub-clusters whose ``search.top_k`` candidates at sampled decision points are tried with
   ``search.rollout_policy`` rollouts (the best by GPU allocation is the label), distilled with cross-entropy +
   ``search.anchor`` * KL to the serving model inside the ``search.kl_max`` trust region; the iteration with
   the best mean on ``eval.sub_seeds`` is kept (the start on a tie).
   Recorded experience: the newest ``search.experience_max`` decisions at or above the median reward
   (``experience.experience_samples``: the graph the scheduler saw, labelled with the node it bound to) are
   added to every iteration's distillation as cross-entropy targets. They pull the policy towards the
   well-rewarded live decisions; they are not searched (a recorded decision has no future arrivals to roll
   out) and the held-out selection and the gate measure the simulator protocol only.
3. Gate evaluation: candidate, incumbent and the baselines ``gate.baselines`` (FGD, BestFit) on the same protocol, workloads
   and seeds, held out from the fine-tune (``gate.seeds``, disjoint from ``eval.sub_seeds`` and from every
   training episode's seed, checked): openb inflation on ``gate.sub_nodes``-node sub-clusters, pod lists
   ``eval.workloads`` -> ``alloc_at_100`` per run and its mean; the dynamic simulator (``sim.dynamic_nodes``
   synthetic nodes, ``sim.dynamic_horizon_s``, the first dynamic workload, the first ``gate.dynamic_seeds``
   seeds) -> ``hard_violations`` (summed) and ``dynamic_reward`` (mean per round).
4. ``promotion.promotion_gate``, paired per run, margin ``gate.min_gain``; only a promoted (or forced)
   candidate is exported (ONNX, parity check, manifest) into ``out_dir``. Everything lands in ``result.json``.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch

from agmarl_common.core.policies.registry import is_model
from agmarl_common.core.sim import dynamic, synthetic
from agmarl_trainer.config import TrainConfig, config_to_dict, load_config
from agmarl_trainer.experience import experience_samples, read_experience
from agmarl_trainer.imitation import expert_policy, openb_nodes, openb_pods
from agmarl_trainer.model import PolicyNet
from agmarl_trainer.promotion import GateRule, promotion_gate
from agmarl_trainer.rollout import run_dynamic_episode, run_inflation_episode, sub_cluster, torch_scorer
from agmarl_trainer.search import train_search
from agmarl_trainer.train import MetricsLog

SCRATCH = "scratch (no model.pt)"


@dataclasses.dataclass(frozen=True)
class Incumbent:
    """What serves (``policy``: ``model:<version>``, a wrapped one such as ``cpu-first:model:<version>``, or a
    baseline name) and the model folder whose weights the fine-tune starts from (the serving model's; the newest
    model's when a baseline serves; "" = none). A serving model's wrappers (placement rules) are not part of the
    gate's comparison: it compares the candidate's weights with the serving model's, both without them, and a
    promotion keeps the wrappers (``registry.with_model``)."""

    policy: str
    model_dir: str = ""

    @property
    def is_model(self) -> bool:
        return is_model(self.policy)


# ---------------------------------------------------------------------------------------------
# 1: weights


def start_net(inc: Incumbent, cfg: TrainConfig) -> tuple[PolicyNet, TrainConfig, str]:
    """(network, config with the network's shape, where the weights came from)."""
    ckpt_path = Path(inc.model_dir) / "model.pt" if inc.model_dir else None
    if ckpt_path is not None and ckpt_path.is_file():
        ckpt = torch.load(ckpt_path, weights_only=False)
        net = PolicyNet(ckpt["net"])
        net.load_state_dict(ckpt["state_dict"])
        return net, dataclasses.replace(cfg, net=ckpt["net"]), str(ckpt_path)
    torch.manual_seed(cfg.seed)
    return PolicyNet(cfg.net), cfg, SCRATCH


# ---------------------------------------------------------------------------------------------
# 3: evaluation on one protocol for every policy

Actor = Callable[[], dict]  # -> run_*_episode keyword arguments (a fresh scorer or expert per episode)


def dynamic_workload(cfg: TrainConfig) -> str:
    """The dynamic workload the gate evaluates on (the first of ``sim.dynamic_workloads``; "" = none)."""
    return cfg.sim.dynamic_workloads[0] if cfg.sim.dynamic_workloads else ""


def gate_seeds(cfg: TrainConfig) -> tuple[int, ...]:
    return tuple(cfg.gate.seeds)


def evaluate_policies(actors: Mapping[str, Actor], cfg: TrainConfig) -> dict[str, dict[str, float]]:
    """{policy: {alloc_at_100, alloc_at_100_runs, hard_violations, dynamic_reward}} on the gate's held-out seeds,
    the same for all (``alloc_at_100_runs``: one per (workload, seed), in that order)."""
    out: dict[str, dict[str, float]] = {}
    dyn_workload = dynamic_workload(cfg)
    sim = dynamic.SimConfig(tick_s=cfg.sim.dynamic_tick_s, horizon_s=cfg.sim.dynamic_horizon_s)
    n_nodes = cfg.gate.sub_nodes or cfg.eval.sub_nodes
    dyn_cases = []  # (seed, nodes, pods): the same for every policy
    for seed in gate_seeds(cfg)[:max(0, cfg.gate.dynamic_seeds)] if dyn_workload else ():
        nodes = synthetic.synthetic_cluster(cfg.sim.dynamic_nodes, seed=seed)
        dyn_cases.append((seed, nodes, synthetic.generate(dyn_workload, nodes, horizon_s=cfg.sim.dynamic_horizon_s,
                                                          seed=seed)))
    for name, actor in actors.items():
        allocs, violations, rewards = [], 0.0, []
        for workload in cfg.eval.workloads:
            for seed in gate_seeds(cfg):
                rng = np.random.default_rng(seed)
                nodes = sub_cluster(openb_nodes(), n_nodes, rng)
                allocs.append(run_inflation_episode(nodes, openb_pods(workload), rng, record_prob=0.0,
                                                    **actor()).alloc_at_100)
        for seed, nodes, pods in dyn_cases:
            kw = actor()
            if callable(getattr(kw.get("expert"), "observe_workload", None)):
                kw["expert"].observe_workload(pods)
            _, stats = run_dynamic_episode(nodes, pods, seed, sim, record_prob=0.0, **kw)
            violations += stats["hard_violations"]
            rewards.append(stats["mean_reward"])
        out[name] = {"alloc_at_100": round(float(np.mean(allocs)), 3),
                     "alloc_at_100_runs": [round(a, 3) for a in allocs], "hard_violations": violations,
                     "dynamic_reward": round(float(np.mean(rewards)), 4) if rewards else 0.0}
    return out


def incumbent_actor(inc: Incumbent, weights: PolicyNet | None = None) -> Actor:
    """The serving policy as it serves: a model's torch weights (``weights``, its model.pt as ``start_net``
    loaded it; ONNX Runtime when it has no model.pt), or a baseline by its registry name."""
    if not inc.is_model:
        return lambda: {"expert": expert_policy(inc.policy, 0)}
    if weights is not None:
        return lambda: {"scorer": torch_scorer(weights.eval())}
    from agmarl_trainer.evaluate import onnx_scorer

    return lambda: {"scorer": onnx_scorer(inc.model_dir, incremental=False)}


def protocol(cfg: TrainConfig) -> dict:
    seeds = list(gate_seeds(cfg))
    return {"inflation": {"sub_nodes": cfg.gate.sub_nodes or cfg.eval.sub_nodes, "seeds": seeds,
                          "workloads": list(cfg.eval.workloads), "metric": "alloc_at_100 (GPU allocation % at "
                                                                            "100 % of capacity arrived)"},
            "dynamic": {"nodes": cfg.sim.dynamic_nodes, "horizon_s": cfg.sim.dynamic_horizon_s,
                        "workload": dynamic_workload(cfg), "seeds": seeds[:max(0, cfg.gate.dynamic_seeds)]}}


def check_held_out(cfg: TrainConfig, train_seeds: tuple[int, ...] = ()) -> None:
    """The gate's seeds are used by nothing else: not the search's selection seeds, not a training episode."""
    if not cfg.gate.seeds:
        raise ValueError("gate.seeds is empty: the promotion gate needs held-out seeds")
    shared = set(cfg.gate.seeds) & (set(cfg.eval.sub_seeds) | set(train_seeds))
    if shared:
        raise ValueError(f"gate.seeds {sorted(shared)} are also used by the fine-tune (eval.sub_seeds or a "
                         "training episode): the gate must evaluate on held-out seeds")


# ---------------------------------------------------------------------------------------------
# 4: export of a promoted candidate


def export_model(net: PolicyNet, cfg: TrainConfig, out: Path, training: dict, evaluation: dict) -> dict:
    """encoder.onnx, actor.onnx, model.pt and manifest.json in ``out``; raises when the parity check fails."""
    from agmarl_trainer.cli import PARITY_TOL, model_manifest, parity_check
    from agmarl_trainer.export import export_onnx, write_manifest

    out.mkdir(parents=True, exist_ok=True)
    export_onnx(net, out)
    torch.save({"state_dict": net.state_dict(), "net": cfg.net, "config": config_to_dict(cfg)}, out / "model.pt")
    parity = parity_check(net, out)
    if max(parity.values()) > PARITY_TOL:
        raise RuntimeError(f"ONNX parity check failed: {parity}")
    manifest = model_manifest(cfg.name, out, {**training, "config": config_to_dict(cfg)}, evaluation, parity)
    write_manifest(out, manifest)
    return manifest


# ---------------------------------------------------------------------------------------------
# The whole run


def run_finetune(config_path: str | Path, inc: Incumbent, experience_path: str | Path, out_dir: str | Path,
                 runs_dir: str | Path, force: bool = False, rule: GateRule | None = None,
                 objective: str = "composite", scheme: str = "fixed") -> dict:
    """Fine-tune, evaluate, gate, export when promoted (or ``force``); returns the result (JSON-able).
    ``rule``: the gate's (default: ``alloc_at_100`` paired, margin ``gate.min_gain``, the gain's 95 % interval
    above 0 unless ``gate.require_interval`` is off, no hard violations).
    ``objective`` / ``scheme``: the deployment's, for the graphs of the recorded decisions."""
    t0 = time.monotonic()
    cfg = load_config(config_path)
    check_held_out(cfg)
    rule = rule or GateRule(min_gain=cfg.gate.min_gain, require_interval=cfg.gate.require_interval)
    torch.set_num_threads(max(1, cfg.torch_threads))
    rng = np.random.default_rng(cfg.seed)
    net, cfg, start = start_net(inc, cfg)
    # the incumbent's weights when they are the ones loaded (its model.pt), kept before the search moves them
    incumbent_net = copy.deepcopy(net) if inc.is_model and start != SCRATCH else None
    transitions = read_experience(experience_path)
    exp, counts = experience_samples(transitions, max_samples=max(0, cfg.search.experience_max),
                                     objective=objective, scheme=scheme)
    exp = exp if cfg.search.experience_max > 0 else []
    search: dict = {"iterations": 0, "kept_iteration": 0, "train_seeds": [], "distill_steps": 0}
    if cfg.search.iterations > 0:
        log = MetricsLog(Path(runs_dir) / cfg.name / "metrics.csv")
        try:
            search = train_search(net, cfg, log, rng, t0 + cfg.time_budget_s, extra=exp)
        finally:
            log.close()
    check_held_out(cfg, tuple(search["train_seeds"]))
    net.eval()
    actors: dict[str, Actor] = {"candidate": lambda: {"scorer": torch_scorer(net)},
                                "incumbent": incumbent_actor(inc, incumbent_net)}
    actors.update({b: (lambda b=b: {"expert": expert_policy(b, 0)}) for b in cfg.gate.baselines})
    metrics = evaluate_policies(actors, cfg)
    verdict = promotion_gate(metrics["candidate"], metrics["incumbent"], rule)
    searched = search.get("curve", [])[1:]  # the iterations (row 0 is the start)
    result = {"rc": 0, "incumbent": dataclasses.asdict(inc), "start_from": start,
              "experience": {"transitions": len(transitions), "samples": len(exp), "counts": counts,
                             "use": "cross-entropy targets in every search iteration's distillation"},
              "simulator_samples": sum(c["labels"] + c["anchor_states"] for c in searched),
              "fit": {"steps": search["distill_steps"], "method": "search-based improvement (search.py)"},
              "search": search,
              "evaluation": {"protocol": protocol(cfg), "policies": metrics},
              "gate": {"promote": verdict.promote, "reason": verdict.reason, "forced": force and not verdict.promote,
                       "rule": dataclasses.asdict(rule), "paired": verdict.figures,
                       "held_out_seeds": list(cfg.gate.seeds)}}
    if verdict.promote or force:
        what = ("incumbent", "start_from", "experience", "simulator_samples", "fit")
        training = {"config_path": str(config_path), "finetune": {k: result[k] for k in what},
                    "search_curve": search.get("curve", []), "seconds": round(time.monotonic() - t0, 1)}
        manifest = export_model(net, cfg, Path(out_dir), training,
                                {"gate": result["evaluation"], "verdict": result["gate"]})
        result.update(model_dir=str(out_dir), version=manifest["version"])
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result
