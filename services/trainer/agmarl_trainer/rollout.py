"""Environments and rollouts: the inflation protocol and the dynamic simulator, driven step by step.

Two protocols, both from ``agmarl_common.core.sim`` (the same code the benchmarks run):
- inflation (the FGD paper's): pods arrive once in a seeded inflated order and stay; one pod is one
  step. Step reward (GPU allocation gained, fragmentation avoided), in GPUs:
      r_t = -(gpu_milli_dropped_t) / 1000 - beta * (F_{t+1} - F_t) / 1000,
  F = cluster fragmentation amount against the target workload. The arrivals do not depend on the
  policy, so sum(allocated) = sum(arrived) - sum(dropped): penalising drops is rewarding allocation up
  to a policy-independent constant, without the pod-size noise of a per-placement gain. The second term
  is potential-based shaping (Phi = -beta F), so with gamma = 1 it leaves the optimal policy unchanged.
- dynamic (time-driven simulator): every tick the pending pods form one batch of agents; each picks a
  candidate, an arbiter binds them in order and re-checks each pick on the state left by the earlier
  ones (``filter_node``, via ``sim.dynamic.bind``); a refused pick stays pending. The round's reward is
  ``agmarl_common.core.reward.total_reward`` of the cluster after the round (the reward defined once);
  each agent also carries its own credit (``Sample.credit``): ``core.credit.difference_reward`` of its
  placement against a reference policy's placement of the same pod on the round's cluster (kube-default
  by default; a refused pick counts as left pending).

Samples are ``Sample(graph, label, logp, reward, done, credit)`` over numpy graphs; ``collate`` batches them
into one disjoint graph of tensors for the networks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from agmarl_common.core.cluster.filters import feasible_mask, feasible_nodes, violations
from agmarl_common.core.cluster.model import GPU_MILLI, ClusterState, Node, Pod, bind
from agmarl_common.core.credit import reference_credit
from agmarl_common.core.features import FeatureContext, HeteroGraph, build_graph, device_for
from agmarl_common.core.policies.base import PolicyBase
from agmarl_common.core.policies.kube import KubeDefaultPolicy
from agmarl_common.core.reward import placement_base, reward_components, total_reward
from agmarl_common.core.sim import dynamic, inflation
from agmarl_common.core.sim.inflation import inflate_workload, pick_node

GRAPH_KEYS = ("node_x", "pod_x", "nn_edge_index", "pp_edge_index", "cand_pod", "cand_node", "cand_attr")


@dataclass
class Sample:
    """One decision round: a graph of P pending pods; label/action per pod = local candidate edge or -1."""

    graph: HeteroGraph
    action: np.ndarray  # (P,) int64 index into the graph's candidate edges, -1 = no candidate
    logp: float = 0.0  # joint log-probability of the actions under the behaviour policy
    reward: float = 0.0
    done: bool = False
    credit: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (P,) per-agent difference reward


# ---------------------------------------------------------------------------------------------
# Batching


def collate(graphs: Sequence[HeteroGraph]) -> dict[str, Tensor]:
    """One disjoint graph of G graphs: indexes offset, plus node_batch (N,), pod_batch (P,), cand_graph (E,)."""
    out: dict[str, list] = {k: [] for k in GRAPH_KEYS + ("node_batch", "pod_batch", "cand_offset")}
    n_off = p_off = e_off = 0
    for gi, g in enumerate(graphs):
        out["node_x"].append(g.node_x)
        out["pod_x"].append(g.pod_x)
        out["nn_edge_index"].append(g.nn_edge_index + n_off)
        out["pp_edge_index"].append(g.pp_edge_index + p_off)
        out["cand_pod"].append(g.cand_pod + p_off)
        out["cand_node"].append(g.cand_node + n_off)
        out["cand_attr"].append(g.cand_attr)
        out["node_batch"].append(np.full(g.n_nodes, gi, np.int64))
        out["pod_batch"].append(np.full(g.n_pods, gi, np.int64))
        out["cand_offset"].append(np.full(g.n_pods, e_off, np.int64))
        n_off, p_off, e_off = n_off + g.n_nodes, p_off + g.n_pods, e_off + g.n_cand
    batch = {k: torch.from_numpy(np.concatenate(v, axis=-1 if k.endswith("edge_index") else 0))
             for k, v in out.items()}
    batch["n_graphs"] = torch.tensor(len(graphs))
    batch["n_pods"] = torch.tensor(p_off)
    return batch


def segment_log_softmax(logits: Tensor, seg: Tensor, n_seg: int) -> Tensor:
    """log softmax of ``logits`` (E,) within segments ``seg`` (E,) in [0, n_seg) -> (E,)."""
    m = torch.full((n_seg,), -math.inf, dtype=logits.dtype).scatter_reduce(0, seg, logits.detach(), "amax")
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    z = torch.zeros(n_seg, dtype=logits.dtype).index_add(0, seg, torch.exp(logits - m[seg]))
    return logits - m[seg] - torch.log(z[seg])


def action_edges(samples: Sequence[Sample], batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(global candidate edge of each pod's action, its pod) for pods that acted."""
    acts = torch.from_numpy(np.concatenate([s.action for s in samples]))  # (P,)
    has = acts >= 0
    pods = torch.nonzero(has).squeeze(-1)
    return batch["cand_offset"][has] + acts[has], pods


# ---------------------------------------------------------------------------------------------
# Policies over graphs


GraphScorer = Callable[[HeteroGraph], np.ndarray]  # graph -> logits (E,)


def torch_scorer(net) -> GraphScorer:
    """Logits of a graph from a ``PolicyNet`` (no grad)."""
    def score(g: HeteroGraph) -> np.ndarray:
        with torch.no_grad():
            t = {k: torch.from_numpy(getattr(g, k)) for k in GRAPH_KEYS}
            return net.logits(t).numpy()
    return score


class LearnedPolicy(PolicyBase):
    """The learned model behind the one ``Policy`` interface (one pod at a time; torch or ONNX scorer).

    Device choice: the least-fragmenting device for a share (``features.device_for``)."""

    name = "agmarl"

    def __init__(self, scorer: GraphScorer, context: FeatureContext | None = None, objective: str = "composite"):
        self.scorer = scorer
        self.context = context
        self.objective = context.objective if context is not None else objective

    def observe_workload(self, pods: Sequence[Pod]) -> None:
        self.context = FeatureContext.from_workload(pods, self.objective)

    def set_objective(self, objective: str) -> None:
        self.objective = objective
        if self.context is not None:
            self.context = FeatureContext(self.context.target, objective)

    def score(self, pod: Pod, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
        if self.context is None:
            raise ValueError("LearnedPolicy needs a target workload: call observe_workload(pods) first")
        if len(candidates) == 0:
            return np.zeros(0)
        g = build_graph([pod], state, [np.asarray(candidates, np.int64)], self.context)
        return np.asarray(self.scorer(g), dtype=np.float64)

    def choose_gpus(self, pod: Pod, state: ClusterState, node_index: int) -> tuple[int, ...] | None:
        return device_for(pod, state, node_index, self.context)


# ---------------------------------------------------------------------------------------------
# Inflation protocol


def sub_cluster(nodes: Sequence[Node], n: int, rng: np.random.Generator, min_gpu_nodes: int = 4) -> tuple[Node, ...]:
    """``n`` nodes sampled without replacement (at least ``min_gpu_nodes`` with GPUs), in trace order."""
    n = min(n, len(nodes))
    idx = rng.choice(len(nodes), size=n, replace=False)
    gpu = [i for i, nd in enumerate(nodes) if nd.gpu_count > 0]
    have = sum(1 for i in idx if nodes[i].gpu_count > 0)
    if have < min_gpu_nodes and gpu:
        extra = [i for i in rng.permutation(gpu) if i not in set(idx)][: min_gpu_nodes - have]
        idx = np.concatenate([idx[: n - len(extra)], np.asarray(extra, dtype=idx.dtype)])
    return tuple(nodes[i] for i in sorted(set(int(i) for i in idx)))


@dataclass
class InflationEpisode:
    """Result of one inflation episode: recorded samples and the GPU allocation reached."""

    samples: list[Sample] = field(default_factory=list)
    alloc_at_100: float = 0.0  # GPU allocation % of capacity when 100 % of capacity had arrived
    alloc_final: float = 0.0
    frag_final: float = 0.0


def run_inflation_episode(nodes: Sequence[Node], workload: Sequence[Pod], rng: np.random.Generator, *,
                          expert=None, scorer: GraphScorer | None = None, sample: bool = False,
                          record_prob: float = 1.0, beta: float = 1.0, ratio: float = 1.3) -> InflationEpisode:
    """Run the inflation protocol (``sim.inflation.run_inflation``'s order, ties and devices) with either
    an ``expert`` Policy (recording its pick as the label) or a graph ``scorer`` (greedy, or sampling from
    the softmax when ``sample``). Records a step with probability ``record_prob`` (a step with one
    candidate is never recorded)."""
    state = ClusterState.empty(nodes)
    total = int(state.gpu_count.sum()) * GPU_MILLI
    arrivals = inflate_workload(workload, total, rng, ratio)
    rank = rng.permutation(state.n_nodes)
    ctx = FeatureContext.from_workload(workload, inflation.OBJECTIVE)
    if expert is not None and callable(getattr(expert, "observe_workload", None)):
        expert.observe_workload(workload)
    ep = InflationEpisode()
    frag = ctx.node_frag(state).sum()
    arrived = used = 0
    at_100 = None
    for pod in arrivals:
        arrived += pod.gpu_milli_total
        cand = np.flatnonzero(feasible_mask(pod, state))
        gained = 0
        rec = None
        if cand.size:
            record = cand.size > 1 and rng.random() < record_prob
            graph = build_graph([pod], state, [cand], ctx) if (record or scorer is not None) else None
            logp = 0.0
            if expert is not None:
                scores = np.asarray(expert.score(pod, state, cand), dtype=np.float64)
                i = pick_node(scores, cand, rank, rng)
                gpus = expert.choose_gpus(pod, state, i)
            else:
                logits = scorer(graph)
                if sample:
                    z = logits - logits.max()
                    p = np.exp(z) / np.exp(z).sum()
                    k = int(rng.choice(len(cand), p=p))
                    logp = float(np.log(max(p[k], 1e-30)))
                else:
                    k = int(np.argmax(logits))
                i = int(cand[k])
                gpus = device_for(pod, state, i, ctx)
            state = bind(state, pod, i, tuple(gpus))
            gained = pod.gpu_milli_total
            used += gained
            if record:
                rec = Sample(graph, np.array([int(np.flatnonzero(cand == i)[0])], np.int64), logp)
        new_frag = ctx.node_frag(state).sum()
        reward = (gained - pod.gpu_milli_total) / GPU_MILLI - beta * (new_frag - frag) / GPU_MILLI
        frag = new_frag
        if rec is not None:
            rec.reward = reward
            ep.samples.append(rec)
        elif ep.samples:  # an unrecorded step: its reward goes to the last recorded decision
            ep.samples[-1].reward += reward
        if at_100 is None and arrived >= total:
            at_100 = 100.0 * used / total
    if ep.samples:
        ep.samples[-1].done = True
    ep.alloc_at_100 = at_100 if at_100 is not None else 100.0 * used / total
    ep.alloc_final = 100.0 * used / total
    ep.frag_final = float(frag)
    return ep


# ---------------------------------------------------------------------------------------------
# Dynamic simulator: batches of pending pods as agents, arbiter, reward.py


def _round_reward(state: dynamic.SimState, before: dynamic.SimCounters) -> float:
    """The composite reward of the cluster after a round, its outcomes the simulator's window outcomes
    (``dynamic.window_outcomes``: ``reward.outcomes_from_stats``, as the reward-calculator counts live windows,
    with the pending pods' mean wait)."""
    return total_reward(reward_components(state.cluster, dynamic.window_outcomes(state, before)))


def _credits(pods: Sequence[Pod], cands: Sequence[np.ndarray], cluster: ClusterState,
             placed: Sequence[tuple[int | None, tuple[int, ...]]], reference, ctx: FeatureContext) -> np.ndarray:
    """(P,) each agent's difference reward against ``reference``'s pick of its pod on the round's cluster."""
    out = np.zeros(len(pods))
    base = placement_base(cluster)  # shared by every agent of the round
    for k, (pod, c, (node, gpus)) in enumerate(zip(pods, cands, placed)):
        out[k] = reference_credit(cluster, pod, node, gpus, reference, c,
                                  gpus_for=lambda p, s, i: device_for(p, s, i, ctx), base=base)[0].total
    return out


def run_dynamic_episode(nodes: Sequence[Node], workload: Sequence[Pod], seed: int, config: dynamic.SimConfig, *,
                        expert=None, scorer: GraphScorer | None = None, sample: bool = False,
                        rng: np.random.Generator | None = None, max_agents: int = 16,
                        record_prob: float = 1.0, credit_reference=None,
                        credit: bool | None = None) -> tuple[list[Sample], dict[str, float]]:
    """Tick the dynamic simulator; each tick up to ``max_agents`` pending pods act jointly.

    Expert mode records the expert's pick per pod (labels); scorer mode picks argmax or samples. The
    arbiter binds picks in pod order through ``dynamic.bind`` (hard filter re-run on the updated state):
    a pick made stale by an earlier one is refused and the pod stays pending for the next tick.
    With ``credit``, each recorded agent gets its difference reward against ``credit_reference``
    (a Policy; kube-default when None) on the round's cluster (``Sample.credit``). ``credit=None``: on when a
    scorer acts (the experience RL learns from), off for an expert's labels (it about doubles an episode's cost)."""
    reference = credit_reference if credit_reference is not None else KubeDefaultPolicy()
    credit = scorer is not None if credit is None else credit
    rng = rng if rng is not None else np.random.default_rng(seed)
    state = dynamic.reset(nodes, workload, config, seed)
    ctx = FeatureContext.from_workload(workload, dynamic.OBJECTIVE)
    samples: list[Sample] = []
    n_ticks = int(math.ceil(config.horizon_s / config.tick_s - 1e-9))
    rewards = []
    for _ in range(n_ticks):
        state, _ = dynamic.advance(state, config.tick_s, config)
        pending = list(state.pending.values())[:max_agents]
        pods, cands = [], []
        for pp in pending:
            c = feasible_nodes(pp.pod, state.cluster)
            if state.down:
                c = np.array([x for x in c.tolist() if x not in state.down], dtype=np.int64)
            if c.size:
                pods.append(pp.pod)
                cands.append(c)
        if not pods:
            continue
        before = state.counters
        cluster = state.cluster
        graph = build_graph(pods, cluster, cands, ctx)
        actions = np.full(len(pods), -1, np.int64)
        logp = 0.0
        if expert is not None:
            off = 0
            for k, (pod, c) in enumerate(zip(pods, cands)):
                scores = np.asarray(expert.score(pod, cluster, c), dtype=np.float64)
                actions[k] = off + int(np.argmax(scores))
                off += c.size
        else:
            logits = scorer(graph)
            off = 0
            for k, c in enumerate(cands):
                lk = logits[off:off + c.size]
                if sample:
                    z = np.exp(lk - lk.max())
                    p = z / z.sum()
                    j = int(rng.choice(c.size, p=p))
                    logp += float(np.log(max(p[j], 1e-30)))
                else:
                    j = int(np.argmax(lk))
                actions[k] = off + j
                off += c.size
        placed: list[tuple[int | None, tuple[int, ...]]] = []
        for k, pod in enumerate(pods):  # the arbiter: earlier picks first, each re-checked
            node = int(graph.cand_node[actions[k]])
            gpus = device_for(pod, state.cluster, node, ctx) if pod.num_gpu else ()
            state, outcome = dynamic.bind(state, pod.key, state.cluster.nodes[node].name, gpus)
            placed.append((node, tuple(gpus if gpus is not None else ())) if outcome.ok else (None, ()))
        r = _round_reward(state, before)
        rewards.append(r)
        if rng.random() < record_prob:
            credits = _credits(pods, cands, cluster, placed, reference, ctx) if credit else np.zeros(0)
            samples.append(Sample(graph, actions, logp, r, credit=credits))
    if samples:
        samples[-1].done = True
    stats = dynamic.snapshot_stats(state)
    stats["hard_violations"] = float(len(violations(state.cluster)))
    stats["mean_reward"] = float(np.mean(rewards)) if rewards else 0.0
    return samples, stats

