"""What each snapshot costs the reward-calculator before any decision's own work: reading the compact snapshot the
state-collector publishes (``SnapshotView.cluster_state``, which the reward reads) and finding where the held
decisions' pods are (``SnapshotView.placement``, what ``ledger.verdict`` asks of every snapshot). Also the codec's
two halves alone: ``compact_snapshot`` (the state-collector writing a snapshot) and ``state_from_snapshot`` (every
consumer reading one).

    nice .venv/bin/python benchmarks/snapshot_view.py                      # 1,523 openb nodes, 3,000 pods bound
    nice .venv/bin/python benchmarks/snapshot_view.py --bound 2000 --lookups 50

Prints the median and p90 in ms per snapshot over ``--snapshots`` fresh views of the same snapshot, the same for the
experience state a snapshot with decisions adds (``SnapshotView.shared``: the compact state every transition decided
on it carries, packed and compressed once), and the medians of ``compact_snapshot`` and ``state_from_snapshot`` over
as many calls.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from agmarl_common.core.cluster.compact import compact_snapshot, state_from_snapshot
from agmarl_common.core.cluster.model import to_dict
from agmarl_common.core.sim.traces import load_openb_nodes, load_openb_pods
from agmarl_common.runtime import messages as m
from agmarl_reward_calculator.transition import SnapshotView
from agmarl_testing.states import filled


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bound", type=int, default=3000, help="openb pods bound first-fit before the snapshot")
    ap.add_argument("--lookups", type=int, default=20, help="held decisions looked up per snapshot")
    ap.add_argument("--snapshots", type=int, default=30)
    args = ap.parse_args()
    pods = load_openb_pods()
    state, _ = filled(load_openb_nodes(), pods[:args.bound], args.bound)
    bound = [p.key for row in state.bound for p in row]
    pending = [to_dict(p) for p in pods[args.bound:args.bound + 50]]
    msg = m.ClusterSnapshot(cluster="bench", seq=1, time=1.0, state=compact_snapshot(state), pending=pending)
    keys = [bound[k] for k in np.linspace(0, len(bound) - 1, args.lookups).astype(int)]
    spent = []
    for _ in range(args.snapshots):
        started = time.perf_counter()
        view = SnapshotView(msg)
        view.cluster_state()
        for key in keys:
            view.placement(key)
        spent.append(1000 * (time.perf_counter() - started))
    print(f"{state.n_nodes} nodes, {len(bound)} pods bound, {len(pending)} pending, {len(keys)} placements looked "
          f"up: per snapshot median {np.median(spent):.1f} ms, p90 {np.percentile(spent, 90):.1f} ms")
    experience = []  # a snapshot with decisions: the transitions' shared part, after the reward's cluster_state
    for _ in range(args.snapshots):
        view = SnapshotView(msg)
        view.cluster_state()
        started = time.perf_counter()
        view.shared()
        experience.append(1000 * (time.perf_counter() - started))
    print(f"experience state (SnapshotView.shared, after cluster_state): median {np.median(experience):.1f} ms, "
          f"p90 {np.percentile(experience, 90):.1f} ms")
    for name, call in (("compact_snapshot", lambda: compact_snapshot(state)),
                       ("state_from_snapshot", lambda: state_from_snapshot(msg.state))):
        times = []
        for _ in range(args.snapshots):
            started = time.perf_counter()
            call()
            times.append(1000 * (time.perf_counter() - started))
        print(f"{name}: median {np.median(times):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
