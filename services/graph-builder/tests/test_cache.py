"""The graph cache: snapshots, optimistic decisions, coupled pods waiting for their peers."""

from agmarl_common.cluster.model import (ClusterState, LabelSelector, Node, Pod, PodAffinityTerm, bind,
                                         state_to_dict)
from agmarl_graph_builder.cache import GraphCache, coupled


def snapshot(*bound: tuple[Pod, int]) -> dict:
    s = ClusterState.empty([Node("a", 1000, 1000, labels={"kubernetes.io/hostname": "a"}),
                            Node("b", 1000, 1000, labels={"kubernetes.io/hostname": "b"})])
    for pod, i in bound:
        s = bind(s, pod, i)
    return state_to_dict(s)


def test_old_snapshots_are_ignored():
    c = GraphCache()
    assert c.on_snapshot(2, snapshot())
    assert not c.on_snapshot(1, snapshot())


def test_decision_takes_resources_until_the_snapshot_shows_it():
    c = GraphCache()
    c.on_snapshot(1, snapshot(), now=0.0)
    p1 = Pod("p1", 800, 100)
    names, _, _ = c.build(p1, 10)
    assert names == ["a", "b"]
    assert c.on_decision(p1.key, "a", (), now=0.0)
    names, feats, reasons = c.build(Pod("p2", 800, 100), 10)
    assert names == ["b"] and "a" in reasons and "Insufficient cpu" in reasons["a"]
    # a snapshot taken before the bind landed: the recent decision is applied again
    c.on_snapshot(2, snapshot(), now=0.5)
    assert c.build(Pod("p3", 800, 100), 10)[0] == ["b"]
    # once the snapshot shows the pod bound, the decision is forgotten (not double counted)
    c.on_snapshot(3, snapshot((p1, 0)), now=0.6)
    assert c.state.cpu_used.tolist() == [800, 0]


def test_coupled_pods_wait_for_their_peers_decision():
    anti = PodAffinityTerm(LabelSelector({"app": "web"}), "kubernetes.io/hostname")
    web1 = Pod("web-1", 10, 10, labels={"app": "web"}, pod_anti_affinity=(anti,))
    web2 = Pod("web-2", 10, 10, labels={"app": "web"}, pod_anti_affinity=(anti,))
    plain = Pod("plain", 10, 10)
    c = GraphCache()
    c.on_snapshot(1, snapshot(), now=0.0)
    assert coupled(web1) and not coupled(plain)
    c.build(web1, 10, now=0.0)
    assert c.waits(web2, now=0.1, timeout=1.0)
    assert not c.waits(plain, now=0.1, timeout=1.0)
    assert not c.waits(web2, now=5.0, timeout=1.0)  # a lost decision does not block forever
    c.build(web1, 10, now=6.0)
    c.on_decision(web1.key, "a", (), now=6.1)
    assert not c.waits(web2, now=6.2, timeout=1.0)
    assert c.build(web2, 10)[0] == ["b"]  # anti-affinity sees web-1 on a
