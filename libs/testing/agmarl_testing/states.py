"""Cluster-state builders for tests: small hand-made states (``pod``, ``node``, ``zoned``, ``term``)
and random ones for property tests (``random_pod`` / ``random_node``: every filter feature at random;
``rich_pod``: most pods with pod (anti-)affinity and spread terms, namespaces and richer selectors;
``random_big_state``: such pods bound through the hard filter, some unbound again; ``filled``: a cluster with the
first pods of a trace bound, as benchmarks start from). Pure functions of their arguments and the numpy
``Generator`` given.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import (
    HOSTNAME_LABEL,
    ZONE_LABEL,
    ClusterState,
    LabelRequirement,
    LabelSelector,
    Node,
    NodeSelectorTerm,
    Pod,
    PodAffinityTerm,
    Taint,
    Toleration,
    TopologySpreadConstraint,
    bind,
    choose_gpus,
    unbind,
    unbind_at,
)
from agmarl_common.core.policies.base import select_node

Req = LabelRequirement
WEB = {"app": "web"}


def pod(name="p", cpu=1000, mem=1024, **kw) -> Pod:
    return Pod(name=name, cpu_milli=cpu, memory_mib=mem, **kw)


def node(name="n", cpu=4000, mem=8192, **kw) -> Node:
    return Node(name=name, cpu_milli=cpu, memory_mib=mem, **kw)


def zoned(*placed: tuple[int, Pod]) -> ClusterState:
    """n0, n1 in zone a; n2 in zone b; n3 has no zone label."""
    nodes = [node("n0", labels={ZONE_LABEL: "a"}), node("n1", labels={ZONE_LABEL: "a"}),
             node("n2", labels={ZONE_LABEL: "b"}), node("n3")]
    s = ClusterState.empty(nodes)
    for i, p in placed:
        s = bind(s, p, i)
    return s


def term(key=ZONE_LABEL, **labels) -> PodAffinityTerm:
    return PodAffinityTerm(LabelSelector(match_labels=labels), key)


ZONES = ("a", "b", "c")
APPS = ("web", "db", "cache")


def random_selector(rng) -> LabelSelector:
    if rng.random() < 0.7:
        return LabelSelector(match_labels={"app": str(rng.choice(APPS))})
    op = str(rng.choice(["In", "NotIn", "Exists", "DoesNotExist"]))
    values = () if op in ("Exists", "DoesNotExist") else (str(rng.choice(APPS)),)
    return LabelSelector(match_expressions=(Req("app", op, values),))


def random_pod(rng, name: str) -> Pod:
    kw: dict = {"labels": {"app": str(rng.choice(APPS))}, "namespace": str(rng.choice(["default", "default", "ns2"]))}
    if rng.random() < 0.3:
        kw["num_gpu"], kw["gpu_milli"] = (1, int(rng.integers(1, 10)) * 100) if rng.random() < 0.5 else (int(rng.integers(1, 3)), 1000)
        if rng.random() < 0.3:
            kw["gpu_spec"] = (str(rng.choice(["T4", "A10"])),)
    if rng.random() < 0.2:
        kw["node_selector"] = {"disk": str(rng.choice(["ssd", "hdd"]))}
    if rng.random() < 0.2:
        kw["required_node_affinity"] = (NodeSelectorTerm((Req(ZONE_LABEL, "In", (str(rng.choice(ZONES)),)),)),)
    if rng.random() < 0.3:
        kw["tolerations"] = (Toleration(str(rng.choice(["dedicated", "node.kubernetes.io/unschedulable"])), "Exists"),)
    keys = (ZONE_LABEL, HOSTNAME_LABEL, "rack")
    if rng.random() < 0.25:
        kw["pod_affinity"] = (PodAffinityTerm(random_selector(rng), str(rng.choice(keys))),)
    if rng.random() < 0.25:
        kw["pod_anti_affinity"] = (PodAffinityTerm(random_selector(rng), str(rng.choice(keys))),)
    if rng.random() < 0.3:
        kw["topology_spread"] = (TopologySpreadConstraint(
            int(rng.integers(1, 3)), str(rng.choice(keys)), str(rng.choice(["DoNotSchedule", "ScheduleAnyway"])),
            random_selector(rng), int(rng.integers(1, 5))),)
    return Pod(name=name, cpu_milli=int(rng.integers(0, 5)) * 500, memory_mib=int(rng.integers(0, 5)) * 1024, **kw)


def random_node(rng, name: str) -> Node:
    labels = {"disk": str(rng.choice(["ssd", "hdd"]))}
    if rng.random() < 0.85:
        labels[ZONE_LABEL] = str(rng.choice(ZONES))
    if rng.random() < 0.5:
        labels["rack"] = f"r{int(rng.integers(0, 3))}"
    taints = ()
    if rng.random() < 0.25:
        taints = (Taint("dedicated", "x", str(rng.choice(["NoSchedule", "NoExecute", "PreferNoSchedule"]))),)
    gpus = int(rng.choice([0, 0, 1, 2, 4, 8]))
    return Node(name=name, cpu_milli=int(rng.integers(1, 5)) * 2000, memory_mib=int(rng.integers(1, 5)) * 4096,
                gpu_count=gpus, gpu_model=str(rng.choice(["T4", "A10"])) if gpus else "", max_pods=int(rng.integers(2, 8)),
                labels=labels, taints=taints, unschedulable=bool(rng.random() < 0.1), ready=bool(rng.random() > 0.05))


def rich_selector(rng) -> LabelSelector:
    r = rng.random()
    if r < 0.5:
        return LabelSelector(match_labels={"app": str(rng.choice(APPS))})
    if r < 0.65:
        return LabelSelector(match_labels={"app": str(rng.choice(APPS)), "tier": str(rng.choice(["fe", "be"]))})
    if r < 0.7:
        return LabelSelector()  # matches every pod
    if r < 0.8:
        return LabelSelector(match_labels={"tier": "fe"}, match_expressions=(Req("app", "NotIn", ("db",)),))
    return random_selector(rng)


def rich_term(rng) -> PodAffinityTerm:
    namespaces = () if rng.random() < 0.8 else tuple(rng.choice(["default", "ns2"], size=int(rng.integers(1, 3)), replace=False))
    return PodAffinityTerm(rich_selector(rng), str(rng.choice((ZONE_LABEL, HOSTNAME_LABEL, "rack"))), namespaces)


def rich_pod(rng, name: str) -> Pod:
    """Like ``_random_pod`` but most pods carry pod terms, some two, with namespaces and richer selectors."""
    base = random_pod(rng, name)
    labels = dict(base.labels)
    if rng.random() < 0.5:
        labels["tier"] = str(rng.choice(["fe", "be"]))
    kw: dict = {"labels": labels}
    if rng.random() < 0.35:
        kw["pod_affinity"] = tuple(rich_term(rng) for _ in range(int(rng.integers(1, 3))))
    if rng.random() < 0.5:
        kw["pod_anti_affinity"] = tuple(rich_term(rng) for _ in range(int(rng.integers(1, 3))))
    if rng.random() < 0.4:
        kw["topology_spread"] = tuple(TopologySpreadConstraint(
            int(rng.integers(1, 3)), str(rng.choice((ZONE_LABEL, HOSTNAME_LABEL, "rack"))),
            str(rng.choice(["DoNotSchedule", "DoNotSchedule", "ScheduleAnyway"])), rich_selector(rng),
            int(rng.integers(1, 4))) for _ in range(int(rng.integers(1, 3))))
    kw["qos"] = str(rng.choice(["LS", "BE", ""]))  # the index counts LS pods per node
    return replace(base, **kw)


def random_big_state(rng, n_nodes: int, n_pods: int) -> ClusterState:
    """Pods bound through the filter, some unbound again (unbind and unbind_at)."""
    state = ClusterState.empty([random_node(rng, f"n{k}") for k in range(n_nodes)])
    for k in range(n_pods):
        p = rich_pod(rng, f"b{k}")
        idx = feasible_nodes(p, state)
        if idx.size:
            i = int(rng.choice(idx))
            state = bind(state, p, i, choose_gpus(p, state.gpu_free()[i]))
        if rng.random() < 0.15 and state.all_pods():
            gone = state.all_pods()[int(rng.integers(len(state.all_pods())))]
            state = unbind(state, gone.key) if rng.random() < 0.5 else unbind_at(state, state.index[gone.node_name], gone.key)
    return state


def filled(nodes: Sequence[Node], pods: Sequence[Pod], limit: int, policy=None) -> tuple[ClusterState, list[Pod]]:
    """(a cluster of ``nodes`` with the first ``limit`` pods of ``pods`` that fit bound, in order, each on the first
    feasible node or the node ``policy`` selects (``policies.base.select_node``), default devices; the pods not
    bound, in order: those that did not fit, then those after the limit)."""
    state, rest, placed = ClusterState.empty(nodes), [], 0
    for pod in pods:
        if placed >= limit:
            rest.append(pod)
            continue
        cands = feasible_nodes(pod, state)
        where = (select_node(policy, pod, state, cands) if policy is not None
                 else int(cands[0]) if len(cands) else None)
        gpus = choose_gpus(pod, state.gpu_free()[where]) if where is not None else None
        if gpus is None:
            rest.append(pod)
            continue
        state = bind(state, pod, where, gpus)
        placed += 1
    return state, rest
