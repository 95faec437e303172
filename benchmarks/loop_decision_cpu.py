"""CPU time of the inference loop's own work per pending pod, in-process (issue 11, item 4): what
``agmarl_inference.app`` does for a pod between decoding it and publishing its decision, without NATS.

The first ``--pods`` arrivals of openb's inflation order (seed 42) on the ``--nodes`` cluster, each decided by
``agmarl_inference.decide.decide`` on a ``ClusterView`` (mode full, kube-resources as the logged default
scores, ties by the replay's node order), assumed in the view, and its ``Decision`` built and encoded, as the
loop does. Per pod the thread's CPU time (``time.thread_time``) of: the decision without the model's
explanation, the explanation (``policy.explain``, reading the scoring pass the decision just ran), and the
assume + encode. Prints p50 / p90 / p99 / mean of each and the 1-minute load average.

    .venv/bin/python benchmarks/loop_decision_cpu.py --pods 3000 [--policy model:default] [--skip 0]
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
    args = ap.parse_args()

    nodes = tuple(catalog.cluster_nodes(args.nodes))
    workload = catalog.openb_pods(args.workload)
    arrivals, rank = plan(nodes, workload, np.random.default_rng(args.seed))
    view = ClusterView()
    view.apply_snapshot("bench", 1, ClusterState.empty(labelled(nodes, rank)))
    policy, default = get_policy(args.policy), get_policy("kube-resources")
    brief(policy, workload)  # as AGMARL_BRIEF_WORKLOAD does in a replay
    ranks = tie_order(view.state)
    explain = getattr(policy, "explain", None)
    decision_ms, explain_ms, rest_ms = [], [], []
    load = os.getloadavg()[0]
    for k, pod in enumerate(arrivals[:args.skip + args.pods]):
        state = view.state
        t = time.thread_time()
        choice = decide(pod, state, policy, default, "full", 0.7, False, ranks)
        dms = 1000 * (time.thread_time() - t)
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
        if k >= args.skip:
            decision_ms.append(dms)
            explain_ms.append(xms)
            rest_ms.append(rms)
    print(f"{args.policy}, {args.nodes}, pods {args.skip}..{args.skip + args.pods} of {args.workload}'s inflation "
          f"order (load {load:.2f} -> {os.getloadavg()[0]:.2f}), CPU per pod:")
    print(f"  decision (filter, score, pick, logged scores): {stats(decision_ms)}")
    print(f"  model explanation:                             {stats(explain_ms)}")
    print(f"  assume + Decision encode:                      {stats(rest_ms)}")
    total = np.asarray(decision_ms) + np.asarray(explain_ms) + np.asarray(rest_ms)
    print(f"  total:                                         {stats(list(total))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
