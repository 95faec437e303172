"""Speed of the shared hard filter on pods with pod (anti-)affinity and topology spread.

For each synthetic workload: one dynamic-simulator hour on a synthetic cluster with the
LeastAllocated policy (``kube-resources``), timed end to end; then, on the state that run ends
with, the mean time of one ``feasible_mask`` call for a sample of the workload's pods (split by
the constraints they carry), of ``filter_node`` over every node for one pod, and of one
``violations(state)`` (what the state-collector runs at every snapshot), also on a state just
decoded from its dict (as a snapshot arrives: nothing derived from it yet). Prints markdown; the
figures in docs/performance.md come from it.

    .venv/bin/python benchmarks/filter_speed.py
    .venv/bin/python benchmarks/filter_speed.py --nodes 200 --seed 1 --workloads affinity_heavy
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from agmarl_common.core.cluster.filters import feasible_mask, filter_node, violations
from agmarl_common.core.cluster.model import ClusterState, Pod, state_from_dict, state_to_dict
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim.dynamic import SimConfig, run
from agmarl_common.core.sim.synthetic import generate, synthetic_cluster


def kind(pod: Pod) -> str:
    if pod.pod_affinity:
        return "required affinity"
    if pod.pod_anti_affinity:
        return "required anti-affinity"
    if any(c.when_unsatisfiable == "DoNotSchedule" for c in pod.topology_spread):
        return "hard spread"
    return "no pod terms"


def per_call_us(fn, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e6


def bench_calls(state: ClusterState, pods: list[Pod], calls: int) -> list[tuple[str, int, float]]:
    """(pod kind, pods timed, mean microseconds per feasible_mask call) for up to ``calls`` pods of each kind."""
    groups: dict[str, list[Pod]] = {}
    for p in pods:
        groups.setdefault(kind(p), []).append(replace(p, node_name="", gpu_devices=()))
    out = []
    for k, group in sorted(groups.items()):
        sample = group[:: max(1, len(group) // calls)][:calls]
        start = time.perf_counter()
        for p in sample:
            feasible_mask(p, state)
        out.append((k, len(sample), (time.perf_counter() - start) / len(sample) * 1e6))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--horizon", type=float, default=3600.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workloads", default="batch_online_mix,affinity_heavy")
    ap.add_argument("--calls", type=int, default=100, help="pods timed per pod kind")
    args = ap.parse_args()

    print(f"nodes={args.nodes} horizon={args.horizon:.0f}s seed={args.seed} policy=kube-resources\n")
    print("| workload | pods | dynamic run (s) | bound | live pods at end | violations() (ms) | on a decoded state (ms) |")
    print("|---|---|---|---|---|---|---|")
    finals = []
    for name in args.workloads.split(","):
        nodes = synthetic_cluster(args.nodes, seed=args.seed)
        pods = generate(name, nodes, args.horizon, seed=args.seed)
        start = time.perf_counter()
        result = run(get_policy("kube-resources"), nodes, pods, SimConfig(horizon_s=args.horizon), seed=args.seed)
        seconds = time.perf_counter() - start
        state = result.final_state.cluster
        v_ms = per_call_us(lambda: violations(state), 5) / 1000
        wire = state_to_dict(state)
        decoded = [state_from_dict(wire) for _ in range(3)]
        fresh_ms = per_call_us(lambda: violations(decoded.pop()), 3) / 1000
        live = sum(len(b) for b in state.bound)
        print(f"| {name} | {len(pods)} | {seconds:.1f} | {result.counters.bound} | {live} | {v_ms:.2f} | {fresh_ms:.2f} |",
              flush=True)
        finals.append((name, state, pods))

    print("\n| workload | pod kind | pods timed | feasible_mask (us/call) | filter_node x n_nodes (us) |")
    print("|---|---|---|---|---|")
    for name, state, pods in finals:
        for k, n, us in bench_calls(state, pods, args.calls):
            probe = next(p for p in pods if kind(p) == k)
            probe = replace(probe, node_name="", gpu_devices=())
            row_us = per_call_us(lambda: [filter_node(probe, state, i) for i in range(state.n_nodes)], 3)
            print(f"| {name} | {k} | {n} | {us:.0f} | {row_us:.0f} |", flush=True)


if __name__ == "__main__":
    main()
