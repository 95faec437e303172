"""Search-based improvement in the dynamic simulator with the composite reward (the regime experts).

The inflation protocol's expert iteration (``search.py``) scores a candidate by the GPU milli a rollout
allocates; the regime experts are judged on the composite reward over time in the dynamic simulator
(``benchmarks/regime_shift.py``), so here (``search.protocol: dynamic``):

1. **Episodes** (worker processes, one torch thread each): the dynamic simulator on a synthetic cluster of
   ``sim.dynamic_nodes`` nodes and a workload of ``sim.dynamic_workloads`` (``sim.dynamic_horizon_s``,
   ticks of ``sim.dynamic_tick_s``; pending timeout 300 s and backoff as in the regime-shift benchmark),
   the current policy placing the queue in order, greedily, over the candidates it admits (``admission:
   capped``: the load cap, ``policies.loadcap``, as ``capped:model:...`` runs it). At ``decisions`` ticks,
   drawn uniformly among those in ``window`` (shares of the horizon), the first queued pod with two or more
   admitted candidates is searched: the policy's ``top_k`` candidates are each tried: bind the pod there,
   then ``rollout_policy`` (a registry name, e.g. ``reward-aware``) schedules the rest of that pass and
   every tick for ``horizon`` seconds; a candidate's value is the fixed-scheme reward summed over the
   rollout's 10 s windows (the benchmark's windows: components of the state and the window's outcomes).
   The simulator's randomness is keyed by (seed, step), so the candidates of one decision see the same
   arrivals, failures and evictions: the comparison is paired. The label is the best candidate, the
   policy's own pick on a tie. As many ticks again give unlabelled states (the KL anchor's).
2. **Distillation**: ``search.distill`` (cross-entropy on the labels + ``anchor`` * KL to the start, the
   ``kl_max`` trust region).
3. **Held-out evaluation** after every iteration: the greedy policy (with its admission) over whole
   episodes on ``eval.sub_seeds`` (seeds the training episodes never draw), each ``sim.dynamic_workloads``
   workload: the fixed-scheme reward summed over the episode's 10 s windows; the rollout policy on the same
   episodes once, as the reference.
4. **Keep the best**: the iteration with the highest held-out mean, the start on a tie.
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from agmarl_common.core.features import FeatureContext, build_graph
from agmarl_common.core.policies.base import brief
from agmarl_common.core.policies.loadcap import LoadCapPolicy
from agmarl_common.core.reward import RewardScheme, cluster_load, outcomes_from_stats, reward_components, scheme_total
from agmarl_common.core.sim import dynamic, synthetic
from agmarl_trainer.config import TrainConfig
from agmarl_trainer import imitation
from agmarl_trainer.procs import pool_worker
from agmarl_trainer.imitation import expert_policy
from agmarl_trainer.model import PolicyNet
from agmarl_trainer.rollout import LearnedPolicy, Sample, torch_scorer
from agmarl_trainer.search import expert_iteration

RECORD_S = 10.0  # reward window (the regime-shift benchmark's --record)
SCHEME = RewardScheme("fixed")


@dataclass(frozen=True)
class DynamicSearchTask:
    """One episode of synthetic ``workload`` on ``n_nodes`` nodes drawn from ``seed``; ``policy`` "" = the
    current weights (searched at ``decisions`` ticks), else a registry policy (a reference, no search)."""

    workload: str
    n_nodes: int
    seed: int
    horizon_s: float
    tick_s: float
    decisions: int = 0
    window: tuple[float, ...] = (0.0, 1.0)
    top_k: int = 4
    rollout_s: float = 60.0
    rollout_policy: str = "reward-aware"
    admission: str = ""  # "capped": the load cap on the learned policy's candidates
    policy: str = ""


class Windows:
    """The fixed-scheme reward of each ``RECORD_S`` window, summed (as ``regime_shift.run`` records it)."""

    def __init__(self, state: dynamic.SimState):
        self.prev = dynamic.snapshot_stats(state)
        self.total = 0.0

    def record(self, state: dynamic.SimState) -> None:
        stats = dynamic.snapshot_stats(state)
        outcomes = outcomes_from_stats(self.prev, stats, dynamic.mean_pending_wait(state))
        self.prev = stats
        self.total += scheme_total(reward_components(state.cluster, outcomes), SCHEME, cluster_load(state.cluster))


def _recording(state: dynamic.SimState, tick_s: float) -> bool:
    k = int(round(state.time / tick_s))
    return k % max(1, int(round(RECORD_S / tick_s))) == 0


def rollout_value(state: dynamic.SimState, pod, node: int, gpus: tuple[int, ...], config, retry: dict, rollout,
                  rollout_s: float, tick_s: float) -> float:
    """Bind queued ``pod`` on ``node``, let ``rollout`` schedule the rest of the pass and ``rollout_s`` seconds of
    ticks: the reward of the windows recorded meanwhile."""
    windows = Windows(state)
    retry = dict(retry)
    state, outcome = dynamic.bind(state, pod.key, state.cluster.nodes[node].name, tuple(gpus))
    if outcome.ok:
        retry.pop(pod.key, None)
    state = dynamic.schedule_pending(rollout, state, config, retry)
    for _ in range(max(1, int(math.ceil(rollout_s / tick_s - 1e-9)))):
        state, _ = dynamic.advance(state, tick_s, config)
        state = dynamic.schedule_pending(rollout, state, config, retry)
        if _recording(state, tick_s):
            windows.record(state)
    return windows.total


def improve(state, pod, cand: np.ndarray, logits: np.ndarray, choose_gpus, config, retry: dict, rollout,
            top_k: int, rollout_s: float, tick_s: float) -> tuple[int, float]:
    """(index into ``cand`` of the best of the policy's ``top_k`` after a rollout each, its reward over the
    policy's own pick); the policy's pick is tried first and wins ties."""
    order = np.argsort(-logits, kind="stable")[:top_k]
    best_k, best_v, own = int(order[0]), -math.inf, None
    for k in order:
        node = int(cand[k])
        v = rollout_value(state, pod, node, choose_gpus(pod, state.cluster, node), config, retry, rollout,
                          rollout_s, tick_s)
        own = v if own is None else own
        if v > best_v:
            best_k, best_v = int(k), v
    return best_k, best_v - own


class Searcher:
    """The current policy as ``dynamic.schedule_pending`` runs it (``policy``'s admission and GPU choice, the
    scorer's logits), searching the first queued pod with two or more candidates at a tick of ``points``
    (a labelled sample) or of ``anchors`` (an unlabelled one). ``schedule_pending`` shows it each state
    (``observe_sim``) before asking for scores; ``tick`` is set by the episode."""

    def __init__(self, policy, scorer, ctx: FeatureContext, rollout, task: DynamicSearchTask, retry: dict,
                 points: set, anchors: set):
        self.policy, self.scorer, self.ctx, self.rollout, self.task, self.retry = policy, scorer, ctx, rollout, task, retry
        self.points, self.anchors = points, anchors
        self.tick, self.done_tick, self.state, self.config = 0, -1, None, None
        self.samples: list[Sample] = []
        self.stats = {"searched": 0.0, "changed": 0.0, "gain": 0.0}

    def observe_sim(self, state: dynamic.SimState, config: dynamic.SimConfig) -> None:
        self.state, self.config = state, config

    def score(self, pod, cluster, cand: np.ndarray) -> np.ndarray:
        graph = build_graph([pod], cluster, [np.asarray(cand, np.int64)], self.ctx)
        logits = np.asarray(self.scorer(graph), np.float64)
        due = self.tick in self.points or self.tick in self.anchors
        if due and self.done_tick != self.tick and len(cand) > 1:
            self.done_tick = self.tick
            if self.tick in self.points:
                t = self.task
                label, gain = improve(self.state, pod, np.asarray(cand), logits, self.policy.choose_gpus, self.config,
                                      self.retry, self.rollout, t.top_k, t.rollout_s, t.tick_s)
                self.samples.append(Sample(graph, np.array([label], np.int64)))
                self.stats["searched"] += 1
                self.stats["changed"] += float(label != int(np.argmax(logits)))
                self.stats["gain"] += gain
            else:
                self.samples.append(Sample(graph, np.array([-1], np.int64)))
        return logits  # the episode follows the current policy (its states are the ones it visits)

    def __getattr__(self, attr: str):  # admit, admission_reason, choose_gpus, name: the policy's
        if attr == "policy":
            raise AttributeError(attr)
        return getattr(self.policy, attr)


def episode_config(task: DynamicSearchTask) -> dynamic.SimConfig:
    """Ticks and horizon of the task, pending timeout 300 s, backoff up to 10 s; a pressure variant's own
    simulator settings on top (``synthetic.sim_options``: its scripted node loss), none for the others."""
    options = {"pending_timeout_s": 300.0, **synthetic.sim_options(task.workload, task.horizon_s)}
    return dynamic.SimConfig(tick_s=task.tick_s, horizon_s=task.horizon_s, backoff_max_s=10.0, **options)


def episode(task: DynamicSearchTask) -> tuple[list[Sample], dict[str, float]]:
    """One episode -> (labelled and anchor samples, stats with ``reward_total``)."""
    rng = np.random.default_rng(task.seed)
    nodes = synthetic.synthetic_cluster(task.n_nodes, seed=task.seed)
    pods = synthetic.generate(task.workload, nodes, horizon_s=task.horizon_s, seed=task.seed)
    config = episode_config(task)
    n_ticks = int(math.ceil(task.horizon_s / task.tick_s - 1e-9))
    retry: dict = {}
    searcher = None
    if task.policy:
        policy = expert_policy(task.policy, task.seed)
        brief(policy, pods, dynamic.OBJECTIVE)
    else:
        ctx = FeatureContext.from_workload(pods, dynamic.OBJECTIVE)
        scorer = torch_scorer(imitation._NET)
        learned = LearnedPolicy(scorer, ctx)
        learned = LoadCapPolicy(learned) if task.admission == "capped" else learned
        rollout = expert_policy(task.rollout_policy, task.seed)
        brief(rollout, pods, dynamic.OBJECTIVE)
        lo = int(task.window[0] * n_ticks)
        ticks = rng.permutation(np.arange(lo + 1, max(lo + 1, int(task.window[1] * n_ticks)) + 1)).tolist()
        policy = searcher = Searcher(learned, scorer, ctx, rollout, task, retry, set(ticks[:task.decisions]),
                                     set(ticks[task.decisions:2 * task.decisions]))
    state = dynamic.reset(nodes, pods, config, task.seed)
    windows = Windows(state)
    for k in range(1, n_ticks + 1):
        state, _ = dynamic.advance(state, task.tick_s, config)
        if searcher is not None:
            searcher.tick = k
        state = dynamic.schedule_pending(policy, state, config, retry)
        if _recording(state, task.tick_s):
            windows.record(state)
    if searcher is None:
        return [], {"reward_total": windows.total}
    return searcher.samples, {**searcher.stats, "reward_total": windows.total}


def run_episodes(tasks: Sequence[DynamicSearchTask], workers: int, state_dict: dict | None,
                 net_cfg) -> list[tuple[list[Sample], dict[str, float]]]:
    """Episodes in ``workers`` processes (in-process when workers <= 1), results in task order."""
    if workers <= 1:
        imitation.init_worker(state_dict, net_cfg)
        return [episode(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=workers, initializer=pool_worker, initargs=(imitation.init_worker, state_dict, net_cfg)) as pool:
        return list(pool.map(episode, tasks))


def _task(cfg: TrainConfig, workload: str, seed: int, **kw) -> DynamicSearchTask:
    sc, sim = cfg.search, cfg.sim
    return DynamicSearchTask(workload, sim.dynamic_nodes, seed, sim.dynamic_horizon_s, sim.dynamic_tick_s,
                             window=tuple(sc.window), top_k=sc.top_k, rollout_s=float(sc.horizon),
                             rollout_policy=sc.rollout_policy, admission=sc.admission, **kw)


def training_tasks(cfg: TrainConfig, rng: np.random.Generator) -> list[DynamicSearchTask]:
    w = cfg.sim.dynamic_workloads
    return [_task(cfg, w[k % len(w)], int(rng.integers(2**31)), decisions=cfg.search.decisions)
            for k in range(cfg.search.episodes_per_iter)]


def held_out(state_dict: dict | None, cfg: TrainConfig, policy: str = "") -> list[float]:
    """The reward total per held-out (workload, seed) of the greedy current policy, or of ``policy``."""
    tasks = [_task(cfg, w, s, policy=policy) for w in cfg.sim.dynamic_workloads for s in cfg.eval.sub_seeds]
    return [st["reward_total"] for _, st in run_episodes(tasks, cfg.workers, state_dict, cfg.net)]


def train_search_dynamic(net: PolicyNet, cfg: TrainConfig, log, rng: np.random.Generator, deadline: float) -> dict:
    """Expert iteration (``search.expert_iteration``) from ``net``'s weights in the dynamic simulator; leaves
    ``net`` at the best iteration's weights (held-out reward total, the start on a tie). Returns the report:
    learning curve, kept iteration, per-seed held-out totals, the reference's, the training seeds."""
    sc = cfg.search
    reference = held_out(None, cfg, policy=sc.rollout_policy)

    def row(stats, labels):
        return {"gain_per_label": round(sum(st["gain"] for st in stats) / max(labels, 1), 4),
                "train_reward_total": round(float(np.mean([st["reward_total"] for st in stats])), 3)}

    report = expert_iteration(
        net, cfg, log, rng, deadline, tasks=training_tasks,
        run=lambda batch, state: run_episodes(batch, cfg.workers, state, cfg.net),
        held_out=lambda state: held_out(state, cfg), row=row,
        log_fields=lambda score: {"episode_return": score})
    return {"protocol": "dynamic", **report, "reference": sc.rollout_policy,
            "reference_held_out": round(float(np.mean(reference)), 3),
            "reference_per_seed": [round(x, 3) for x in reference],
            "held_out_seeds": list(cfg.eval.sub_seeds), "held_out_workloads": list(cfg.sim.dynamic_workloads),
            "kl_max": sc.kl_max}
