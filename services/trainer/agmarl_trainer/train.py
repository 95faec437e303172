"""Training, top to bottom: config -> environments -> networks -> imitation -> PPO -> export.

1. Imitation warm start (imitation.py): expert decisions (FGD on openb inflation sub-clusters, a
   kube-scheduler baseline on dynamic synthetic workloads) collected in worker processes; cross-entropy
   of the actor's candidate softmax against the expert's pick.
2. RL fine-tuning: PPO (clipped ratio, GAE) with the centralised critic (model.CentralCritic with the
   QMIX-style mixer). Rollouts run in worker processes with the current weights; inflation reward per
   step in rollout.py, dynamic reward = agmarl_common.core.reward.total_reward per scheduling round.
   Each pending pod is an agent; a round's joint log-probability is the sum over its agents.
3. Quick evaluation on held-out sub-cluster seeds (greedy policy vs FGD), checkpoint, ONNX export and a
   parity check on real graphs, manifest.json.

Progress goes to tqdm; every optimisation step is one row of runs/<name>/metrics.csv.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm

from agmarl_trainer.config import TrainConfig, config_to_dict
from agmarl_trainer.distributed import common_count
from agmarl_trainer.imitation import EpisodeTask, expert_tasks, imitation_loss, minibatches, openb_nodes, \
    openb_pods, run_tasks
from agmarl_trainer.model import PolicyNet
from agmarl_trainer.rollout import Sample, action_edges, collate, run_inflation_episode, segment_log_softmax, \
    sub_cluster, torch_scorer
from agmarl_trainer.search import train_search
from agmarl_trainer.search_dynamic import train_search_dynamic

METRIC_FIELDS = ("phase", "step", "time_s", "loss", "accuracy", "policy_loss", "value_loss", "entropy",
                 "approx_kl", "episode_return", "alloc_at_100", "fgd_alloc_at_100", "lr")


class MetricsLog:
    """Append-only CSV of per-step metrics (missing fields left empty)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = path.open("w", newline="")
        self._w = csv.DictWriter(self._f, fieldnames=METRIC_FIELDS)
        self._w.writeheader()
        self.t0 = time.monotonic()

    def row(self, **values) -> None:
        values.setdefault("time_s", round(time.monotonic() - self.t0, 2))
        self._w.writerow({k: values.get(k, "") for k in METRIC_FIELDS})
        self._f.flush()

    def close(self) -> None:
        self._f.close()


@dataclass
class TrainResult:
    net: PolicyNet
    out_dir: Path
    history: dict[str, list] = field(default_factory=dict)
    eval: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    config: TrainConfig | None = None  # the config as run (with the start model's network shape)


# ---------------------------------------------------------------------------------------------
# Evaluation on held-out sub-clusters (greedy learned policy vs the FGD expert, same seeds)


def quick_eval(net: PolicyNet, cfg: TrainConfig) -> dict[str, float]:
    net.eval()
    scorer = torch_scorer(net)
    from agmarl_common.core.policies.fgd import FgdPolicy

    ours, fgd = [], []
    for workload in cfg.eval.workloads:
        for seed in cfg.eval.sub_seeds:
            for which, out in (("model", ours), ("fgd", fgd)):
                rng = np.random.default_rng(seed)
                nodes = sub_cluster(openb_nodes(), cfg.eval.sub_nodes, rng)
                kw = {"scorer": scorer} if which == "model" else {"expert": FgdPolicy()}
                out.append(run_inflation_episode(nodes, openb_pods(workload), rng, record_prob=0.0, **kw).alloc_at_100)
    return {"alloc_at_100": float(np.mean(ours)), "fgd_alloc_at_100": float(np.mean(fgd))}


# ---------------------------------------------------------------------------------------------
# Phase 1: imitation


def imitation_step(model, net: PolicyNet, opt: torch.optim.Optimizer,
                   batch: Sequence[Sample], logit_penalty: float = 0.0) -> tuple[torch.Tensor, float]:
    """One optimiser step of imitation cross-entropy on ``batch``: the loss from ``model`` (``net`` or its
    DDP wrapper), ``net``'s gradients clipped to norm 1. Returns ``imitation_loss``'s (loss, accuracy)."""
    loss, acc = imitation_loss(model, batch, logit_penalty)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    return loss, acc


def train_imitation(net: PolicyNet, cfg: TrainConfig, log: MetricsLog, rng: np.random.Generator,
                    wrap=None) -> dict[str, float]:
    """Collect expert samples, then ``epochs`` passes of minibatch cross-entropy. ``wrap`` (DDP) optional."""
    ic = cfg.imitation
    results = run_tasks(expert_tasks(cfg, rng), cfg.workers)
    samples = [s for episode, _ in results for s in episode]
    samples = samples[:common_count(len(samples))]  # equal steps on every rank
    if not samples:
        raise RuntimeError("imitation: the experts produced no samples (clusters too small?)")
    model = wrap(net) if wrap is not None else net
    opt = torch.optim.Adam(net.parameters(), lr=ic.lr)
    steps = ic.epochs * ((len(samples) + ic.batch_graphs - 1) // ic.batch_graphs)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1))
    step, last = 0, {}
    net.train()
    with tqdm(total=steps, desc="imitation", leave=False, mininterval=2.0) as bar:
        for _ in range(ic.epochs):
            for idx in minibatches(len(samples), ic.batch_graphs, rng):
                loss, acc = imitation_step(model, net, opt, [samples[i] for i in idx], ic.logit_penalty)
                sched.step()
                step += 1
                last = {"loss": loss.item(), "accuracy": acc}
                log.row(phase="imitation", step=step, lr=sched.get_last_lr()[0], **last)
                bar.update(1)
                bar.set_postfix(loss=f"{last['loss']:.3f}", acc=f"{acc:.2f}")
    last["samples"] = len(samples)
    return last


# ---------------------------------------------------------------------------------------------
# Phase 2: PPO with the centralised critic


def gae(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """Generalised advantage estimates over one concatenated sequence of episodes."""
    adv = np.zeros_like(rewards)
    last = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        nxt = 0.0 if dones[t] or t == len(rewards) - 1 else values[t + 1]
        carry = 0.0 if dones[t] else last
        delta = rewards[t] + gamma * nxt - values[t]
        last = delta + gamma * lam * carry
        adv[t] = last
    return adv


def ppo_terms(net, samples: Sequence[Sample]):
    """(joint log-prob per graph (G,), mean per-pod entropy, values (G,)) under the current networks."""
    batch = collate([s.graph for s in samples])
    logits, values = net(batch, with_value=True)
    logp = segment_log_softmax(logits, batch["cand_pod"], int(batch["n_pods"]))
    edges, pods = action_edges(samples, batch)
    joint = torch.zeros(len(samples)).index_add(0, batch["pod_batch"][pods], logp[edges])
    ent_pod = torch.zeros(int(batch["n_pods"])).index_add(0, batch["cand_pod"], -logp.exp() * logp)
    return joint, ent_pod.mean(), values


def ppo_update(net: PolicyNet, opt, samples: list[Sample], cfg: TrainConfig, log: MetricsLog, step: int,
               rng: np.random.Generator, wrap=None, critic_only: bool = False) -> int:
    rc = cfg.rl
    model = wrap(net) if wrap is not None else net
    with torch.no_grad():
        values = np.concatenate([ppo_terms(net, samples[i:i + 256])[2].numpy() for i in range(0, len(samples), 256)])
    rewards = np.array([s.reward for s in samples]) * rc.reward_scale
    dones = np.array([s.done for s in samples])
    adv = gae(rewards, values, dones, rc.gamma, rc.gae_lambda)
    returns = adv + values
    old_logp = np.array([s.logp for s in samples])
    net.train()
    for _ in range(rc.ppo_epochs):
        for idx in minibatches(len(samples), rc.batch_graphs, rng):
            logp, entropy, value = ppo_terms(model, [samples[i] for i in idx])
            a = torch.as_tensor(adv[idx], dtype=torch.float32)
            a = (a - a.mean()) / (a.std() + 1e-8) if len(idx) > 1 else a
            ratio = torch.exp(logp - torch.as_tensor(old_logp[idx], dtype=torch.float32))
            pg = -torch.min(ratio * a, torch.clamp(ratio, 1 - rc.clip, 1 + rc.clip) * a).mean()
            vl = 0.5 * ((value - torch.as_tensor(returns[idx], dtype=torch.float32)) ** 2).mean()
            loss = rc.value_coef * vl if critic_only else pg + rc.value_coef * vl - rc.entropy_coef * entropy
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), rc.max_grad_norm)
            opt.step()
            step += 1
            with torch.no_grad():
                kl = float((torch.as_tensor(old_logp[idx], dtype=torch.float32) - logp).mean())
            log.row(phase="rl", step=step, loss=loss.item(), policy_loss=pg.item(), value_loss=vl.item(),
                    entropy=entropy.item(), approx_kl=kl, lr=rc.lr)
    return step


def rl_tasks(cfg: TrainConfig, rng: np.random.Generator) -> list[EpisodeTask]:
    rc, sim = cfg.rl, cfg.sim
    tasks = [EpisodeTask("inflation", cfg.train_workloads[int(rng.integers(len(cfg.train_workloads)))],
                         int(rng.integers(sim.nodes_min, sim.nodes_max + 1)), int(rng.integers(2**31)),
                         rc.record_prob, sample=True, beta=rc.beta) for _ in range(rc.episodes_per_iter)]
    tasks += [EpisodeTask("dynamic", sim.dynamic_workloads[k % len(sim.dynamic_workloads)], sim.dynamic_nodes,
                          int(rng.integers(2**31)), rc.record_prob, sample=True, horizon_s=sim.dynamic_horizon_s,
                          tick_s=sim.dynamic_tick_s) for k in range(rc.dynamic_episodes_per_iter)]
    return tasks


def train_rl(net: PolicyNet, cfg: TrainConfig, log: MetricsLog, rng: np.random.Generator, deadline: float,
             wrap=None) -> dict[str, float]:
    rc = cfg.rl
    opt = torch.optim.Adam(net.parameters(), lr=rc.lr)
    step, last = 0, {}
    for it in tqdm(range(rc.iterations), desc="ppo", leave=False, mininterval=2.0):
        if common_count(int(time.monotonic() <= deadline)) == 0:  # any rank out of time: all stop
            last["stopped_early_at_iteration"] = it
            break
        state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        results = run_tasks(rl_tasks(cfg, rng), cfg.workers, state, cfg.net)
        samples = [s for episode, _ in results for s in episode]
        samples = samples[:common_count(len(samples))]
        stats = [st for _, st in results]
        ret = float(np.mean([st["return"] for st in stats]))
        allocs = [st["alloc_at_100"] for st in stats if "alloc_at_100" in st]
        log.row(phase="rollout", step=step, episode_return=ret,
                alloc_at_100=float(np.mean(allocs)) if allocs else "")
        if samples:
            step = ppo_update(net, opt, samples, cfg, log, step, rng, wrap, critic_only=it < rc.critic_warmup)
        last = {"episode_return": ret, "iterations": it + 1}
    return last


# ---------------------------------------------------------------------------------------------
# The whole run


def set_seed(seed: int) -> np.random.Generator:
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def train(cfg: TrainConfig, out_dir: str | Path, *, wrap=None, rank: int = 0) -> TrainResult:
    """Imitation (or the weights of ``search.start``), then search-based improvement (``search.py``) and/or
    PPO, checkpoints in ``out_dir``; rank 0 writes files, every rank trains."""
    t0 = time.monotonic()
    out = Path(out_dir)
    torch.set_num_threads(max(1, cfg.torch_threads))
    rng = set_seed(cfg.seed + rank)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    net = PolicyNet(cfg.net)
    log = MetricsLog(out / ("metrics.csv" if rank == 0 else f"metrics.rank{rank}.csv"))
    history: dict[str, list] = {}
    try:
        if cfg.search.start:  # from a trained model: its weights and network shape, no imitation phase
            net, cfg = load_start(cfg)
            history["start"] = [cfg.search.start]
        else:
            history["imitation"] = [train_imitation(net, cfg, log, rng, wrap)]
            if rank == 0:
                torch.save({"state_dict": net.state_dict(), "net": cfg.net, "phase": "imitation"}, out / "imitation.pt")
        if cfg.search.iterations > 0:  # keeps its best iteration on held-out seeds, the start on a tie
            if wrap is not None:
                raise ValueError("search: one process only (no --distributed)")
            if cfg.search.protocol == "dynamic":  # the regime experts: composite reward in the dynamic simulator
                report = train_search_dynamic(net, cfg, log, rng, t0 + cfg.time_budget_s)
                ev = {"reward_total": report["kept_held_out"], "reference_reward_total": report["reference_held_out"]}
            else:
                report = train_search(net, cfg, log, rng, t0 + cfg.time_budget_s)
                ev = {"alloc_at_100": report["kept_held_out"], "fgd_alloc_at_100": report["fgd_held_out"]}
            history["search"] = [report]
            kept = report["kept_iteration"]
            history["kept"] = ["start" if kept == 0 else f"search iteration {kept}"]
            history["eval_after_search"] = [ev]
        else:
            ev = quick_eval(net, cfg)
            history["eval_after_imitation"] = [ev]
        log.row(phase="eval", step=0, **ev)
        before_rl = {k: v.detach().clone() for k, v in net.state_dict().items()}
        if cfg.rl.iterations > 0:
            deadline = t0 + cfg.time_budget_s
            history["rl"] = [train_rl(net, cfg, log, rng, deadline, wrap)]
            ev_rl = quick_eval(net, cfg)
            log.row(phase="eval", step=1, **ev_rl)
            history["eval_after_rl"] = [ev_rl]
            if ev_rl["alloc_at_100"] < ev["alloc_at_100"]:  # keep the better phase (same decision on every rank)
                net.load_state_dict(before_rl)
                history["kept"] = history.get("kept", ["imitation"])
            else:
                ev = ev_rl
                history["kept"] = ["rl"]
        if rank == 0:
            torch.save({"state_dict": net.state_dict(), "net": cfg.net, "config": config_to_dict(cfg)},
                       out / "model.pt")
    finally:
        log.close()
    result = TrainResult(net=net.eval(), out_dir=out, history=history, eval=ev, seconds=time.monotonic() - t0,
                         config=cfg)
    if rank == 0:
        (out / "history.json").write_text(json.dumps(history, indent=2, default=str) + "\n")
    return result


def load_start(cfg: TrainConfig) -> tuple[PolicyNet, TrainConfig]:
    """(network with the weights of ``cfg.search.start``: a model folder's ``model.pt`` or a checkpoint path,
    the config with that network's shape)."""
    path = Path(cfg.search.start)
    ckpt = torch.load(path / "model.pt" if path.is_dir() else path, weights_only=False)
    net = PolicyNet(ckpt["net"])
    net.load_state_dict(ckpt["state_dict"])
    return net, dataclasses.replace(cfg, net=ckpt["net"])


def load_checkpoint(path: str | Path) -> PolicyNet:
    ckpt = torch.load(path, weights_only=False)
    net = PolicyNet(ckpt["net"])
    net.load_state_dict(ckpt["state_dict"])
    return net.eval()
