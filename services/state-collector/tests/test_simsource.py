"""The simulated source: announcing pending pods, retries, binding through the simulator."""

from agmarl_common.cluster.filters import violations
from agmarl_state_collector.simsource import SimulatedCluster


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
