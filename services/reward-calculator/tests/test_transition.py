"""Experience transitions (pure): the cluster a decision was made on, the pod and node, a reference to
the next snapshot; what is missing is said; an openb-sized cluster stays well under the message limit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.core.cluster.compact import inflated, is_deflated, state_from_compact
from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, choose_gpus, pod_from_dict, state_from_dict, \
    state_to_dict, to_dict
from agmarl_common.core.sim.traces import load_openb_nodes, load_openb_pods
from agmarl_reward_calculator.transition import SnapshotView, encoded_experience, experience, placed_pod

NODES = (Node("a", 2000, 2048), Node("b", 4000, 4096, gpu_count=1, gpu_model="T4"))
OLD = Pod("old", 500, 512)
NEW = Pod("new", 1000, 1024, num_gpu=1, gpu_milli=500, labels={"app": "x"})
LIMIT = 256 * 1024


def snap(seq: int, bound: tuple[tuple[Pod, int, tuple], ...], pending: tuple[Pod, ...] = (),
         state: dict | None = None) -> SnapshotView:
    s = ClusterState.empty(NODES)
    for p, i, gpus in bound:
        s = bind(s, p, i, gpus)
    return SnapshotView(m.ClusterSnapshot(cluster="t", seq=seq, time=10.0 * seq, state=state or state_to_dict(s),
                                          pending=[to_dict(p) for p in pending], stats={"bound": float(seq)}))


def decision(pod: Pod = NEW, node: str = "b") -> m.Decision:
    return m.Decision(decision_id="d1", cluster="t", namespace="default", pod_key=pod.key, node=node, gpus=[0],
                      policy="fgd", mode="full", score=0.5, seen_at=1.0, decided_at=1.0)


PENDING_BEFORE = snap(1, ((OLD, 0, ()),), (NEW, Pod("other", 100, 100)))
BOUND_AFTER = snap(2, ((OLD, 0, ()), (NEW, 1, (0,))), (Pod("other", 100, 100),))


def test_a_decision_on_a_pending_pod_carries_the_cluster_it_saw():
    exp, missing = experience(decision(), PENDING_BEFORE, BOUND_AFTER, 0.7, LIMIT)
    assert missing == "" and exp.id == "d1" and exp.reward == 0.7
    assert exp.action["pod"] == to_dict(NEW) and exp.action["node"] == "b" and exp.action["gpus"] == [0]
    state, pending = state_from_compact(inflated(exp.state["cluster"]))
    assert state.pods_used.tolist() == [1, 0]  # NEW not bound yet
    assert [p.cpu_milli for p in pending] == [100]  # the other pod waits; NEW is the action, not pending
    assert exp.state["snapshot_seq"] == 1 and exp.state["stats"] == {"bound": 1.0}
    assert exp.next_state == {"snapshot_seq": 2, "time": 20.0, "stats": {"bound": 2.0}} and exp.time == 20.0
    assert m.decode(m.Experience, m.encode(exp)) == exp  # valid on the wire


def test_a_snapshot_that_already_shows_the_pod_bound_is_taken_back_to_before():
    exp, missing = experience(decision(), BOUND_AFTER, BOUND_AFTER, 0.1, LIMIT)
    state, _ = state_from_compact(inflated(exp.state["cluster"]))
    assert missing == "" and state.pods_used.tolist() == [1, 0] and state.gpu_used[1, 0] == 0
    assert pod_from_dict(exp.action["pod"]) == NEW  # no node, no devices: as it was while pending


@pytest.mark.parametrize("before,after,pod,missing,has_cluster", [
    (None, BOUND_AFTER, NEW, "no_snapshot", False),  # decided before any snapshot came
    (snap(1, ((OLD, 0, ()),)), BOUND_AFTER, NEW, "", True),  # decided between snapshots: the pod from after
    (PENDING_BEFORE, BOUND_AFTER, Pod("ghost", 1, 1), "unknown_pod", True),
    (snap(1, (), state={"nodes": "garbage"}), BOUND_AFTER, NEW, "invalid_state", False),
])
def test_what_is_missing_is_said(before, after, pod, missing, has_cluster):
    exp, why = experience(decision(pod), before, after, 0.5, LIMIT)
    assert why == missing and exp.state.get("missing", "") == missing
    assert ("cluster" in exp.state) == has_cluster
    assert ("pod" in exp.action) == (pod is NEW)


def test_a_late_decision_has_no_cluster_rather_than_a_wrong_one():
    """Redelivered after the snapshots from before it are gone: action, reward and next state, no cluster."""
    exp, why = experience(decision(), PENDING_BEFORE, BOUND_AFTER, 0.5, LIMIT, late=True)
    assert why == "late" and exp.state == {"missing": "late"}
    assert exp.action["node"] == "b" and exp.action["pod"] == to_dict(NEW)  # the pod from the snapshot after
    assert exp.reward == 0.5 and exp.next_state["snapshot_seq"] == 2


def test_a_pod_gone_from_both_snapshots_comes_from_its_pod_bound_event():
    gone = snap(2, ((OLD, 0, ()),))  # NEW bound and finished before this snapshot
    bound = {**to_dict(NEW), "node_name": "b", "gpu_devices": [0]}
    exp, why = experience(decision(), PENDING_BEFORE, gone, 0.5, LIMIT, bound_pod=bound)
    assert why == "" and exp.action["pod"] == to_dict(NEW)  # as it was while pending
    assert experience(decision(), snap(1, ((OLD, 0, ()),)), gone, 0.5, LIMIT)[1] == "unknown_pod"


def test_an_oversized_state_is_left_out():
    size = len(m.encode(experience(decision(), PENDING_BEFORE, BOUND_AFTER, 0.5, LIMIT)[0]))
    assert experience(decision(), PENDING_BEFORE, BOUND_AFTER, 0.5, max_bytes=size)[1] == ""  # at the limit: kept
    exp, missing = experience(decision(), PENDING_BEFORE, BOUND_AFTER, 0.5, max_bytes=size - 1)
    assert missing == "oversized" and "cluster" not in exp.state and exp.action["pod"] == to_dict(NEW)
    assert len(m.encode(exp)) < size - 1


def test_transitions_on_one_snapshot_share_its_deflated_parts():
    """The snapshot's nodes, templates and bound pods are packed and compressed once (``SnapshotView.shared``) and
    the same bytes go into every transition decided on it; only the pending list differs. The bytes published are
    ``encode``'s, for a pending pod, a pod the snapshot already shows bound (a state of its own) and an oversized
    state; the trainer's JSON file keeps the compressed part as base64 text and reads the same state back."""
    view = snap(1, ((OLD, 0, ()),), (NEW, Pod("other", 100, 100), Pod("third", 200, 200)))
    for d, before, limit in ((decision(), view, LIMIT), (decision(Pod("other", 100, 100), "a"), view, LIMIT),
                             (decision(), BOUND_AFTER, LIMIT), (decision(), view, 300)):
        exp, missing, data = encoded_experience(d, before, BOUND_AFTER, 0.5, limit)
        assert data == m.encode(exp) and m.decode(m.Experience, data) == exp
        assert ("cluster" in exp.state) == (limit == LIMIT) and missing == ("" if limit == LIMIT else "oversized")
        if "cluster" in exp.state:
            back = m.Experience.model_validate_json(exp.model_dump_json())  # the trainer's file
            assert inflated(back.state["cluster"]) == inflated(exp.state["cluster"])
    first, other = view.compact_without(NEW.key), view.compact_without("default/other")
    assert is_deflated(first) and first["shared"] is other["shared"] is view.shared()
    every = view.compact_without("default/nobody")["pending"]  # NEW, other, third
    assert first["pending"] == every[1:] and other["pending"] == [every[0], every[2]]


def test_the_compact_state_is_computed_once_per_snapshot():
    view = snap(1, ((OLD, 0, ()),), (NEW, Pod("other", 100, 100)))
    first = view.compact_without("default/nobody")
    assert view.compact_without("default/nobody")["shared"] is first["shared"]
    assert inflated(view.compact_without(NEW.key))["templates"] == inflated(first)["templates"]  # pending trimmed
    assert placed_pod("default/nobody", view, view) is None


def test_a_compact_snapshot_is_parsed_once_for_the_reward_and_every_lookup(monkeypatch):
    from agmarl_common.core.cluster import compact
    s = bind(bind(ClusterState.empty(NODES), OLD, 0), NEW, 1, (0,))
    view = snap(1, (), (Pod("other", 100, 100),), state=compact.compact_snapshot(s))
    parsed = []
    real = compact.state_from_snapshot
    counting = lambda data: parsed.append(1) or real(data)  # noqa: E731
    monkeypatch.setattr(compact, "state_from_snapshot", counting)
    assert view.cluster_state().bound[1][0].key == NEW.key  # what the reward reads
    assert (view.placement(OLD.key), view.placement(NEW.key), view.placement("default/other")) == ("a", "b", "")
    assert view.placement("default/nobody") is None
    assert view.pod(NEW.key) == (to_dict(s.bound[1][0]), -1)  # bound: the pod as the snapshot shows it
    assert view.pod("default/other") == ({"name": "other", "cpu_milli": 100, "memory_mib": 100}, 0)
    assert len(parsed) == 1


# ---------------------------------------------------------------------------------------------
# An openb-sized cluster: 1,523 nodes, thousands of bound pods


def openb_cluster(n_bound: int) -> tuple[dict, list[Pod]]:
    """The openb nodes with the first ``n_bound`` trace pods that fit placed (spread by a stride) and the
    rest of the trace pending: the state dict and the pending pods."""
    nodes, pods = load_openb_nodes(), load_openb_pods()
    cpu = np.array([n.cpu_milli for n in nodes])
    mem = np.array([n.memory_mib for n in nodes])
    model = np.array([n.gpu_model for n in nodes])
    gfree = np.where(np.arange(8)[None, :] < np.array([n.gpu_count for n in nodes])[:, None], 1000, 0)
    bound: list[list[dict]] = [[] for _ in nodes]
    placed, k = 0, 0
    for k, p in enumerate(pods):
        if placed >= n_bound:
            break
        ok = (cpu >= p.cpu_milli) & (mem >= p.memory_mib)
        if p.num_gpu:
            ok &= (gfree >= p.gpu_milli).sum(axis=1) >= p.num_gpu
            ok &= np.isin(model, p.gpu_spec) if p.gpu_spec else True
        fit = np.flatnonzero(ok)
        if fit.size == 0:
            continue
        i = int(fit[(k * 7919) % fit.size])
        gpus = choose_gpus(p, gfree[i])
        cpu[i] -= p.cpu_milli
        mem[i] -= p.memory_mib
        for j in gpus:
            gfree[i, j] -= p.gpu_milli if p.is_gpu_share else 1000
        bound[i].append(to_dict(replace(p, node_name=nodes[i].name, gpu_devices=gpus)))
        placed += 1
    return {"nodes": [to_dict(n) for n in nodes], "bound": bound}, list(pods[k:])


@pytest.fixture(scope="module")
def openb():
    return openb_cluster(6000)


def test_an_openb_sized_transition_stays_well_under_the_message_limit(openb):
    state, pending = openb
    assert len(state["nodes"]) == 1523 and sum(map(len, state["bound"])) == 6000 and len(pending) > 1000
    full_snapshot = m.ClusterSnapshot(cluster="openb", seq=1, time=1.0, state=state,
                                      pending=[to_dict(p) for p in pending], stats={})
    assert len(m.encode(full_snapshot)) > m.MAX_MESSAGE_BYTES  # the full form would not even fit
    full = state_from_dict(state)
    pod = pending[0]
    node = full.nodes[int(feasible_nodes(pod, full)[0])].name
    before = SnapshotView(full_snapshot)
    after = SnapshotView(full_snapshot.model_copy(update={"seq": 2}))
    exp, missing = experience(decision(pod, node), before, after, 0.5, LIMIT)
    size = len(m.encode(exp))
    print(f"openb experience: {size} bytes (limit {LIMIT}; full snapshot {len(m.encode(full_snapshot))})")
    assert missing == "" and is_deflated(exp.state["cluster"]) and size < LIMIT
    back, waiting = state_from_compact(inflated(m.decode(m.Experience, m.encode(exp)).state["cluster"]))
    for k in ("cpu_used", "mem_used", "pods_used", "gpu_used"):
        assert np.array_equal(getattr(back, k), getattr(full, k)), k
    assert len(waiting) == len(pending) - 1
    assert feasible_nodes(pod, back).tolist() == feasible_nodes(pod, full).tolist()


def test_each_decision_carries_its_own_credit_against_the_reference_policy():
    from agmarl_common.core.credit import reference_credit
    from agmarl_common.core.policies.kube import KubeDefaultPolicy
    from agmarl_reward_calculator.transition import decision_credit

    kube = KubeDefaultPolicy()
    web = Pod("web", 1500, 1024)
    before = snap(1, ((OLD, 0, ()),), (web,))
    after_a = snap(2, ((OLD, 0, ()), (web, 0, ())))
    # kube-default puts web on the idle node b; the decision packed it onto a (over the hot line): negative,
    # exactly the core difference reward on the cluster the decision saw
    packed = decision(web, "a").model_copy(update={"gpus": []})
    credit = decision_credit(packed, before, kube)
    state = before.cluster_state()
    want, ref = reference_credit(state, web, 0, (), kube)
    assert credit["reference"] == "kube-default" and credit["reference_node"] == "b" and ref == 1
    assert credit["total"] == pytest.approx(want.total) and credit["total"] < 0
    assert set(credit["components"]) == set(want.components) and "balance" in credit["components"]
    # the same decision as the reference: 0, nothing moved
    assert decision_credit(decision(web, "b").model_copy(update={"gpus": []}), before, kube) == {
        "total": 0.0, "reference": "kube-default", "reference_node": "b", "components": {}}
    # it travels in the experience and survives the wire
    exp, missing = experience(packed, before, after_a, 0.5, LIMIT, credit=credit)
    assert missing == "" and m.decode(m.Experience, m.encode(exp)).credit == credit
    # what cannot be credited says why, and never guesses
    assert decision_credit(packed, None, kube) == {"missing": "no_snapshot"}
    assert decision_credit(packed.model_copy(update={"node": ""}), before, kube) == {"missing": "unschedulable"}
    assert decision_credit(packed, after_a, kube) == {"missing": "raced"}
    assert decision_credit(decision(Pod("ghost", 1, 1), "a"), before, kube) == {"missing": "unknown_pod"}
    assert decision_credit(packed.model_copy(update={"node": "zz"}), before, kube) == {"missing": "unknown_node"}


def test_a_pod_that_arrived_after_the_snapshot_is_credited_from_where_it_was_seen_later():
    """A pod announced after the last snapshot before its decision is in no snapshot while pending; the later
    snapshot (or its pod_bound event) gives its spec, and the credit is the one on the earlier snapshot's cluster,
    the same as for a pod that snapshot had seen pending."""
    from agmarl_common.core.credit import reference_credit
    from agmarl_common.core.policies.kube import KubeDefaultPolicy
    from agmarl_reward_calculator.transition import decision_credit, placed_pod

    kube = KubeDefaultPolicy()
    web = Pod("web", 1500, 1024)
    before = snap(1, ((OLD, 0, ()),))  # web not announced yet
    after_a = snap(2, ((OLD, 0, ()), (web, 0, ())))
    packed = decision(web, "a").model_copy(update={"gpus": []})
    assert decision_credit(packed, before, kube) == {"missing": "unknown_pod"}
    arrived = placed_pod(packed.pod_key, None, after_a)
    assert arrived is not None and not arrived.get("node_name")
    credit = decision_credit(packed, before, kube, after=after_a)
    want, _ = reference_credit(before.cluster_state(), web, 0, (), kube)
    assert credit["reference_node"] == "b" and credit["total"] == pytest.approx(want.total) and credit["total"] < 0
    # the same number as when the earlier snapshot had it pending
    assert credit == decision_credit(packed, snap(1, ((OLD, 0, ()),), (web,)), kube)
    # a snapshot that shows it bound already is still a race, whatever was seen later
    assert decision_credit(packed, after_a, kube, after=after_a) == {"missing": "raced"}
