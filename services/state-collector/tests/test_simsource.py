"""The simulated source: announcing pending pods, retries, binding through the simulator."""

import pytest

from agmarl_common.core.cluster.filters import violations
from agmarl_common.core.cluster.model import Pod
from agmarl_common.core.sim import dynamic
from agmarl_state_collector.simsource import SimulatedCluster, add_workload


def make() -> SimulatedCluster:
    return SimulatedCluster.create(n_nodes=8, zones=2, workload="diurnal", rate=2.0, seed=3, chunk_seconds=120,
                                   retry_seconds=2.0)


def test_pending_pods_are_announced_once_until_retry():
    sim = make()
    sim.advance(30.0)
    first = sim.due(now=100.0)
    assert first, "no pod arrived in 30 simulated seconds at 2 pods/s"
    assert sim.due(now=100.5) == []
    sim.unschedulable(first[0].key, now=100.5)
    again = sim.due(now=103.0)
    assert [p.key for p in again] == [first[0].key]


def test_bind_applies_feasible_and_refuses_infeasible():
    sim = make()
    sim.advance(30.0)
    pod = sim.due(now=0.0)[0]
    big = max(sim.state.cluster.nodes, key=lambda n: n.cpu_milli).name
    assert sim.bind(pod.key, big, None, now=0.0).ok
    other = sim.due(now=0.0)
    if other:
        outcome = sim.bind(other[0].key, "no-such-node", None, now=0.0)
        assert not outcome.ok and "unknown node" in outcome.reason
    assert violations(sim.state.cluster) == []


def test_workload_continues_past_the_first_chunk():
    sim = make()
    for _ in range(30):
        sim.advance(10.0)
    assert sim.chunk >= 3
    assert sim.state.counters.arrived > 0


def test_added_workload_merges_with_pods_not_arrived_yet():
    state = dynamic.reset(make().nodes, [Pod(f"a{t}", 1, 1, creation_time=float(t)) for t in (1, 5, 601)])
    state, _ = dynamic.advance(state, 10.0)  # a1 and a5 arrived, a601 still queued
    assert state.next_arrival == 2
    state = add_workload(state, [Pod("b700", 1, 1, creation_time=700.0), Pod("b600", 1, 1, creation_time=600.5)])
    assert [p.name for p in state.workload] == ["a1", "a5", "b600", "a601", "b700"]
    with pytest.raises(ValueError, match="already arrived"):
        add_workload(state, [Pod("late", 1, 1, creation_time=2.0)])
    state, _ = dynamic.advance(state, 700.0)
    assert state.counters.arrived == 5


def test_the_source_keeps_every_chunk_when_a_chunk_overruns_its_horizon():
    sim = SimulatedCluster.create(n_nodes=50, zones=2, workload="batch_online_mix", rate=None, seed=42,
                                  chunk_seconds=600, retry_seconds=2.0)  # the `agmarl up` defaults
    first = len(sim.state.workload)
    assert max(p.creation_time for p in sim.state.workload) > 600  # chunk 0 runs past its 600 s
    for _ in range(4):
        sim.advance(90.0)  # chunk 1 (starting at 601.4 s, before chunk 0's last pod) is added at 300 s
    assert sim.chunk == 2 and len(sim.state.workload) > first
    assert len({p.key for p in sim.state.workload}) == len(sim.state.workload)
