"""In-flight decisions are overlaid until graph-builder reports them seen."""

from agmarl_common.cluster.model import ClusterState, Node, Pod
from agmarl_inference.overlay import InFlight


def test_overlay_applies_unseen_decisions_only():
    state = ClusterState.empty([Node("a", 1000, 1000), Node("b", 1000, 1000)])
    f = InFlight()
    s1 = f.record(Pod("p1", 600, 10), "a", (), now=0.0)
    f.record(Pod("p2", 300, 10), "b", (), now=0.0)
    f.record(Pod("p3", 300, 10), "", (), now=0.0)  # unschedulable: nothing to overlay
    assert f.apply(state, seen=0, now=0.1).cpu_used.tolist() == [600, 300]
    assert f.apply(state, seen=s1, now=0.1).cpu_used.tolist() == [0, 300]
    assert f.apply(state, seen=s1, now=5.0).cpu_used.tolist() == [0, 0]  # expired
