"""CPU time of the inference loop's own work per pending pod, in-process (issue 11, item 4): what
``agmarl_inference.app`` does for a pod between decoding it and publishing its decision, without NATS.

The first ``--pods`` arrivals of openb's inflation order (seed 42) on the ``--nodes`` cluster, each decided by
``agmarl_inference.decide.decide`` on a ``ClusterView`` (mode full, kube-resources as the logged default
scores, ties by the replay's node order), assumed in the view, and its ``Decision`` built and encoded, as the
loop does. Per pod the thread's CPU time (``time.thread_time``) of: the decision without the model's
explanation, the explanation (``policy.explain``, reading the scoring pass the decision just ran), and the
assume + encode, and (``--prepare``, as the service's ``prepare_loop`` does between pods) the policy's
``prepare`` on the state the assume left, then its ``warm`` (as the loop does when no pod waits), neither part
of the next decision. ``--no-decompose``: the learned policy runs ``actor.onnx`` as exported instead of
``DecomposedActor``. ``--actor-ab``: per pod, outside the
timed parts, the actor pass of the decision's own graph once through ``actor.onnx`` (fed the candidates' rows,
as ``run_actor``) and once through ``DecomposedActor`` over its node tables, alternately first, with the
largest logit difference and whether the pick agrees. Prints p50 / p90 / p99 / mean of each and the 1-minute
load average.

    .venv/bin/python benchmarks/loop_decision_cpu.py --pods 3000 [--policy model:default] [--skip 0] [--prepare]
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

import numpy as np

from agmarl_common.core.cluster.filters import feasible_mask
from agmarl_common.core.cluster.state import ClusterState
from agmarl_common.core.cluster.view import ClusterView
from agmarl_common.core.policies.base import brief
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import catalog
from agmarl_common.core.sim.inflation import plan
from agmarl_common.runtime import messages as m
from agmarl_inference.decide import decide, tie_order
from agmarl_state_collector.replay import labelled


def stats(ms: list[float]) -> str:
    a = np.asarray(ms)
    return (f"p50 {np.percentile(a, 50):.2f} p90 {np.percentile(a, 90):.2f} p99 {np.percentile(a, 99):.2f} "
            f"mean {a.mean():.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="openb:all")
    ap.add_argument("--workload", default="openb:default")
    ap.add_argument("--policy", default="model:default")
    ap.add_argument("--pods", type=int, default=3000, help="pods decided and measured")
    ap.add_argument("--skip", type=int, default=0, help="pods decided before measuring (a fuller cluster)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--prepare", action="store_true", help="call the policy's prepare after each assume")
    ap.add_argument("--no-decompose", action="store_true", help="the learned policy without DecomposedActor")
    ap.add_argument("--actor-ab", action="store_true", help="time actor.onnx against DecomposedActor per pod")
    args = ap.parse_args()

    nodes = tuple(catalog.cluster_nodes(args.nodes))
    workload = catalog.openb_pods(args.workload)
    arrivals, rank = plan(nodes, workload, np.random.default_rng(args.seed))
    view = ClusterView()
    view.apply_snapshot("bench", 1, ClusterState.empty(labelled(nodes, rank)))
    policy, default = get_policy(args.policy), get_policy("kube-resources")
    if args.no_decompose and getattr(policy, "head", None) is not None:
        policy.head = None
    prepare = getattr(policy, "prepare", None) if args.prepare else None
    warm = getattr(policy, "warm", None) if args.prepare else None
    brief(policy, workload)  # as AGMARL_BRIEF_WORKLOAD does in a replay
    ranks = tie_order(view.state)
    explain = getattr(policy, "explain", None)
    decision_ms, explain_ms, rest_ms, prepare_ms, warm_ms = [], [], [], [], []
    actor_ms: dict[str, list[float]] = {"actor.onnx": [], "DecomposedActor": []}
    actor_diff, actor_same = 0.0, 0
    load = os.getloadavg()[0]
    for k, pod in enumerate(arrivals[:args.skip + args.pods]):
        state = view.state
        t = time.thread_time()
        choice = decide(pod, state, policy, default, "full", 0.7, False, ranks)
        dms = 1000 * (time.thread_time() - t)
        if args.actor_ab and k >= args.skip and getattr(policy, "head", None) is not None and choice.node:
            diff, same = actor_ab(policy, k, actor_ms)
            actor_diff, actor_same = max(actor_diff, diff), actor_same + same
        explanation, xms = dict(choice.explanation), 0.0
        if callable(explain) and choice.node:
            cand = np.flatnonzero(feasible_mask(pod, state))  # decide's candidates (not timed)
            t = time.thread_time()
            explanation["model"] = explain(pod, state, cand, top=3)
            xms = 1000 * (time.thread_time() - t)
        t = time.thread_time()
        if choice.node:
            view.assume(pod, choice.node, choice.gpus, 0.0)
        m.encode(m.Decision(decision_id=uuid.uuid4().hex, cluster="bench", namespace=pod.namespace,
                            pod_key=pod.key, node=choice.node, gpus=list(choice.gpus), policy=policy.name,
                            mode="full", score=choice.score, scores=choice.scores, model_scores=choice.model_scores,
                            default_scores=choice.default_scores, explanation=explanation, seen_at=0.0,
                            decided_at=0.0, source="loop", origin="bench", origin_seq=k))
        rms = 1000 * (time.thread_time() - t)
        t = time.thread_time()
        if callable(prepare):
            prepare(view.state)
        pms = 1000 * (time.thread_time() - t)
        t = time.thread_time()
        if callable(warm):
            warm(view.state)
        wms = 1000 * (time.thread_time() - t)
        if k >= args.skip:
            decision_ms.append(dms)
            explain_ms.append(xms)
            rest_ms.append(rms)
            prepare_ms.append(pms)
            warm_ms.append(wms)
    print(f"{args.policy}, {args.nodes}, pods {args.skip}..{args.skip + args.pods} of {args.workload}'s inflation "
          f"order (load {load:.2f} -> {os.getloadavg()[0]:.2f}), CPU per pod:")
    print(f"  decision (filter, score, pick, logged scores): {stats(decision_ms)}")
    print(f"  model explanation:                             {stats(explain_ms)}")
    print(f"  assume + Decision encode:                      {stats(rest_ms)}")
    total = np.asarray(decision_ms) + np.asarray(explain_ms) + np.asarray(rest_ms)
    print(f"  total:                                         {stats(list(total))}")
    if callable(prepare):
        print(f"  prepare (between pods, not in the total):      {stats(prepare_ms)}")
    if callable(warm):
        print(f"  warm (between pods when idle, not in total):   {stats(warm_ms)}")
    if actor_ms["actor.onnx"]:
        for name, ms in actor_ms.items():
            print(f"  actor pass, {name + ':':34s} {stats(ms)}")
        print(f"  largest logit difference {actor_diff:.2e}; same pick in {actor_same} of "
              f"{len(actor_ms['actor.onnx'])} decisions")
    return 0


def actor_ab(policy, k: int, actor_ms: dict[str, list[float]]) -> tuple[float, bool]:
    """Time the last scoring pass's actor both ways (alternately first); (largest |logit| difference, same pick)."""
    _, _, _, g, emb, _, _ = policy._last
    runs = {"actor.onnx": lambda: policy.run_actor(emb, g)[0],
            "DecomposedActor": lambda: policy.head.run(policy.head.nodes.tables, g.pod_x, g.cand_pod, g.cand_node,
                                                       g.cand_attr)[0]}
    out = {}
    for name in (list(runs) if k % 2 else list(runs)[::-1]):
        t = time.thread_time()
        out[name] = runs[name]()
        actor_ms[name].append(1000 * (time.thread_time() - t))
    a, b = out["actor.onnx"], out["DecomposedActor"]
    return float(np.abs(a - b).max()), int(np.argmax(a)) == int(np.argmax(b))


if __name__ == "__main__":
    raise SystemExit(main())
