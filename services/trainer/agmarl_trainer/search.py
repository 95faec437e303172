"""Search-based policy improvement (expert iteration) on the inflation protocol, top to bottom.

config (``config.SearchConfig``) -> simulator episodes with searched decision points -> distillation with
an anchor to the start model -> held-out evaluation per iteration -> the best iteration kept.

1. **Episodes** (worker processes, one torch thread each): the inflation protocol on an openb sub-cluster
   (``sim.nodes_min..nodes_max`` nodes sampled from the trace, a training pod list), the current policy
   placing every pod greedily. At ``decisions`` decision points, drawn uniformly among the arrivals made
   while ``window`` of the GPU capacity had arrived, the policy's ``top_k`` candidates are each tried: bind
   the pod there, then a rollout places the next pods with ``rollout_policy`` (FGD with the packing
   tie-break by default, or the current model) until 100 % of the GPU capacity has arrived or ``horizon``
   pods have. The arrivals are the episode's own (they do not depend on the policy). A candidate's value
   is the GPU milli allocated during the rollout (the inflation protocol's objective: allocated = arrived -
   dropped); with ``frag_tiebreak``, then the lower cluster fragmentation (FGD's measure) at its end. The
   label is the best candidate; the policy's own pick wins a tie, so a label differs from the policy only
   where the search found strictly better. (Ordering equal allocations by end fragmentation changed ~60 %
   of the labels and made the policy worse on held-out seeds: docs/model.md.)
   As many states again, drawn over the whole episode, are kept without a label: the anchor's states.
2. **Distillation**: cross-entropy of the per-pod candidate softmax on the improved labels (and on the
   caller's ``extra`` labelled samples: the fine-tune's recorded decisions) + ``anchor`` * KL(pi_start || pi)
   per pod over the labelled and the anchor states (all iterations', ``buffer`` newest) + the imitation
   ``logit_penalty``.
   Trust region: every 8 steps the mean KL to the start model is measured on a fixed probe of 512 of the
   samples; past ``kl_max`` the weights go back to the last check inside it and the iteration's
   distillation stops, so the probe's KL stays <= kl_max. (A check per epoch was too coarse: one epoch
   went from KL 0.05 to past 0.3, was undone, and every later iteration undid its first epoch too.)
3. **Held-out evaluation** after every iteration (and of the start, iteration 0): greedy policy on the
   sub-clusters of ``eval.sub_seeds`` (``eval_nodes`` or ``eval.sub_nodes`` nodes; seeds the training
   episodes never draw: theirs come from the run's rng), pod lists ``eval.workloads``, GPU allocation at
   100 % arrived; FGD on the same seeds once, as a reference.
4. **Keep the best**: the weights of the iteration with the highest held-out mean; the start keeps a tie,
   so the result is never worse than the start on the held-out seeds.
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from agmarl_common.core.cluster.filters import feasible_mask
from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Pod, bind
from agmarl_common.core.features import FeatureContext, build_graph, device_for
from agmarl_common.core.sim import inflation
from agmarl_common.core.sim.inflation import inflate_workload, pick_node
from agmarl_trainer.config import TrainConfig
from agmarl_trainer.imitation import EpisodeTask, expert_policy, minibatches, openb_nodes, openb_pods, run_tasks
from agmarl_trainer.model import PolicyNet
from agmarl_trainer.rollout import Sample, action_edges, collate, segment_log_softmax, sub_cluster, torch_scorer
from agmarl_trainer.procs import pool_worker

# ---------------------------------------------------------------------------------------------
# 1. Episodes with searched decision points (worker processes)


@dataclass(frozen=True)
class SearchTask:
    """One episode: openb pod list ``workload`` on a sub-cluster of ``n_nodes`` drawn from ``seed``."""

    workload: str
    n_nodes: int
    seed: int
    decisions: int
    window: tuple[float, ...]
    top_k: int
    horizon: int
    rollout_policy: str
    frag_tiebreak: bool = False


_NET: PolicyNet | None = None  # the current policy inside a worker process (``init_worker``)


def init_worker(state_dict: dict, net_cfg) -> None:
    """Pool initializer: one torch thread, the current weights."""
    global _NET
    torch.set_num_threads(1)
    _NET = PolicyNet(net_cfg)
    _NET.load_state_dict(state_dict)
    _NET.eval()


class Rollout:
    """Places a sequence of arrivals from a state with a fixed policy; returns (GPU milli allocated,
    -fragmentation at the end): larger is better, compared lexicographically."""

    def __init__(self, name: str, workload: Sequence[Pod], ctx: FeatureContext, rank: np.ndarray, scorer):
        self.ctx, self.rank, self.scorer = ctx, rank, scorer
        self.policy = None if name == "model" else expert_policy(name, 0)
        if self.policy is not None and callable(getattr(self.policy, "observe_workload", None)):
            self.policy.observe_workload(workload)

    def place(self, pod: Pod, state: ClusterState, cand: np.ndarray) -> tuple[int, tuple[int, ...]]:
        if self.policy is None:
            logits = self.scorer(build_graph([pod], state, [cand], self.ctx))
            i = int(cand[int(np.argmax(logits))])
            return i, tuple(device_for(pod, state, i, self.ctx))
        i = pick_node(np.asarray(self.policy.score(pod, state, cand), np.float64), cand, self.rank)
        return i, tuple(self.policy.choose_gpus(pod, state, i))

    def value(self, state: ClusterState, future: Sequence[Pod], budget_milli: int, horizon: int) -> tuple[int, float]:
        placed = arrived = 0
        for pod in future[:horizon]:
            if budget_milli > 0 and arrived >= budget_milli:
                break
            arrived += pod.gpu_milli_total
            cand = np.flatnonzero(feasible_mask(pod, state))
            if cand.size:
                i, gpus = self.place(pod, state, cand)
                state = bind(state, pod, i, gpus)
                placed += pod.gpu_milli_total
        return placed, -float(self.ctx.node_frag(state).sum())


def improve(pod: Pod, state: ClusterState, cand: np.ndarray, logits: np.ndarray, future: Sequence[Pod],
            budget_milli: int, rollout: Rollout, top_k: int, horizon: int,
            frag_tiebreak: bool = False) -> tuple[int, int]:
    """(index into ``cand`` of the best of the policy's ``top_k`` candidates after a rollout each, GPU milli
    it allocates over the policy's own pick). The policy's pick is tried first and wins ties; with
    ``frag_tiebreak`` equal allocations are ordered by the end fragmentation first."""
    order = np.argsort(-logits, kind="stable")[:top_k]
    best_k, best_v, own = int(order[0]), None, None
    for k in order:
        i = int(cand[k])
        after = bind(state, pod, i, tuple(device_for(pod, state, i, rollout.ctx)))
        v = rollout.value(after, future, budget_milli, horizon)
        v = v if frag_tiebreak else v[:1]
        own = v if own is None else own
        if best_v is None or v > best_v:
            best_k, best_v = int(k), v
    return best_k, int(best_v[0] - own[0])


def decision_points(arrivals: Sequence[Pod], total_milli: int, window: Sequence[float], n: int,
                    rng: np.random.Generator) -> set[int]:
    """Up to ``n`` arrival indexes drawn uniformly among those made while the arrived GPU share (before the
    arrival) was in [window[0], window[1])."""
    before = np.concatenate([[0], np.cumsum([p.gpu_milli_total for p in arrivals])[:-1]]) / total_milli
    eligible = np.flatnonzero((before >= window[0]) & (before < window[1]))
    if eligible.size == 0 or n <= 0:
        return set()
    return set(int(e) for e in rng.choice(eligible, size=min(n, eligible.size), replace=False))


def search_episode(task: SearchTask) -> tuple[list[Sample], dict[str, float]]:
    """One episode of the current policy with searched decision points -> (labelled samples, stats)."""
    rng = np.random.default_rng(task.seed)
    workload = openb_pods(task.workload)
    state = ClusterState.empty(sub_cluster(openb_nodes(), task.n_nodes, rng))
    total = int(state.gpu_count.sum()) * GPU_MILLI
    arrivals = inflate_workload(workload, total, rng)
    rank = rng.permutation(state.n_nodes)
    ctx = FeatureContext.from_workload(workload, inflation.OBJECTIVE)
    scorer = torch_scorer(_NET)
    rollout = Rollout(task.rollout_policy, workload, ctx, rank, scorer)
    points = decision_points(arrivals, total, task.window, task.decisions, rng)
    anchors = decision_points(arrivals, total, (0.0, 1.0), task.decisions, rng) - points
    samples: list[Sample] = []
    stats = {"searched": 0.0, "changed": 0.0, "gain_milli": 0.0}
    arrived = used = 0
    at_100 = None
    for e, pod in enumerate(arrivals):
        arrived += pod.gpu_milli_total
        cand = np.flatnonzero(feasible_mask(pod, state))
        if cand.size:
            graph = build_graph([pod], state, [cand], ctx)
            logits = scorer(graph)
            own = int(np.argmax(logits))
            if e in points and cand.size > 1:
                label, gain = improve(pod, state, cand, logits, arrivals[e + 1:], total - arrived, rollout,
                                      task.top_k, task.horizon, task.frag_tiebreak)
                samples.append(Sample(graph, np.array([label], np.int64)))
                stats["searched"] += 1
                stats["changed"] += float(label != own)
                stats["gain_milli"] += gain
            elif e in anchors and cand.size > 1:  # no label: the KL anchor's state only
                samples.append(Sample(graph, np.array([-1], np.int64)))
            i = int(cand[own])  # the episode follows the current policy (its states are the ones it visits)
            state = bind(state, pod, i, tuple(device_for(pod, state, i, ctx)))
            used += pod.gpu_milli_total
        if at_100 is None and arrived >= total:
            at_100 = 100.0 * used / total
    stats["alloc_at_100"] = at_100 if at_100 is not None else 100.0 * used / total
    return samples, stats


def run_search_tasks(tasks: Sequence[SearchTask], workers: int, state_dict: dict,
                     net_cfg) -> list[tuple[list[Sample], dict[str, float]]]:
    """Episodes in ``workers`` processes (in-process when workers <= 1), results in task order."""
    if workers <= 1:
        init_worker(state_dict, net_cfg)
        return [search_episode(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=workers, initializer=pool_worker, initargs=(init_worker, state_dict, net_cfg)) as pool:
        return list(pool.map(search_episode, tasks))


def search_tasks(cfg: TrainConfig, rng: np.random.Generator) -> list[SearchTask]:
    sc, sim = cfg.search, cfg.sim
    return [SearchTask(cfg.train_workloads[k % len(cfg.train_workloads)],
                       int(rng.integers(sim.nodes_min, sim.nodes_max + 1)), int(rng.integers(2**31)), sc.decisions,
                       tuple(sc.window), sc.top_k, sc.horizon, sc.rollout_policy, sc.frag_tiebreak)
            for k in range(sc.episodes_per_iter)]


# ---------------------------------------------------------------------------------------------
# 2. Distillation with an anchor to the start model


def pod_kl(logp_start: torch.Tensor, logp: torch.Tensor, cand_pod: torch.Tensor, n_pods: int) -> torch.Tensor:
    """Mean over pods of KL(pi_start || pi) of their candidate distributions; inputs (E,) log-probs."""
    per_edge = logp_start.exp() * (logp_start - logp)  # (E,)
    return torch.zeros(n_pods, dtype=logp.dtype).index_add(0, cand_pod, per_edge).mean()


def distill_terms(net: PolicyNet, start: PolicyNet, samples: Sequence[Sample]) -> tuple[torch.Tensor, ...]:
    """(cross-entropy on the labels, KL(start || net) per pod, mean squared logit) of a minibatch."""
    batch = collate([s.graph for s in samples])
    n_pods = int(batch["n_pods"])
    logits = net(batch)  # (E,)
    logp = segment_log_softmax(logits, batch["cand_pod"], n_pods)
    with torch.no_grad():
        logp_start = segment_log_softmax(start(batch), batch["cand_pod"], n_pods)
    edges, _ = action_edges(samples, batch)
    ce = -logp[edges].mean() if edges.numel() else logits.sum() * 0.0
    return ce, pod_kl(logp_start, logp, batch["cand_pod"], n_pods), (logits ** 2).mean()


def mean_kl(net: PolicyNet, start: PolicyNet, samples: Sequence[Sample], chunk: int = 256) -> float:
    """Mean KL(start || net) per pod over ``samples`` (no grad)."""
    if not samples:
        return 0.0
    with torch.no_grad():
        kls = [float(distill_terms(net, start, samples[i:i + chunk])[1]) * len(samples[i:i + chunk])
               for i in range(0, len(samples), chunk)]
    return sum(kls) / len(samples)


def distill(net: PolicyNet, start: PolicyNet, samples: Sequence[Sample], cfg: TrainConfig,
            rng: np.random.Generator, log, step: int, check_every: int = 8, probe: int = 512) -> tuple[int, dict]:
    """``search.epochs`` passes of cross-entropy + anchor * KL on ``samples``, inside the KL trust region: every
    ``check_every`` steps the mean KL to the start on a fixed probe of ``probe`` samples is measured; past
    ``kl_max`` the weights go back to the last check inside it and distillation stops."""
    sc = cfg.search
    opt = torch.optim.Adam(net.parameters(), lr=sc.lr)
    pick = rng.permutation(len(samples))[:probe]
    probe_set = [samples[i] for i in sorted(pick)]
    good = copy.deepcopy(net.state_dict())
    out = {"steps": 0, "stopped_by_kl": False, "loss": float("nan")}
    net.train()
    for _ in range(sc.epochs):
        for idx in minibatches(len(samples), sc.batch_graphs, rng):
            ce, kl, sq = distill_terms(net, start, [samples[i] for i in idx])
            loss = ce + sc.anchor * kl + cfg.imitation.logit_penalty * sq
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            step += 1
            out["steps"] += 1
            out["loss"] = loss.item()
            log.row(phase="search", step=step, loss=loss.item(), approx_kl=kl.item(), lr=sc.lr)
            if out["steps"] % check_every == 0:
                if mean_kl(net, start, probe_set) > sc.kl_max:
                    out["stopped_by_kl"] = True
                    break
                good = copy.deepcopy(net.state_dict())
        if out["stopped_by_kl"]:
            break
    if out["stopped_by_kl"] or mean_kl(net, start, probe_set) > sc.kl_max:
        net.load_state_dict(good)
        out["stopped_by_kl"] = True
    net.eval()
    out["kl"] = mean_kl(net, start, probe_set)
    return step, out


# ---------------------------------------------------------------------------------------------
# 3-4. Held-out evaluation, the loop, keeping the best


def held_out_tasks(cfg: TrainConfig, expert: str = "") -> list[EpisodeTask]:
    n = cfg.search.eval_nodes or cfg.eval.sub_nodes
    return [EpisodeTask("inflation", w, n, seed, 0.0, expert=expert) for w in cfg.eval.workloads
            for seed in cfg.eval.sub_seeds]


def held_out(state_dict: dict | None, cfg: TrainConfig, expert: str = "") -> list[float]:
    """GPU allocation at 100 % arrived per held-out (workload, seed): the greedy policy of ``state_dict``, or
    ``expert``. Same episodes as ``train.quick_eval``."""
    results = run_tasks(held_out_tasks(cfg, expert), cfg.workers, state_dict, cfg.net)
    return [float(st["alloc_at_100"]) for _, st in results]


def select_best(scores: Sequence[float]) -> int:
    """Index of the highest score; the earliest wins a tie (iteration 0, the start, over any later one)."""
    return int(np.argmax(np.asarray(scores, float)))


def clone_state(net: PolicyNet) -> dict:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def expert_iteration(net: PolicyNet, cfg: TrainConfig, log, rng: np.random.Generator, deadline: float, *,
                     tasks, run, held_out, row, log_fields, extra: Sequence[Sample] = ()) -> dict:
    """The expert-iteration loop both protocols share, from ``net``'s weights (the start); leaves ``net`` at the
    best iteration's weights (held-out mean, the start on a tie). Per iteration: ``tasks(cfg, rng)`` (each with a
    ``seed``), run by ``run(tasks, state_dict)`` into (samples, stats) per task; the newest ``search.buffer``
    samples plus ``extra`` distilled with the KL anchor to the start; ``held_out(state_dict)``, a score per
    held-out episode. ``row(stats, new)``: the protocol's own fields of the iteration's curve entry;
    ``log_fields(score)``: its fields of the ``search_eval`` log row. Returns the curve, the per-seed held-out
    scores, the kept iteration, the training seeds and the distillation steps."""
    sc = cfg.search
    start = copy.deepcopy(net).eval()
    snapshots = [clone_state(net)]
    per_seed = [held_out(snapshots[0])]
    curve = [{"iteration": 0, "held_out": round(float(np.mean(per_seed[0])), 3), "kl": 0.0, "labels": 0,
              "changed": 0, "seconds": 0.0}]
    data: list[Sample] = []
    step, train_seeds = 0, []
    for it in range(1, sc.iterations + 1):
        if time.monotonic() > deadline:
            break
        t0 = time.monotonic()
        batch = tasks(cfg, rng)
        train_seeds += [t.seed for t in batch]
        results = run(batch, clone_state(net))
        new = [smp for samples, _ in results for smp in samples]
        stats = [st for _, st in results]
        data = (new + data)[: sc.buffer]
        step, fit = distill(net, start, data + list(extra), cfg, rng, log, step)
        snapshots.append(clone_state(net))
        per_seed.append(held_out(snapshots[-1]))
        score = float(np.mean(per_seed[-1]))
        log.row(phase="search_eval", step=it, approx_kl=fit["kl"], **log_fields(score))
        labels = int(sum(st["searched"] for st in stats))
        curve.append({"iteration": it, "held_out": round(score, 3), "kl": round(fit["kl"], 5), "labels": labels,
                      "anchor_states": len(new) - labels, "changed": int(sum(st["changed"] for st in stats)),
                      **row(stats, labels), "distill_steps": fit["steps"], "stopped_by_kl": fit["stopped_by_kl"],
                      "seconds": round(time.monotonic() - t0, 1)})
    kept = select_best([float(np.mean(r)) for r in per_seed])
    net.load_state_dict(snapshots[kept])
    return {"curve": curve, "kept_iteration": kept, "kept_held_out": curve[kept]["held_out"],
            "start_held_out": curve[0]["held_out"],
            "held_out_per_seed": [[round(x, 3) for x in r] for r in per_seed], "train_seeds": train_seeds,
            "distill_steps": step}


def train_search(net: PolicyNet, cfg: TrainConfig, log, rng: np.random.Generator, deadline: float,
                 extra: Sequence[Sample] = ()) -> dict:
    """Expert iteration from ``net``'s weights (the start) on openb inflation; leaves ``net`` at the best
    iteration's weights. ``extra``: labelled samples added to every iteration's distillation next to the
    search's own (the fine-tune's recorded decisions). Returns the report: the learning curve (held-out score
    per iteration), what was kept, per iteration the search's statistics and the distillation's KL, and the
    training episodes' seeds."""
    sc = cfg.search
    fgd = held_out(None, cfg, expert="fgd")
    fgd_mean = float(np.mean(fgd))

    def row(stats, labels):
        return {"gain_milli_per_label": round(sum(st["gain_milli"] for st in stats) / max(labels, 1), 1),
                "train_alloc_at_100": round(float(np.mean([st["alloc_at_100"] for st in stats])), 3),
                "extra_samples": len(extra)}

    report = expert_iteration(
        net, cfg, log, rng, deadline, extra=extra, tasks=search_tasks,
        run=lambda batch, state: run_search_tasks(batch, cfg.workers, state, cfg.net),
        held_out=lambda state: held_out(state, cfg), row=row,
        log_fields=lambda score: {"alloc_at_100": score, "fgd_alloc_at_100": fgd_mean})
    report["curve"][0]["train_alloc_at_100"] = None
    return {**report, "fgd_held_out": round(fgd_mean, 3),
            "held_out_seeds": list(cfg.eval.sub_seeds), "held_out_workloads": list(cfg.eval.workloads),
            "held_out_nodes": sc.eval_nodes or cfg.eval.sub_nodes, "kl_max": sc.kl_max}
