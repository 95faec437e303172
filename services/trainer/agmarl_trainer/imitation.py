"""Imitation warm start: collect expert decisions in parallel workers, fit the actor by cross-entropy.

Expert data: the FGD policy on the inflation protocol (openb sub-clusters of ``nodes_min..nodes_max``
nodes sampled from the openb node list, pods from the openb pod lists), and a kube-scheduler baseline on
dynamic synthetic workloads. Loss per pending pod: cross-entropy between the softmax of its candidate
logits and the candidate the expert chose.
"""

from __future__ import annotations

import functools
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from agmarl_common.core.policies.fgd import FGD_PAPER_POLICIES
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import dynamic, synthetic, traces
from agmarl_trainer.procs import pool_worker
from agmarl_trainer.rollout import Sample, action_edges, collate, run_dynamic_episode, run_inflation_episode, \
    segment_log_softmax, sub_cluster


@dataclass(frozen=True)
class EpisodeTask:
    """What a worker runs: one episode of ``protocol`` ('inflation' | 'dynamic')."""

    protocol: str
    workload: str  # openb pod list name, or synthetic workload name
    n_nodes: int
    seed: int
    record_prob: float
    expert: str = ""  # policy registry name; "" = the learned policy (weights from the pool initializer)
    sample: bool = False
    beta: float = 1.0
    horizon_s: float = 600.0
    tick_s: float = 5.0


def expert_policy(name: str, seed: int):
    """A baseline by name: the FGD paper's policies (fgd, bestfit, ...) or any registered policy."""
    if name in FGD_PAPER_POLICIES:
        return FGD_PAPER_POLICIES[name](seed)
    return get_policy(name, seed)


@functools.lru_cache(maxsize=None)
def openb_nodes():
    return traces.load_openb_nodes()


@functools.lru_cache(maxsize=None)
def openb_pods(workload: str):
    return traces.load_openb_pods(traces.openb_pod_path(workload))


_NET = None  # the learned policy inside a worker process (set by ``init_worker``)


def init_worker(state_dict: dict | None = None, net_cfg=None) -> None:
    """Pool initializer: one torch thread per worker, and the current policy weights when given."""
    global _NET
    torch.set_num_threads(1)
    if state_dict is not None:
        from agmarl_trainer.model import PolicyNet

        _NET = PolicyNet(net_cfg)
        _NET.load_state_dict(state_dict)
        _NET.eval()


def run_task(task: EpisodeTask) -> tuple[list[Sample], dict[str, float]]:
    """One episode; returns its samples and summary stats (runs in a worker process)."""
    from agmarl_trainer.rollout import torch_scorer

    rng = np.random.default_rng(task.seed)
    expert = expert_policy(task.expert, task.seed) if task.expert else None
    scorer = None if expert is not None else torch_scorer(_NET)
    if task.protocol == "inflation":
        nodes = sub_cluster(openb_nodes(), task.n_nodes, rng)
        ep = run_inflation_episode(nodes, openb_pods(task.workload), rng, expert=expert, scorer=scorer,
                                   sample=task.sample, record_prob=task.record_prob, beta=task.beta)
        return ep.samples, {"alloc_at_100": ep.alloc_at_100, "alloc_final": ep.alloc_final,
                            "return": float(sum(s.reward for s in ep.samples))}
    if task.protocol == "dynamic":
        nodes = synthetic.synthetic_cluster(task.n_nodes, seed=task.seed)
        pods = synthetic.generate(task.workload, nodes, horizon_s=task.horizon_s, seed=task.seed)
        cfg = dynamic.SimConfig(tick_s=task.tick_s, horizon_s=task.horizon_s)
        samples, stats = run_dynamic_episode(nodes, pods, task.seed, cfg, expert=expert, scorer=scorer,
                                             sample=task.sample, rng=rng, record_prob=task.record_prob)
        stats["return"] = float(sum(s.reward for s in samples))
        return samples, stats
    raise ValueError(f"unknown protocol {task.protocol!r}")


def run_tasks(tasks: Sequence[EpisodeTask], workers: int, state_dict: dict | None = None,
              net_cfg=None) -> list[tuple[list[Sample], dict[str, float]]]:
    """Episodes in ``workers`` processes (in-process when workers <= 1), results in task order."""
    if workers <= 1:
        init_worker(state_dict, net_cfg)
        return [run_task(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=workers, initializer=pool_worker,
                             initargs=(init_worker, state_dict, net_cfg)) as pool:
        return list(pool.map(run_task, tasks))


def expert_tasks(cfg, rng: np.random.Generator) -> list[EpisodeTask]:
    """Imitation episodes of a ``TrainConfig``: inflation over the training workloads, then dynamic ones."""
    tasks = []
    for k in range(cfg.imitation.episodes):
        tasks.append(EpisodeTask("inflation", cfg.train_workloads[k % len(cfg.train_workloads)],
                                 int(rng.integers(cfg.sim.nodes_min, cfg.sim.nodes_max + 1)),
                                 int(rng.integers(2**31)), cfg.imitation.record_prob, expert=cfg.imitation.expert))
    for k in range(cfg.imitation.dynamic_episodes):
        tasks.append(EpisodeTask("dynamic", cfg.sim.dynamic_workloads[k % len(cfg.sim.dynamic_workloads)],
                                 cfg.sim.dynamic_nodes, int(rng.integers(2**31)), cfg.imitation.record_prob,
                                 expert=cfg.imitation.dynamic_expert, horizon_s=cfg.sim.dynamic_horizon_s,
                                 tick_s=cfg.sim.dynamic_tick_s))
    return tasks


def minibatches(n: int, size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    order = rng.permutation(n)
    for i in range(0, n, size):
        yield order[i:i + size]


def imitation_loss(net, samples: Sequence[Sample], logit_penalty: float = 0.0) -> tuple[torch.Tensor, float]:
    """(mean cross-entropy over pods that acted + ``logit_penalty`` * mean squared logit, accuracy of the
    argmax) of a minibatch."""
    batch = collate([s.graph for s in samples])
    logits = net(batch)  # (E,)
    logp = segment_log_softmax(logits, batch["cand_pod"], int(batch["n_pods"]))
    edges, pods = action_edges(samples, batch)
    loss = -logp[edges].mean()
    if logit_penalty > 0:
        loss = loss + logit_penalty * (logits ** 2).mean()
    with torch.no_grad():
        best = torch.full((int(batch["n_pods"]),), -float("inf")).scatter_reduce(0, batch["cand_pod"], logits, "amax")
        acc = float((logits[edges] >= best[pods]).float().mean())
    return loss, acc
