"""The dynamic simulator: step API on tiny literal clusters, the runner, determinism."""

from dataclasses import replace

import numpy as np
import pytest

from agmarl_common.core.cluster import model
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, PodAffinityTerm, LabelSelector
from agmarl_common.core.policies.base import PolicyBase
from agmarl_common.core.reward import outcomes_from_stats
from agmarl_common.core.sim import dynamic
from agmarl_common.core.sim.dynamic import SimConfig, advance, bind, reset, run, snapshot_stats
from agmarl_common.core.sim.loadcurve import flat_curve
from agmarl_common.core.sim.synthetic import affinity_heavy, batch_online_mix, synthetic_cluster


class LeastAllocatedTestPolicy(PolicyBase):
    """Prefers the node with the lowest requested cpu + memory fraction."""

    name = "least-allocated-test"

    def score(self, pod, state, candidates):
        c = np.asarray(candidates)
        return -(state.cpu_used[c] / state.cpu_cap[c] + state.mem_used[c] / state.mem_cap[c])


def _nodes(n=2, cpu=1000, gpus=0):
    return [Node(f"n{i}", cpu_milli=cpu, memory_mib=1000, gpu_count=gpus, gpu_model="T4" if gpus else "")
            for i in range(n)]


def _pod(name, t=0.0, cpu=100, duration=0.0, **kw):
    return Pod(name, cpu_milli=cpu, memory_mib=10, creation_time=t, duration=duration, **kw)


def _types(events):
    return [(e.type, e.pod_key) for e in events]


def test_arrivals_join_pending_in_order_when_their_time_has_passed():
    s = reset(_nodes(), [_pod("b", 2.5), _pod("a", 0.5), _pod("c", 0.5)])
    s, ev = advance(s, 1.0)
    assert list(s.pending) == ["default/a", "default/c"]
    assert _types(ev) == [("pod_added", "default/a"), ("pod_added", "default/c")]
    assert s.time == 1.0 and s.counters.arrived == 2
    s, ev = advance(s, 1.0)
    assert ev == [] and len(s.pending) == 2
    s, ev = advance(s, 0.5)
    assert _types(ev) == [("pod_added", "default/b")]


def test_advance_by_zero_admits_pods_created_now():
    s = reset(_nodes(), [_pod("a", 0.0)])
    s, ev = advance(s, 0.0)
    assert list(s.pending) == ["default/a"] and s.time == 0.0


def test_bind_then_depart_after_duration():
    s, _ = advance(reset(_nodes(), [_pod("a", 0.5, cpu=300, duration=3.0)]), 1.0)
    s, out = bind(s, "default/a", "n1")
    assert out.ok and out.event == dynamic.SimEvent("pod_bound", "default/a", "n1", 1.0, "")
    assert s.cluster.cpu_used.tolist() == [0, 300] and not s.pending and s.running["default/a"].end == 4.0
    assert s.pending_times.tolist() == [0.5]  # created at 0.5, bound at 1.0
    s, ev = advance(s, 2.9)
    assert ev == [] and s.cluster.cpu_used.tolist() == [0, 300]
    s, ev = advance(s, 0.1)
    assert [(e.type, e.pod_key, e.node, e.reason) for e in ev] == [("pod_deleted", "default/a", "n1", "completed")]
    assert s.cluster.cpu_used.tolist() == [0, 0] and not s.running and s.cluster.bound == ((), ())
    assert s.counters.departed == 1 and s.counters.bound == 1


def test_pod_without_duration_runs_forever():
    s, _ = advance(reset(_nodes(), [_pod("a", 0.0)]), 1.0)
    s, _ = bind(s, "default/a", "n0")
    s, _ = advance(s, 1e6)
    assert "default/a" in s.running and s.counters.departed == 0


def test_pending_timeout_counts_unschedulable():
    cfg = SimConfig(pending_timeout_s=5.0)
    s, _ = advance(reset(_nodes(), [_pod("big", 0.0, cpu=5000)], cfg), 1.0, cfg)
    s, _ = advance(s, 4.0, cfg)
    assert "default/big" in s.pending  # waited exactly 5 s: not yet over
    s, ev = advance(s, 1.0, cfg)
    assert [(e.type, e.reason) for e in ev] == [("pod_deleted", "unschedulable: pending timeout")]
    assert not s.pending and s.counters.unschedulable == 1 and s.pending_times.tolist() == [6.0]


def test_zero_timeout_waits_forever():
    cfg = SimConfig(pending_timeout_s=0.0)
    s, _ = advance(reset(_nodes(), [_pod("big", 0.0, cpu=5000)], cfg), 1e5, cfg)
    assert "default/big" in s.pending


@pytest.mark.parametrize("key, node, gpus, reason", [
    ("default/big", "n0", None, "NodeResourcesFit: Insufficient cpu"),
    ("default/nope", "n0", None, "pod is not pending"),
    ("default/small", "n9", None, "unknown node"),
    ("default/small", "n0", (0,), "needs 0 distinct GPU devices"),
    ("default/sel", "n0", None, "NodeAffinity"),
])
def test_bind_refuses_infeasible_and_leaves_state_unchanged(key, node, gpus, reason):
    pods = [_pod("big", 0.0, cpu=900), _pod("small", 0.0), _pod("sel", 0.0, node_selector={"disk": "ssd"})]
    s, _ = advance(reset(_nodes(), pods), 1.0)
    s = replace(s, cluster=model.bind(s.cluster, _pod("x", cpu=500), 0))  # n0 has 500 free
    new, out = bind(s, key, node, gpus)
    assert not out.ok and reason in out.reason
    assert out.event.type == "bind_rejected" and out.event.pod_key == key and out.event.reason == out.reason
    assert new.counters.bind_rejected == 1
    assert new.cluster is s.cluster and new.pending is s.pending and new.running is s.running
    assert replace(new, counters=s.counters) == s


def test_bind_checks_explicit_gpu_devices():
    nodes = _nodes(1, gpus=2)
    pods = [_pod("share", 0.0, num_gpu=1, gpu_milli=600), _pod("other", 0.0, num_gpu=1, gpu_milli=600),
            _pod("whole", 0.0, num_gpu=2, gpu_milli=1000)]
    s, _ = advance(reset(nodes, pods), 1.0)
    s, out = bind(s, "default/share", "n0", (1,))
    assert out.ok and s.cluster.gpu_used[0, :2].tolist() == [0, 600]
    s2, out = bind(s, "default/other", "n0", (1,))
    assert not out.ok and "GPU device 1" in out.reason and s2.counters.bind_rejected == 1
    s2, out = bind(s, "default/other", "n0", (5,))
    assert not out.ok and "GPU device 5" in out.reason
    s, out = bind(s, "default/other", "n0")  # default choice: the free device 0
    assert out.ok and s.cluster.gpu_used[0, :2].tolist() == [600, 600]
    s, out = bind(s, "default/whole", "n0")
    assert not out.ok and "gpu" in out.reason.lower()


def test_bind_refuses_anti_affinity_violation():
    sel = LabelSelector(match_labels={"app": "web"})
    anti = (PodAffinityTerm(sel, model.HOSTNAME_LABEL),)
    pods = [_pod(f"w{i}", 0.0, labels={"app": "web"}, pod_anti_affinity=anti) for i in range(2)]
    s, _ = advance(reset(_nodes(), pods), 1.0)
    s, out = bind(s, "default/w0", "n0")
    assert out.ok
    s, out = bind(s, "default/w1", "n0")
    assert not out.ok and out.reason.startswith("InterPodAffinity")
    s, out = bind(s, "default/w1", "n1")
    assert out.ok


def _failing(rate=1e12, **kw):
    return SimConfig(node_failure_rate=rate, mean_recovery_s=50.0, **kw)


def test_node_failure_evicts_and_requeues_pods():
    s, _ = advance(reset(_nodes(), [_pod("a", 0.0, duration=100.0), _pod("b", 0.0)]), 1.0)
    s, _ = bind(s, "default/a", "n0")
    s, _ = bind(s, "default/b", "n1")
    s, ev = advance(s, 1.0, _failing())
    assert sorted(e.type for e in ev) == ["node_failed", "node_failed", "pod_evicted", "pod_evicted"]
    assert all("requeued" in e.reason for e in ev if e.type == "pod_evicted")
    assert set(s.down) == {0, 1} and s.node_down == frozenset({0, 1})
    assert s.cluster.schedulable.tolist() == [False, False] and not any(n.ready for n in s.cluster.nodes)
    assert s.cluster.cpu_used.tolist() == [0, 0] and not s.running
    assert [pp.restarts for pp in s.pending.values()] == [1, 1]
    assert all(pp.enqueue_time == 2.0 and pp.arrival_time == 0.0 for pp in s.pending.values())
    assert all(not pp.pod.node_name for pp in s.pending.values())
    c = s.counters
    assert (c.node_failures, c.evicted, c.restarted, c.failed) == (2, 2, 2, 0)
    s2, out = bind(s, "default/a", "n0")
    assert not out.ok and out.reason == "node is down"
    # recovery: no new failures, time past every drawn recovery
    s, ev = advance(s, 1e6, SimConfig(pending_timeout_s=0.0))
    assert sorted(e.type for e in ev) == ["node_recovered", "node_recovered"]
    assert not s.down and s.cluster.schedulable.tolist() == [True, True]
    assert s.cluster.nodes == tuple(_nodes()) and s.counters.node_recoveries == 2
    s, out = bind(s, "default/a", "n0")
    assert out.ok and s.running["default/a"].restarts == 1


def test_node_failure_with_fail_policy_counts_failed():
    cfg = _failing(restart_policy="fail")
    s, _ = advance(reset(_nodes(1), [_pod("a", 0.0)]), 1.0)
    s, _ = bind(s, "default/a", "n0")
    s, ev = advance(s, 1.0, cfg)
    assert _types(ev) == [("node_failed", ""), ("pod_failed", "default/a")]
    assert not s.pending and not s.running and s.counters.failed == 1 and s.counters.restarted == 0


def test_random_evictions_requeue_running_pods():
    cfg = SimConfig(eviction_rate=1e12)
    s, _ = advance(reset(_nodes(), [_pod("a", 0.0)]), 1.0)
    s, _ = bind(s, "default/a", "n0")
    s, ev = advance(s, 1.0, cfg)
    assert [(e.type, e.reason) for e in ev] == [("pod_evicted", "evicted; requeued")]
    assert "default/a" in s.pending and s.counters.evicted == 1 and not s.down



@pytest.mark.parametrize("policy", ["requeue", "fail"])
def test_an_evicted_pod_is_a_failure_of_the_window_only_when_it_is_not_restarted(policy):
    # the simulator's window counts as the reward-calculator and the trainer do (reward.outcomes_from_stats):
    # a requeued pod is pending again, not failed as well (it counted as both before); one that is gone failed
    s, _ = advance(reset(_nodes(), [_pod("a", 0.0), _pod("b", 0.0)]), 1.0)
    s, _ = bind(s, "default/a", "n0")
    before = s.counters
    s, _ = advance(s, 1.0, SimConfig(eviction_rate=1e12, restart_policy=policy))
    assert s.counters.evicted - before.evicted == 1 and "default/b" in s.pending
    out = dynamic.window_outcomes(s, before)
    assert (out.pending, out.scheduled, out.failed) == ((2, 0, 0) if policy == "requeue" else (1, 0, 1))
    assert out == outcomes_from_stats(before.as_dict(), {**snapshot_stats(s), "violations": 0},
                                      dynamic.mean_pending_wait(s))

def test_evicted_then_rebound_pod_departs_on_its_new_end_only():
    s, _ = advance(reset(_nodes(), [_pod("a", 0.0, duration=10.0)]), 1.0)
    s, _ = bind(s, "default/a", "n0")  # ends at 11
    s, _ = advance(s, 1.0, SimConfig(eviction_rate=1e12))  # t=2, requeued
    s, _ = advance(s, 3.0)  # t=5
    s, _ = bind(s, "default/a", "n1")  # ends at 15
    s, ev = advance(s, 7.0)  # t=12: the stale end at 11 must not remove it
    assert ev == [] and "default/a" in s.running
    s, ev = advance(s, 3.0)
    assert _types(ev) == [("pod_deleted", "default/a")] and s.counters.departed == 1


def test_measured_load_with_ratio_and_noise():
    s, _ = advance(reset(_nodes(), [_pod("a", 0.0, cpu=400)]), 1.0)
    s, _ = bind(s, "default/a", "n0")
    s, _ = advance(s, 1.0, SimConfig(load_ratio=0.5))
    assert s.cluster.cpu_load.tolist() == [200.0, 0.0] and s.cluster.mem_load.tolist() == [5.0, 0.0]
    s2, _ = advance(s, 1.0, SimConfig(metric_noise_std=0.2))
    assert s2.cluster.cpu_load[0] != 400.0 and s2.cluster.cpu_load[1] == 0.0
    s3, _ = advance(s, 1.0, SimConfig(metric_noise_std=0.2))
    assert s3.cluster.cpu_load.tolist() == s2.cluster.cpu_load.tolist()  # same seed, same step


def test_unbind_at_matches_model_unbind():
    nodes = _nodes(3, gpus=2)
    c = ClusterState.empty(nodes)
    anti = (PodAffinityTerm(LabelSelector(match_labels={"x": "y"}), model.HOSTNAME_LABEL),)
    placed = [(_pod("a"), 0, ()), (_pod("b", num_gpu=1, gpu_milli=300), 1, (1,)),
              (_pod("c", pod_anti_affinity=anti), 1, ()), (_pod("d"), 2, ())]
    for p, i, g in placed:
        c = model.bind(c, p, i, g)
    for key, i in (("default/b", 1), ("default/c", 1), ("default/a", 0)):
        ours, ref = dynamic._unbind_at(c, i, key), model.unbind(c, key)
        for f in ("cpu_used", "mem_used", "pods_used", "eph_used", "gpu_used", "affinity_pods"):
            assert np.array_equal(getattr(ours, f), getattr(ref, f)), f
        assert ours.bound == ref.bound


def test_snapshot_stats_on_a_literal_case():
    s, _ = advance(reset(_nodes(), [_pod("a", 0.0, cpu=900, qos="LS"), _pod("b", 0.0, cpu=300)]), 1.0)
    s, _ = bind(s, "default/a", "n0")
    st = snapshot_stats(s)
    assert st["util_cpu"] == pytest.approx(0.45) and st["balance"] == pytest.approx(0.45)
    assert st["pending"] == 1.0 and st["running"] == 1.0 and st["sla_bad"] == 1.0 and st["sla_total"] == 1.0
    assert st["arrived"] == 2.0 and st["bound"] == 1.0 and st["time"] == 1.0


def test_reset_and_config_validation():
    with pytest.raises(ValueError, match="unique"):
        reset(_nodes(), [_pod("a"), _pod("a", 1.0)])
    with pytest.raises(ValueError):
        reset(_nodes(), [], seed=-1)
    with pytest.raises(ValueError):
        SimConfig(restart_policy="sometimes")
    with pytest.raises(ValueError):
        SimConfig(tick_s=0)
    with pytest.raises(ValueError):
        advance(reset(_nodes(), []), -1.0)
    bound = replace(_pod("a"), node_name="n1", gpu_devices=(0,))
    assert reset(_nodes(), [bound]).workload[0].node_name == ""


# ---------------------------------------------------------------------------------------------
# Runner


def test_run_hand_computed_two_pods_one_node():
    # a and b (600 milli each) arrive at t=0 on one 1000-milli node; a binds at t=1, runs to 11;
    # b retries every tick (backoff 1 s) and binds at 11, runs to 21; horizon 25 s.
    cfg = SimConfig(horizon_s=25.0, backoff_initial_s=1.0, backoff_max_s=1.0)
    pods = [_pod("a", 0.0, cpu=600, duration=10.0), _pod("b", 0.0, cpu=600, duration=10.0)]
    r = run(LeastAllocatedTestPolicy(), _nodes(1), pods, cfg, seed=0, record_every=1.0)
    assert r.series.time.tolist() == [float(t) for t in range(1, 26)]
    assert r.series.util_cpu.tolist() == [0.6] * 20 + [0.0] * 5
    assert r.series.pending.tolist() == [1.0] * 10 + [0.0] * 15
    assert r.pending_times.tolist() == [1.0, 11.0]
    out = r.summary()
    assert out["util_cpu_mean"] == pytest.approx(0.48)
    assert out["pending_mean"] == pytest.approx(0.4)
    assert out["pending_time_p50_s"] == pytest.approx(6.0)
    assert out["pending_time_p99_s"] == pytest.approx(10.9)
    assert (out["arrived"], out["bound"], out["departed"], out["bind_rejected"]) == (2.0, 2.0, 2.0, 0.0)
    assert out["hard_violations"] == 0.0 and out["pending_at_end"] == 0.0 and out["running_at_end"] == 0.0
    assert r.policy == "least-allocated-test"


def test_run_backs_off_exponentially():
    # same as above with the default backoff (1, 2, 4, 8 s): b tries at 1, 2, 4, 8, 16
    cfg = SimConfig(horizon_s=30.0)
    pods = [_pod("a", 0.0, cpu=600, duration=10.0), _pod("b", 0.0, cpu=600, duration=10.0)]
    r = run(LeastAllocatedTestPolicy(), _nodes(1), pods, cfg)
    assert r.pending_times.tolist() == [1.0, 16.0]


def test_run_counts_sla_violations_of_ls_pods_on_hot_nodes():
    pods = [_pod("ls", 0.0, cpu=300, qos="LS"), _pod("be", 0.0, cpu=600, qos="BE")]
    r = run(LeastAllocatedTestPolicy(), _nodes(1), pods, SimConfig(horizon_s=10.0), record_every=1.0)
    assert r.sla_violating_pods == 1
    assert r.summary()["sla_violation_rate"] == 1.0


def _small_run(seed, policy=None, failures=2.0):
    nodes = synthetic_cluster(8, seed=0)
    pods = batch_online_mix(nodes, horizon_s=300.0, rate=3.0, seed=1, curve=flat_curve())
    cfg = SimConfig(horizon_s=300.0, node_failure_rate=failures, mean_recovery_s=60.0,
                    eviction_rate=1.0, metric_noise_std=0.1)
    return run(policy or LeastAllocatedTestPolicy(), nodes, pods, cfg, seed=seed, record_every=10.0)


def test_run_is_deterministic_for_a_seed():
    a, b, c = _small_run(3), _small_run(3), _small_run(4)
    assert a.summary() == b.summary()
    assert a.series.as_dict() == b.series.as_dict()
    assert a.pending_times.tolist() == b.pending_times.tolist()
    assert a.final_state.cluster.bound == b.final_state.cluster.bound
    assert a.counters.node_failures > 0 and a.counters.evicted > 0
    assert (c.counters.node_failures, c.counters.evicted, c.summary()) != (a.counters.node_failures,
                                                                         a.counters.evicted, a.summary())


def test_run_keeps_hard_constraints_with_failures_and_affinity():
    nodes = synthetic_cluster(10, taint_fraction=0.3, seed=2)
    pods = affinity_heavy(nodes, horizon_s=300.0, rate=0.5, seed=2, curve=flat_curve())
    cfg = SimConfig(horizon_s=300.0, node_failure_rate=2.0, mean_recovery_s=60.0)
    r = run(LeastAllocatedTestPolicy(), nodes, pods, cfg, seed=1, record_every=30.0, check_every=1)
    assert r.hard_violations == 0 and r.violation_examples == ()
    c = r.counters
    assert c.bound > 0.8 * c.arrived
    # conservation: every arrival is pending, running, done, timed out or failed
    s = r.final_state
    assert c.arrived == len(s.pending) + len(s.running) + c.departed + c.unschedulable + c.failed
    assert len(r.series.time) == 10


class _BadPolicy(PolicyBase):
    """Picks devices that do not exist: the bind must be refused and counted, never applied."""

    name = "bad"

    def score(self, pod, state, candidates):
        return np.zeros(len(candidates))

    def choose_gpus(self, pod, state, node_index):
        return (7,)


def test_run_counts_refused_binds_of_a_misbehaving_policy():
    r = run(_BadPolicy(), _nodes(1), [_pod("a", 0.0)], SimConfig(horizon_s=5.0))
    assert r.counters.bound == 0 and r.counters.bind_rejected >= 1 and r.hard_violations == 0
    assert r.final_state.cluster.cpu_used.tolist() == [0]


def test_scripted_node_failure_takes_the_random_failure_path():
    s, _ = advance(reset(_nodes(), [_pod("a", 0.0, duration=100.0), _pod("b", 0.0)]), 1.0)
    s, _ = bind(s, "default/a", "n0")
    s, _ = bind(s, "default/b", "n1")
    s, ev = dynamic.fail_nodes(s, [0], until=50.0)
    assert [(e.type, e.reason) for e in ev if e.type == "node_failed"] == [("node_failed", "scripted")]
    assert [e.pod_key for e in ev if e.type == "pod_evicted"] == ["default/a"]
    assert s.down == {0: 50.0} and s.cluster.schedulable.tolist() == [False, True]
    assert "default/a" in s.pending and set(s.running) == {"default/b"}
    assert (s.counters.node_failures, s.counters.evicted) == (1, 1)
    again, ev2 = dynamic.fail_nodes(s, [0], until=99.0)  # already down: left as it is
    assert again.down == {0: 50.0} and ev2 == []
    s, ev = advance(s, 60.0, SimConfig(pending_timeout_s=0.0))
    assert "node_recovered" in [e.type for e in ev] and not s.down and s.cluster.schedulable.tolist() == [True, True]


def test_the_window_reward_counts_how_long_pending_pods_have_waited():
    # two pods that do not fit anywhere wait; the composite's wait term must see their wait (it read 1.0, no
    # wait, in every simulated window before: window_outcomes left pending_time_s at 0)
    from agmarl_common.core.reward import reward_components, score_wait

    s = reset(_nodes(1, cpu=1000), [_pod("big", 0.0, cpu=5000), _pod("huge", 10.0, cpu=9000)])
    before = s.counters
    s, _ = advance(s, 40.0)
    assert dynamic.mean_pending_wait(s) == pytest.approx((40.0 + 30.0) / 2)
    out = dynamic.window_outcomes(s, before)
    assert out.pending == 2 and out.pending_time_s == pytest.approx(35.0)
    wait = reward_components(s.cluster, out)["wait"]
    assert wait == pytest.approx(score_wait(35.0)) and wait < 0.5
    assert dynamic.mean_pending_wait(reset(_nodes(), [])) == 0.0
