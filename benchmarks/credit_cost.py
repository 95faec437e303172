"""What one experience's credit costs the reward-calculator: ``transition.decision_credit`` (the difference
reward of a decision against kube-default's placement, on the snapshot it was made on), per decision, with the
snapshot's shared ``placement_base`` (as the service runs it) and, with ``--full``, with two full
``reward_components`` instead (what it cost before the shared base).

    nice .venv/bin/python benchmarks/credit_cost.py --cluster openb --full     # 1,523 openb nodes, 3,000 pods bound
    nice .venv/bin/python benchmarks/credit_cost.py --cluster synthetic        # the chaos benchmark's 50-node cluster

Prints the median and p90 in ms over ``--decisions`` pending pods, each decided on its first feasible node.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import state_to_dict, to_dict
from agmarl_common.core.credit import placement_components, reference_placement
from agmarl_common.core.policies.kube import KubeDefaultPolicy
from agmarl_common.core.sim.synthetic import affinity_heavy, synthetic_cluster
from agmarl_common.core.sim.traces import load_openb_nodes, load_openb_pods
from agmarl_common.runtime import messages as m
from agmarl_reward_calculator.transition import SnapshotView, decision_credit
from agmarl_testing.states import filled


def cluster(kind: str, bound: int, seed: int):
    """(nodes, the pods to bind, the pods left pending) of the chosen cluster."""
    if kind == "openb":
        nodes, pods = load_openb_nodes(), load_openb_pods()
    else:
        nodes = synthetic_cluster(50)
        pods = affinity_heavy(nodes, horizon_s=7200, seed=seed)
    return nodes, pods[:bound], pods[bound:bound + 400]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", choices=("openb", "synthetic"), default="openb")
    ap.add_argument("--bound", type=int, default=0, help="pods bound first (default: 3,000 openb, 1,500 synthetic)")
    ap.add_argument("--decisions", type=int, default=100)
    ap.add_argument("--full", action="store_true", help="also time the credit without the shared base")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    nodes, to_bind, pending = cluster(args.cluster, args.bound or (3000 if args.cluster == "openb" else 1500),
                                      args.seed)
    kube = KubeDefaultPolicy()
    state, _ = filled(nodes, to_bind, len(to_bind), kube)  # kube-default places the pods that are bound
    view = SnapshotView(m.ClusterSnapshot(cluster="bench", seq=1, time=1.0, state=state_to_dict(state),
                                          pending=[to_dict(p) for p in pending], stats={}))
    started = time.perf_counter()
    view.placement_base()
    print(f"{args.cluster}: {state.n_nodes} nodes, {int(state.pods_used.sum())} pods bound; snapshot parse + "
          f"shared base {1000 * (time.perf_counter() - started):.0f} ms (once per snapshot)")
    shared, full = [], []
    for pod in pending:
        cands = feasible_nodes(pod, state)
        if len(shared) == args.decisions:
            break
        if not len(cands):
            continue
        node = int(cands[0])
        d = m.Decision(decision_id="bench", cluster="bench", namespace=pod.namespace, pod_key=pod.key,
                       node=state.nodes[node].name, gpus=[], policy="first-fit", mode="full", seen_at=0.0,
                       decided_at=0.0)
        t = time.perf_counter()
        decision_credit(d, view, kube)
        shared.append(time.perf_counter() - t)
        if args.full:
            t = time.perf_counter()
            ref, ref_gpus = reference_placement(state, pod, kube)
            placement_components(state, pod, node)  # no shared base: the full computation, twice
            placement_components(state, pod, ref, ref_gpus)
            full.append(time.perf_counter() - t)
    for name, times in (("with the shared base", shared), ("two full reward_components", full)):
        if times:
            ms = 1000 * np.asarray(times)
            print(f"credit per decision, {name}: median {np.median(ms):.2f} ms, p90 {np.percentile(ms, 90):.2f} ms "
                  f"({len(ms)} decisions)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
