"""Live trace replay: the FGD paper's inflation protocol on an openb sub-cluster run through the real
services (state-collector replaying the trace as the cluster, graph-builder, inference; real nats-server)
places every pod exactly where ``agmarl eval``'s in-process run places it, for the same seed and policy,
when one pod is in flight at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agmarl_common.runtime.bus import Bus
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import traces
from agmarl_common.core.sim.inflation import run_inflation
from agmarl_testing.fixtures import wait_healthy

from .conftest import module_of, wait_for

SEED = 7


def sub_cluster(tmp_path):
    """Every 30th openb GPU node (a mix of GPU models) and the first 400 pods of the default list."""
    node_src = traces.openb_node_path(traces.GPU_NODES).read_text().splitlines()
    pod_src = traces.openb_pod_path("default").read_text().splitlines()
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("\n".join([node_src[0]] + node_src[1::30]) + "\n")
    pods.write_text("\n".join(pod_src[:401]) + "\n")
    return nodes, pods


def policy_for(name: str):
    if name.startswith("model:"):
        from agmarl_cli.eval_spec import resolve_policy
        return resolve_policy(name, SEED)
    return get_policy(name)


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", ["fgd", "model:default"])
async def test_live_replay_places_every_pod_as_the_simulator(policy, nats_url, service_processes, tmp_path):
    nodes_csv, pods_csv = sub_cluster(tmp_path)
    nodes, pods = traces.load_openb_nodes(nodes_csv), traces.load_openb_pods(pods_csv)
    expected = run_inflation(nodes, pods, policy_for(policy), np.random.default_rng(SEED))
    names = [nd.name for nd in nodes]
    want = [[p.key, names[i] if i >= 0 else ""] for p, i in zip(expected.pods, expected.node_index)]

    out = tmp_path / "replay.json"
    cluster = f"replay-{policy.replace(':', '-')}"
    env = {"NATS_URL": nats_url, "AGMARL_CLUSTER": cluster, "AGMARL_TRACE_DIR": str(tmp_path / "traces"),
           "AGMARL_HTTP_PORT": "0", "AGMARL_REPLAY_WORKLOAD": f"openb:{pods_csv}",
           "AGMARL_REPLAY_NODES": str(nodes_csv), "AGMARL_SIM_SEED": str(SEED), "AGMARL_REPLAY_OUT": str(out),
           "AGMARL_SNAPSHOT_SECONDS": "2", "AGMARL_PINNED_POLICY": policy,
           "AGMARL_BRIEF_WORKLOAD": f"openb:{pods_csv}", "AGMARL_OBJECTIVE": "allocation",
           "AGMARL_EXPLAIN_MODEL": "false"}
    procs = {s: service_processes(module_of(s), env=env) for s in ("graph-builder", "inference", "state-collector")}
    bus = await Bus.connect(nats_url, name="test-replay")
    try:
        for s, p in procs.items():
            await wait_healthy(bus, s, timeout=60, proc=p)
        assert await wait_for(out.exists, timeout=120, interval=0.5), \
            {s: p.output()[-1500:] for s, p in procs.items()}
        got = json.loads(out.read_text())
    finally:
        await bus.close()
    assert got["pods"] == len(expected.pods) == got["decided"]
    mismatches = [(k, w, g) for k, (w, g) in enumerate(zip(want, got["placements"])) if w != g]
    assert not mismatches, f"{len(mismatches)} of {len(want)} placements differ, first: {mismatches[:3]}"
    assert got["gpu_alloc_100"] == pytest.approx(float(expected.allocation_curve()[100]))
