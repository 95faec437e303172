"""What one recorded decision (an Experience) costs on the wire and at both ends, deflated as the services send it
and in the plain compact form they sent before (stop 29): bytes on EXPERIENCE, bytes in the trainer's JSON file,
the reward-calculator's encode per transition (``transition.encoded_experience``, after the once-per-snapshot
deflation of what every transition on the snapshot shares, ``SnapshotView.shared``), and the trainer's decode:
``messages.decode``, which it does for every experience it records, and ``experience.decode_decision`` (the
cluster state, the pending pods, the candidates rebuilt), only for the experiences a retrain uses.

    nice .venv/bin/python benchmarks/experience_cost.py                  # make run's cluster: 50 synthetic nodes
    nice .venv/bin/python benchmarks/experience_cost.py --cluster openb  # 1,523 openb nodes

The synthetic case binds ``--bound`` pods of the ``batch_online_mix`` workload first-fit and leaves ``--pending``
pending, as `make run`'s simulated cluster holds them; openb binds the default pod list's first pods. Prints the
medians over ``--repeats`` experiences (each a different pending pod decided onto its first feasible node).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from agmarl_common.core.cluster.compact import compact_snapshot, inflated
from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, Pod, to_dict
from agmarl_common.core.sim import catalog, synthetic
from agmarl_common.runtime import messages as m
from agmarl_reward_calculator.transition import SnapshotView, encoded_experience
from agmarl_testing.states import filled
from agmarl_trainer.experience import decode_decision

LIMIT = 8 * 1024 * 1024


def cluster(kind: str, n_bound: int, n_pending: int) -> tuple[ClusterState, list[Pod]]:
    if kind == "openb":
        nodes = catalog.cluster_nodes("openb:all")
        pods = list(catalog.openb_pods("openb:default"))
    else:
        nodes = synthetic.synthetic_cluster(50, seed=0)
        pods = list(synthetic.generate("batch_online_mix", list(nodes), horizon_s=3600.0, seed=0))
    state, rest = filled(nodes, pods, n_bound)
    return state, rest[:n_pending]


def median_ms(fn, repeats: int) -> tuple[float, object]:
    spent, out = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        spent.append(1000 * (time.perf_counter() - started))
    return float(np.median(spent)), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", choices=("synthetic", "openb"), default="synthetic")
    ap.add_argument("--bound", type=int, default=1500)
    ap.add_argument("--pending", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    state, pending = cluster(args.cluster, args.bound, args.pending)
    before = m.ClusterSnapshot(cluster="bench", seq=1, time=1.0, state=compact_snapshot(state),
                               pending=[to_dict(p) for p in pending])
    after = SnapshotView(m.ClusterSnapshot(cluster="bench", seq=2, time=2.0, state=before.state, pending=[]))
    decided = [p for p in pending if feasible_nodes(p, state).size][:args.repeats]
    if not decided:
        raise SystemExit("no pending pod fits the cluster: lower --bound")

    def decision(pod: Pod) -> m.Decision:
        node = state.nodes[int(feasible_nodes(pod, state)[0])].name
        return m.Decision(decision_id=f"d-{pod.key}", cluster="bench", namespace=pod.namespace, pod_key=pod.key,
                          node=node, gpus=[], policy="bench", mode="full", score=0.5, seen_at=1.0, decided_at=1.5)

    shared_ms, _ = median_ms(lambda: SnapshotView(before).shared(), 5)
    view = SnapshotView(before)
    view.shared()
    rows = {"deflated": [], "plain": []}
    for pod in decided:
        d = decision(pod)
        started = time.perf_counter()
        exp, missing, data = encoded_experience(d, view, after, 0.5, LIMIT)
        encode_ms = 1000 * (time.perf_counter() - started)
        if missing:
            raise SystemExit(f"{pod.key}: experience incomplete ({missing})")
        plain = exp.model_copy(update={"state": {**exp.state, "cluster": inflated(exp.state["cluster"])}})
        for form, e, wire, enc in (("deflated", exp, data, encode_ms), ("plain", plain, None, None)):
            if wire is None:
                started = time.perf_counter()
                wire = m.encode(e)
                enc = 1000 * (time.perf_counter() - started)
            started = time.perf_counter()
            back = m.decode(m.Experience, wire)
            decode_ms = 1000 * (time.perf_counter() - started)
            got, why = decode_decision(back)
            state_ms = 1000 * (time.perf_counter() - started) - decode_ms
            if got is None:
                raise SystemExit(f"{pod.key}: the trainer could not decode the {form} experience ({why})")
            rows[form].append((len(wire), len(e.model_dump_json()), enc, decode_ms, state_ms))
    print(f"{args.cluster}: {state.n_nodes} nodes, {sum(len(b) for b in state.bound)} pods bound, {len(pending)} "
          f"pending; {len(decided)} experiences; deflating what a snapshot's transitions share: {shared_ms:.2f} ms "
          f"once per snapshot")
    for form, vals in rows.items():
        a = np.asarray(vals, dtype=np.float64)
        note = "encoded_experience, deflation shared" if form == "deflated" else "messages.encode of the same"
        print(f"{form:9}: {np.median(a[:, 0]) / 1024:7.1f} KB on EXPERIENCE, {np.median(a[:, 1]) / 1024:7.1f} KB of "
              f"JSON; encode {np.median(a[:, 2]):.3f} ms ({note}); the trainer: messages.decode "
              f"{np.median(a[:, 3]):.3f} ms (every experience it records), decode_decision {np.median(a[:, 4]):.1f} ms "
              f"(the cluster rebuilt, only when it trains on one)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
