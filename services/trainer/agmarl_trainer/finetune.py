"""Fine-tuning, top to bottom: incumbent weights -> experience + simulator samples -> imitation -> gate.

1. Start from the weights of the model that serves (``model.pt`` of the incumbent's model folder; when a
   baseline serves, of the newest model; from scratch only when no model folder has a ``model.pt``).
   The network shape is the incumbent's, whatever the config's ``net`` says.
2. Data: the simulator's expert samples (``imitation.expert_tasks`` of the config: FGD on openb
   sub-clusters, a kube-scheduler baseline on dynamic synthetic workloads) plus the recorded decisions
   that earned at least the median reward (``experience.experience_samples``).
3. ``imitation.epochs`` passes of minibatch cross-entropy (``imitation.imitation_loss``) at
   ``imitation.lr``, from those weights. No PPO here (``agmarl train`` has it).
4. Evaluation for the promotion gate: candidate, incumbent and the baselines FGD and BestFit on the same
   protocol, workloads and seeds: openb inflation on held-out sub-clusters (``eval.sub_nodes`` nodes,
   seeds ``eval.sub_seeds``, pod lists ``eval.workloads``) -> ``alloc_at_100``; the dynamic simulator
   (``sim.dynamic_nodes`` synthetic nodes, ``sim.dynamic_horizon_s``, the first dynamic workload, the same
   seeds) -> ``hard_violations`` (summed) and ``dynamic_reward`` (mean per round).
5. ``promotion.promotion_gate``; only a promoted (or forced) candidate is exported (ONNX, parity check,
   manifest) into ``out_dir``. Everything lands in ``result.json``.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from agmarl_common.core.policies.registry import MODEL_PREFIX
from agmarl_common.core.sim import dynamic, synthetic
from agmarl_trainer.config import TrainConfig, config_to_dict, load_config
from agmarl_trainer.experience import experience_samples, read_experience
from agmarl_trainer.imitation import expert_policy, expert_tasks, minibatches, openb_nodes, \
    openb_pods, run_tasks
from agmarl_trainer.model import PolicyNet
from agmarl_trainer.promotion import GateRule, promotion_gate
from agmarl_trainer.rollout import Sample, run_dynamic_episode, run_inflation_episode, sub_cluster, torch_scorer
from agmarl_trainer.train import MetricsLog, imitation_step

BASELINES = ("fgd", "bestfit")
SCRATCH = "scratch (no model.pt)"


@dataclasses.dataclass(frozen=True)
class Incumbent:
    """What serves (``policy``: ``model:<version>`` or a baseline name) and the model folder whose weights
    the fine-tune starts from (the serving model's; the newest model's when a baseline serves; "" = none)."""

    policy: str
    model_dir: str = ""

    @property
    def is_model(self) -> bool:
        return self.policy.startswith(MODEL_PREFIX)


# ---------------------------------------------------------------------------------------------
# 1-3: weights, data, fit


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


def fit(net: PolicyNet, samples: Sequence[Sample], cfg: TrainConfig, rng: np.random.Generator,
        log: MetricsLog) -> dict[str, float]:
    """``imitation.epochs`` passes of minibatch cross-entropy on ``samples``, from the current weights."""
    ic = cfg.imitation
    if not samples or ic.epochs <= 0:
        return {"steps": 0}
    opt = torch.optim.Adam(net.parameters(), lr=ic.lr)
    step, last = 0, {}
    net.train()
    for _ in range(ic.epochs):
        for idx in minibatches(len(samples), ic.batch_graphs, rng):
            loss, acc = imitation_step(net, net, opt, [samples[i] for i in idx], ic.logit_penalty)
            step += 1
            last = {"loss": round(loss.item(), 4), "accuracy": round(acc, 4)}
            log.row(phase="finetune", step=step, lr=ic.lr, **last)
    net.eval()
    return {"steps": step, **last}


# ---------------------------------------------------------------------------------------------
# 4: evaluation on one protocol for every policy

Actor = Callable[[], dict]  # -> run_*_episode keyword arguments (a fresh scorer or expert per episode)


def dynamic_workload(cfg: TrainConfig) -> str:
    """The dynamic workload the gate evaluates on (the first of ``sim.dynamic_workloads``; "" = none)."""
    return cfg.sim.dynamic_workloads[0] if cfg.sim.dynamic_workloads else ""


def evaluate_policies(actors: Mapping[str, Actor], cfg: TrainConfig) -> dict[str, dict[str, float]]:
    """{policy: {alloc_at_100, alloc_at_100_runs, hard_violations, dynamic_reward}}, same seeds for all."""
    out: dict[str, dict[str, float]] = {}
    dyn_workload = dynamic_workload(cfg)
    sim = dynamic.SimConfig(tick_s=cfg.sim.dynamic_tick_s, horizon_s=cfg.sim.dynamic_horizon_s)
    dyn_cases = []  # (seed, nodes, pods): the same for every policy
    for seed in cfg.eval.sub_seeds if dyn_workload else ():
        nodes = synthetic.synthetic_cluster(cfg.sim.dynamic_nodes, seed=seed)
        dyn_cases.append((seed, nodes, synthetic.generate(dyn_workload, nodes, horizon_s=cfg.sim.dynamic_horizon_s,
                                                          seed=seed)))
    for name, actor in actors.items():
        allocs, violations, rewards = [], 0.0, []
        for workload in cfg.eval.workloads:
            for seed in cfg.eval.sub_seeds:
                rng = np.random.default_rng(seed)
                nodes = sub_cluster(openb_nodes(), cfg.eval.sub_nodes, rng)
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
    return {"inflation": {"sub_nodes": cfg.eval.sub_nodes, "seeds": list(cfg.eval.sub_seeds),
                          "workloads": list(cfg.eval.workloads), "metric": "alloc_at_100 (GPU allocation % at "
                                                                            "100 % of capacity arrived)"},
            "dynamic": {"nodes": cfg.sim.dynamic_nodes, "horizon_s": cfg.sim.dynamic_horizon_s,
                        "workload": dynamic_workload(cfg),
                        "seeds": list(cfg.eval.sub_seeds)}}


# ---------------------------------------------------------------------------------------------
# 5: export of a promoted candidate


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
                 runs_dir: str | Path, force: bool = False, rule: GateRule = GateRule(),
                 objective: str = "composite", scheme: str = "fixed") -> dict:
    """Fine-tune, evaluate, gate, export when promoted (or ``force``); returns the result (JSON-able).
    ``objective`` / ``scheme``: the deployment's, for the graphs of the recorded decisions."""
    t0 = time.monotonic()
    cfg = load_config(config_path)
    torch.set_num_threads(max(1, cfg.torch_threads))
    rng = np.random.default_rng(cfg.seed)
    net, cfg, start = start_net(inc, cfg)
    # the incumbent's weights when they are the ones loaded (its model.pt), kept before the fit moves them
    incumbent_net = copy.deepcopy(net) if inc.is_model and start != SCRATCH else None
    log = MetricsLog(Path(runs_dir) / cfg.name / "metrics.csv")
    try:
        sim = [s for episode, _ in run_tasks(expert_tasks(cfg, rng), cfg.workers) for s in episode]
        transitions = read_experience(experience_path)
        exp, counts = experience_samples(transitions, objective=objective, scheme=scheme)
        history = fit(net, sim + exp, cfg, rng, log)
    finally:
        log.close()
    net.eval()
    actors: dict[str, Actor] = {"candidate": lambda: {"scorer": torch_scorer(net)},
                                "incumbent": incumbent_actor(inc, incumbent_net)}
    actors.update({b: (lambda b=b: {"expert": expert_policy(b, 0)}) for b in BASELINES})
    metrics = evaluate_policies(actors, cfg)
    verdict = promotion_gate(metrics["candidate"], metrics["incumbent"], rule)
    result = {"rc": 0, "incumbent": dataclasses.asdict(inc), "start_from": start,
              "experience": {"transitions": len(transitions), "samples": len(exp), "counts": counts},
              "simulator_samples": len(sim), "fit": history,
              "evaluation": {"protocol": protocol(cfg), "policies": metrics},
              "gate": {"promote": verdict.promote, "reason": verdict.reason, "forced": force and not verdict.promote,
                       "rule": dataclasses.asdict(rule)}}
    if verdict.promote or force:
        what = ("incumbent", "start_from", "experience", "simulator_samples", "fit")
        training = {"config_path": str(config_path), "finetune": {k: result[k] for k in what},
                    "seconds": round(time.monotonic() - t0, 1)}
        manifest = export_model(net, cfg, Path(out_dir), training,
                                {"gate": result["evaluation"], "verdict": result["gate"]})
        result.update(model_dir=str(out_dir), version=manifest["version"])
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result
