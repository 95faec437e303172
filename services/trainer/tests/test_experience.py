"""Recorded experience -> imitation samples (tiny literal clusters), the bounded, persisted buffer, and
live experience: what the reward-calculator process publishes on a real nats-server decodes into samples."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.cluster.compact import compact_state, deflated
from agmarl_common.core.cluster.model import ClusterState, Node, Pod, bind, state_from_dict, state_to_dict, to_dict
from agmarl_testing.fixtures import ask_health, decisions_taken_up, wait_healthy
from agmarl_common.core.features import POD_FEATURES
from agmarl_trainer.experience import ExperienceBuffer, decode_decision, experience_samples, mirror_retry_due, \
    read_experience, reward_threshold

NODES = (Node("small", cpu_milli=1000, memory_mib=1024), Node("big", cpu_milli=8000, memory_mib=16384),
         Node("gpu", cpu_milli=8000, memory_mib=16384, gpu_count=2, gpu_model="V100"))
WEB = Pod("web", cpu_milli=500, memory_mib=512)
HUGE = Pod("huge", cpu_milli=4000, memory_mib=4096)


def state(bound: tuple[tuple[Pod, int], ...] = ()) -> ClusterState:
    s = ClusterState.empty(NODES)
    for pod, i in bound:
        s = bind(s, pod, i)
    return s


def exp(i: int, pod: Pod, node: str, reward: float, st: dict | None = None, with_pod: bool = True) -> m.Experience:
    st = {"cluster": state_to_dict(state(((Pod("old", 200, 256), 1),))), "pending": [to_dict(pod)]} \
        if st is None else st
    action = {"pod_key": pod.key, "node": node, **({"pod": to_dict(pod)} if with_pod else {})}
    return m.Experience(id=f"e{i}", cluster="t", state=st, action=action, reward=reward, next_state={}, time=float(i))


@pytest.mark.parametrize("e,why", [
    (exp(0, WEB, "big", 0.5, st={"util_cpu": 0.4, "bound": 3.0}), "no_cluster_state"),  # what stats-only carries
    (exp(1, WEB, "big", 0.5, st={"cluster": state_to_dict(state()), "pending": []}, with_pod=False), "unknown_pod"),
    (exp(2, WEB, "nowhere", 0.5), "unknown_node"),
    (exp(3, HUGE, "small", 0.5), "infeasible_node"),  # the hard filter rejects the recorded pick
    (exp(4, WEB, "big", 0.5, st={"cluster": {"nodes": [{"name": "x", "cpu_milli": "bad", "oops": 1}]}}), "invalid"),
])
def test_unusable_transitions_say_why(e, why):
    d, reason = decode_decision(e)
    assert d is None and reason == why


def test_a_decision_decodes_to_its_candidates_and_choice():
    d, why = decode_decision(exp(0, HUGE, "gpu", 0.7, with_pod=False))  # pod found among pending by key
    assert why == "" and d is not None
    assert [NODES[i].name for i in d.candidates] == ["big", "gpu"]  # 'small' cannot hold it
    assert NODES[d.candidates[d.choice]].name == "gpu" and d.reward == 0.7
    assert {p.name for p in d.workload} == {"old", "huge"}


def test_state_dict_at_top_level_is_accepted():
    d, why = decode_decision(exp(0, WEB, "small", 0.1, st={**state_to_dict(state()), "pending": []}))
    assert why == "" and NODES[d.candidates[d.choice]].name == "small"


def compact_exp(pod: Pod, node: str, cluster: dict | None = None) -> m.Experience:
    """What the reward-calculator sends: the compact cluster (``old`` bound, ``web`` also waiting) and the pod."""
    cluster = compact_state(state(((Pod("old", 200, 256), 1),)), (WEB, pod), without=pod.key) \
        if cluster is None else cluster
    return m.Experience(id="c", cluster="t", state={"cluster": cluster, "snapshot_seq": 1},
                        action={"pod_key": pod.key, "node": node, "pod": to_dict(pod)}, reward=0.4,
                        next_state={"snapshot_seq": 2}, time=1.0)


def test_the_compact_form_of_the_reward_calculator_decodes():
    d, why = decode_decision(m.decode(m.Experience, m.encode(compact_exp(HUGE, "gpu"))))
    assert why == "" and [NODES[i].name for i in d.candidates] == ["big", "gpu"]
    assert NODES[d.candidates[d.choice]].name == "gpu" and d.state.pods_used.tolist() == [0, 1, 0]
    assert sorted((p.cpu_milli, p.memory_mib) for p in d.workload) == [(200, 256), (500, 512), (4000, 4096)]
    samples, counts = experience_samples([compact_exp(HUGE, "gpu"), compact_exp(WEB, "small")], quantile=0.0)
    assert counts["used"] == 2 and [NODES[int(s.graph.cand_node[s.action[0]])].name for s in samples] == \
        ["gpu", "small"]
    flag = POD_FEATURES.index("objective_composite")
    assert all(s.graph.pod_x[0, flag] == 1.0 for s in samples)  # the deployment's objective (default composite)
    packing, _ = experience_samples([compact_exp(HUGE, "gpu")], quantile=0.0, objective="allocation")
    assert packing[0].graph.pod_x[0, flag] == 0.0 and not packing[0].graph.cand_attr[:, -1].any()


def test_the_deflated_form_decodes_as_the_compact_form_and_from_the_trainers_file():
    """The reward-calculator sends the compact cluster deflated (``compact.deflated``); the trainer's file keeps
    its compressed part as base64 text: both decode to the decision the plain compact form gives."""
    plain = compact_exp(HUGE, "gpu")
    small = compact_exp(HUGE, "gpu", cluster=deflated(plain.state["cluster"]))
    want, _ = decode_decision(plain)
    for e in (m.decode(m.Experience, m.encode(small)), m.Experience.model_validate_json(small.model_dump_json())):
        d, why = decode_decision(e)
        assert why == "" and d.candidates.tolist() == want.candidates.tolist() and d.choice == want.choice
        assert d.state.pods_used.tolist() == want.state.pods_used.tolist() and len(d.workload) == len(want.workload)


@pytest.mark.parametrize("e,why", [
    (compact_exp(HUGE, "small"), "infeasible_node"),
    (compact_exp(HUGE, "gpu", cluster={"format": "agmarl.compact-zlib/1", "shared": b"junk", "pending": []}),
     "invalid"),
    (compact_exp(HUGE, "gpu", cluster={"format": "agmarl.compact/1", "nodes": {"n": 1}}), "invalid"),
    (compact_exp(HUGE, "gpu", cluster={**compact_state(state()), "bound": [[99 << 8], [], []]}), "invalid"),
])
def test_unusable_compact_transitions_say_why(e, why):
    assert decode_decision(e) == (None, why)


def test_decisions_at_or_above_the_median_reward_become_labelled_samples():
    es = [exp(0, WEB, "small", 0.1), exp(1, WEB, "big", 0.9), exp(2, HUGE, "gpu", 0.5),
          exp(3, WEB, "big", 0.2, st={"util_cpu": 0.3})]
    samples, counts = experience_samples(es)
    assert counts == {"no_cluster_state": 1, "below_threshold": 1, "used": 2, "by_credit": 0}
    picked = []
    for s in samples:
        g = s.graph
        assert g.n_pods == 1 and s.action.shape == (1,)
        picked.append(NODES[int(g.cand_node[s.action[0]])].name)
    assert picked == ["big", "gpu"]  # the 0.9 and 0.5 decisions, in order; the 0.1 one is left out
    assert [s.reward for s in samples] == [0.9, 0.5]


def test_each_decisions_own_credit_picks_the_samples_when_every_one_has_it():
    # the window reward says the opposite of the credit: the shared reward was high in the window where the
    # agents did worse than the reference, so only the per-agent credit points at the better decisions
    rows = [(WEB, "big", 0.9, -0.2), (HUGE, "gpu", 0.8, -0.1), (WEB, "small", 0.1, 0.3), (HUGE, "big", 0.2, 0.05)]
    exps = [exp(i, pod, node, r).model_copy(update={"credit": {"total": c, "reference": "kube-default"}})
            for i, (pod, node, r, c) in enumerate(rows)]
    samples, counts = experience_samples(exps)
    assert counts["by_credit"] == 1 and counts["used"] == 2 and counts["below_threshold"] == 2
    assert sorted(float(s.credit[0]) for s in samples) == [0.05, 0.3]
    # the window reward instead (asked for, or when one usable experience has no credit): the other two
    _, by_reward = experience_samples(exps, signal="reward")
    mixed = [*exps[:3], exp(3, HUGE, "big", 0.2)]
    picked, counts = experience_samples(mixed)
    assert by_reward["by_credit"] == 0 and counts["by_credit"] == 0
    assert sorted(s.reward for s in picked) == [0.8, 0.9]
    with pytest.raises(ValueError):
        experience_samples(exps, signal="luck")
    # a credit that is not a finite number is no credit
    d, _ = decode_decision(exps[0].model_copy(update={"credit": {"total": float("nan")}}))
    assert d is not None and d.credit is None


def test_max_samples_keeps_the_most_recent():
    es = [exp(i, WEB, "big", 1.0) for i in range(5)]
    samples, counts = experience_samples(es, max_samples=2)
    assert len(samples) == 2 and counts["used"] == 2


@pytest.mark.parametrize("rewards,quantile,cut", [([], 0.5, float("inf")), ([3.0, 1.0, 2.0], 0.5, 2.0),
                                                   ([1.0, 1.0], 0.5, 1.0), ([0.0, 10.0], 0.0, 0.0)])
def test_reward_threshold(rewards, quantile, cut):
    assert reward_threshold(rewards, quantile) == cut


def test_buffer_is_bounded_deduplicated_and_survives_a_restart(tmp_path):
    path = tmp_path / "experience.jsonl"
    buf = ExperienceBuffer(3, path)
    assert [buf.add(exp(i, WEB, "big", float(i))) for i in (0, 1, 1, 2, 3)] == [True, True, False, True, True]
    assert [e.id for e in buf.items.values()] == ["e1", "e2", "e3"]
    again = ExperienceBuffer(3, path)  # a restart reads the file
    assert [e.id for e in again.items.values()] == ["e1", "e2", "e3"]
    for i in range(4, 12):  # the file is compacted, never more than 2 x capacity lines
        again.add(exp(i, WEB, "big", float(i)))
        assert len(path.read_text().splitlines()) <= 6
    assert [e.id for e in ExperienceBuffer(3, path).items.values()] == ["e9", "e10", "e11"]
    assert again.write(tmp_path / "copy.jsonl") == 3
    copy = read_experience(tmp_path / "copy.jsonl")
    assert [e.id for e in copy] == ["e9", "e10", "e11"] and copy[0].action["node"] == "big"
    assert read_experience(tmp_path / "missing.jsonl") == []


def test_a_transition_the_file_cannot_take_is_kept_in_memory_and_counted(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the state directory should be")
    buf = ExperienceBuffer(5, blocked / "experience.jsonl")
    assert [buf.add(exp(i, WEB, "big", 1.0)) for i in (0, 1, 1)] == [True, True, False]
    assert [e.id for e in buf.items.values()] == ["e0", "e1"] and buf.mirror_failures == 2
    ok = ExperienceBuffer(5, tmp_path / "experience.jsonl")
    ok.add(exp(0, WEB, "big", 1.0))
    assert ok.mirror_failures == 0 and len(ExperienceBuffer(5, tmp_path / "experience.jsonl")) == 1


def test_one_failed_append_leaves_the_file_behind_and_the_next_good_try_rewrites_it(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.write_text("a file where the state directory should be")
    buf = ExperienceBuffer(5, state_dir / "experience.jsonl", clock=lambda: 0.0)
    buf.add(exp(0, WEB, "big", 1.0))
    assert buf.mirror_failures == 1 and buf.mirror_behind  # the file lacks e0
    state_dir.unlink()
    state_dir.mkdir()
    buf.add(exp(1, WEB, "big", 1.0))  # due (one failed try): rewritten with both, not e1 appended alone
    assert [e.id for e in read_experience(state_dir / "experience.jsonl")] == ["e0", "e1"] and not buf.mirror_behind


@pytest.mark.parametrize("failed,adds,seconds,due", [
    (0, 0, 0.0, True),  # nothing failed: every add writes
    (1, 1, 0.0, True), (2, 1, 0.0, False), (2, 2, 0.0, True), (3, 3, 0.0, False), (3, 4, 0.0, True),
    (40, 1023, 0.0, False), (40, 1024, 0.0, True),  # the gap stops growing at max_adds
    (40, 1, 59.9, False), (40, 1, 60.0, True),  # ... and a try is never further apart than max_seconds
])
def test_a_failing_mirror_is_tried_again_after_doubling_gaps_bounded_in_adds_and_time(failed, adds, seconds, due):
    assert mirror_retry_due(failed, adds, seconds) is due


def test_a_failing_mirror_backs_off_and_catches_up_with_memory_once_it_can_write(tmp_path, caplog):
    """While the state directory's place is taken by a file (an OSError for root too), adds try the file only
    after 1, 2, 4 ... adds; the first try once it is a directory again rewrites it with every kept transition."""
    state_dir = tmp_path / "state"
    state_dir.write_text("a file where the state directory should be")
    path = state_dir / "experience.jsonl"
    buf = ExperienceBuffer(50, path, clock=lambda: 0.0)
    with caplog.at_level("ERROR", logger="agmarl.trainer.experience"):
        for i in range(8):
            buf.add(exp(i, WEB, "big", 1.0))
    assert len(caplog.records) == 4  # one per failed try: adds 0, 1, 3 and 7 (gaps 1, 2, 4)
    assert buf.mirror_failures == 8 and buf.mirror_behind
    state_dir.unlink()
    state_dir.mkdir()  # writable again; the next try is due 8 adds after the last (i = 15)
    for i in range(8, 15):
        buf.add(exp(i, WEB, "big", 1.0))
        assert not path.exists()
    buf.add(exp(15, WEB, "big", 1.0))  # in step once: every kept transition, oldest first
    assert [e.id for e in read_experience(path)] == [f"e{i}" for i in range(16)] and not buf.mirror_behind
    buf.add(exp(16, WEB, "big", 1.0))  # and appended to from then on
    assert [e.id for e in ExperienceBuffer(50, path).items.values()] == [f"e{i}" for i in range(17)]
    assert [e.id for e in buf.items.values()] == [f"e{i}" for i in range(17)] and buf.mirror_failures == 15


def test_a_failing_mirror_is_tried_again_after_max_seconds_whatever_the_adds(tmp_path):
    state_dir, now = tmp_path / "state", [0.0]
    state_dir.write_text("not a directory")
    buf = ExperienceBuffer(50, state_dir / "experience.jsonl", clock=lambda: now[0])
    for i in range(12):  # tries at 0, 1, 3, 7; the next one is due at 15
        buf.add(exp(i, WEB, "big", 1.0))
    state_dir.unlink()
    state_dir.mkdir()
    now[0] = 7 * 60.0  # a minute since the last try
    buf.add(exp(12, WEB, "big", 1.0))
    assert [e.id for e in read_experience(state_dir / "experience.jsonl")] == [f"e{i}" for i in range(13)]


def test_a_rewrite_that_fails_at_start_does_not_stop_the_trainer(tmp_path):
    path = tmp_path / "experience.jsonl"
    ExperienceBuffer(5, path).add(exp(0, WEB, "big", 1.0))
    (tmp_path / "experience.jsonl.tmp").mkdir()  # the rewrite's temporary file cannot be made (for root too)
    buf = ExperienceBuffer(5, path, clock=lambda: 0.0)
    assert list(buf.items) == ["e0"] and buf.mirror_behind
    (tmp_path / "experience.jsonl.tmp").rmdir()
    buf.add(exp(1, WEB, "big", 1.0))  # due (one failed try): rewritten with both
    assert [e.id for e in read_experience(path)] == ["e0", "e1"] and not buf.mirror_behind


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "experience.jsonl"
    ExperienceBuffer(5, path).add(exp(0, WEB, "big", 1.0))
    with path.open("a") as f:
        f.write('{"id": "e1", "clus')
    assert len(ExperienceBuffer(5, path)) == 1
    assert np.isfinite(reward_threshold([1.0]))


# ---------------------------------------------------------------------------------------------
# Live experience: the reward-calculator process on a real nats-server, read back from the stream

LIVE = "exp-live"


def live_snapshot(cluster: str, seq: int, bound: tuple[tuple[Pod, int, tuple], ...], pending: tuple[Pod, ...]) -> m.ClusterSnapshot:
    s = state()
    for pod, i, gpus in bound:
        s = bind(s, pod, i, gpus)
    return m.ClusterSnapshot(cluster=cluster, seq=seq, time=float(seq), state=state_to_dict(s),
                             pending=[to_dict(p) for p in pending], stats={"bound": float(len(bound)), "pending": 0.0})


async def seen_snapshot(bus: Bus, seq: int, timeout: float = 10.0) -> None:
    """Wait (bounded) until the reward-calculator's health reports snapshot ``seq`` received."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await ask_health(bus, "reward-calculator")
        if status is not None and status.details.get("snapshot_seq", -1) >= seq:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"the reward-calculator never reported snapshot {seq}")


def live_decision(cluster: str, i: int, pod: Pod, node: str) -> m.Decision:
    now = time.time()
    return m.Decision(decision_id=f"{cluster}-{i}", cluster=cluster, namespace="default", pod_key=pod.key, node=node,
                      policy="fgd", mode="full", seen_at=now, decided_at=now)


@pytest.mark.parametrize("credit_budget", ["", "0"])
async def test_live_experience_from_the_reward_calculator_becomes_samples(nats_url, service_processes, credit_budget):
    """Each experience carries its own credit; with no CPU budget for credits (a reward-calculator catching up)
    it says so and the experience is written all the same."""
    # each case its own cluster and decision ids (JetStream drops a message id it saw in the last 2 minutes)
    live = f"{LIVE}-{credit_budget or 'default'}"
    share = Pod("share", 1000, 1024, num_gpu=1, gpu_milli=500)
    steps = [  # (snapshot the decision is made on, the decision): WEB -> small, HUGE -> big, share -> gpu
        (live_snapshot(live, 1, (), (WEB, HUGE, share)), live_decision(live, 0, WEB, "small")),
        (live_snapshot(live, 2, ((WEB, 0, ()),), (HUGE, share)), live_decision(live, 1, HUGE, "big")),
        (live_snapshot(live, 3, ((WEB, 0, ()), (HUGE, 1, ())), (share,)), live_decision(live, 2, share, "gpu")),
    ]
    final = live_snapshot(live, 4, ((WEB, 0, ()), (HUGE, 1, ()), (share, 2, (0,))), ())
    bus = await Bus.connect(nats_url, name="test-live-experience")
    try:
        await bus.ensure_streams()
        budget = {"AGMARL_CREDIT_BUDGET_SECONDS": credit_budget} if credit_budget else {}
        proc = service_processes("agmarl_reward_calculator", env={"NATS_URL": nats_url, "AGMARL_CLUSTER": live,
                                                                  **budget})
        await wait_healthy(bus, "reward-calculator", timeout=30, proc=proc)
        for snap, dec in steps:
            await bus.publish(subjects.snapshot(live), snap)
            await bus.flush()
            # the decision is made on this snapshot: once the reward-calculator has it (its health says which
            # snapshot it holds), the decision is stamped and published
            await seen_snapshot(bus, snap.seq)
            dec.seen_at = dec.decided_at = time.time()
            await bus.js_publish(subjects.decision(live, "default"), dec)
        await decisions_taken_up(bus, live, proc=proc)  # the last decision held before the snapshot that settles it
        await bus.publish(subjects.snapshot(live), final)
        await bus.flush()
        got: list[m.Experience] = []
        sub = await bus.js.subscribe(subjects.experience(live), ordered_consumer=True)
        try:
            for _ in range(100):  # bounded: up to ~10 s for the three transitions
                if len(got) == 3:
                    break
                try:
                    got.append(m.decode(m.Experience, (await sub.next_msg(timeout=0.1)).data))
                except asyncio.TimeoutError:
                    continue
        finally:
            await sub.unsubscribe()
        assert [e.id for e in got] == [f"{live}-{i}" for i in range(3)], proc.output()[-3000:]
        for e, (snap, dec) in zip(got, steps):
            d, why = decode_decision(e)
            assert why == "" and d is not None, e.state.get("missing")
            assert d.pod.key == dec.pod_key and NODES[d.candidates[d.choice]].name == dec.node
            assert d.state.pods_used.tolist() == state_from_dict(snap.state).pods_used.tolist()  # what it saw
            if credit_budget == "0":
                assert e.credit == {"missing": "budget"} and d.credit is None
            else:  # its own credit
                assert e.credit["reference"] == "kube-default" and isinstance(e.credit["total"], float)
                assert d.credit == e.credit["total"]
        samples, counts = experience_samples(got, quantile=0.0)
        assert counts["used"] == 3 and len(samples) == 3
        labels = [NODES[int(s.graph.cand_node[s.action[0]])].name for s in samples]
        assert labels == ["small", "big", "gpu"]
        assert all(s.graph.n_nodes == len(NODES) and s.graph.n_pods == 1 for s in samples)
    finally:
        await bus.close()


def test_buffer_is_bounded_in_bytes_and_reads_only_the_tail(tmp_path):
    """A long-running trainer must not grow its file without bound nor read a huge file at start."""
    path = tmp_path / "experience.jsonl"
    big = {"cluster": {"blob": "x" * 2000}}
    exps = [m.Experience(id=f"e{i}", cluster="c", state=big, action={}, reward=0.5,
                         next_state={}, time=float(i)) for i in range(60)]
    size = max(len(e.model_dump_json()) + 1 for e in exps)
    buf = ExperienceBuffer(1000, path, max_bytes=10 * size)
    for e in exps:
        buf.add(e)
    assert len(buf) == 10 and list(buf.items)[0] == "e50" and buf.bytes <= 10 * size
    assert path.stat().st_size <= 2 * 10 * size + size  # rewritten when it holds twice the budget
    with path.open("a") as f:  # a crash left a torn line; a bigger budget on restart still reads the tail only
        f.write('{"id": "torn"')
    again = ExperienceBuffer(1000, path, max_bytes=10 * size)
    kept = list(again.items)  # the newest transitions that fit in the tail (the torn line takes some room)
    assert len(kept) >= 9 and kept == list(buf.items)[-len(kept):]
    assert path.stat().st_size == again.bytes <= 10 * size
