"""agmarl_common.core.features, batched: ``build_graph`` builds every pod's pair features at once (memo updates
of all pod shapes in one pass, per-node terms kept with the node rows). The values must be the ones the
shipped model was trained on, so each test compares with an oracle written as the features were first
defined, one pod at a time and without caches: ``placement_frag`` for the fragmentation after the
placement, the node's own fragmentation amount for the delta, and ``pair_features``' formulas.

A node's fragmentation is summed row by row in one fixed order (``sim.fragmentation.expectation``), so it does
not depend on the batch that computes it: every column, the devices and the candidate arrays must be equal, bit
for bit (with a BLAS matrix-vector product the fragmentation columns differed in their last bits).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agmarl_common.core.cluster.filters import feasible_nodes
from agmarl_common.core.cluster.model import GPU_MILLI, MAX_GPUS, ClusterState, Node, Pod, bind, choose_gpus, unbind_at
import agmarl_common.core.features as features_module
from agmarl_common.core.features import pairs as pairs_module
from agmarl_common.core.features import (CPU_SCALE, F_EDGE, FRAG_SCALE, GPU_SCALE, FeatureContext, ShapeMemo,
                                    build_graph, current_memos, identical_pods, pair_features, pair_features_batch,
                                    placement_frag, placement_frag_many, pod_edges, pod_feature_key, pod_features)
from agmarl_common.core.policies.rewardaware import RewardAwarePolicy
from agmarl_common.core.sim import traces
from agmarl_common.core.sim.fragmentation import pod_shape, state_frag, target_workload


def oracle_gain(pod: Pod, state: ClusterState, idx: np.ndarray, objective: str) -> np.ndarray:
    """The ``reward_gain`` column: reward-aware's scores rescaled to [-1, 0] (composite), 0 (allocation)."""
    if objective != "composite" or len(idx) == 0:
        return np.zeros(len(idx))
    s = RewardAwarePolicy().score(pod, state, idx)
    return (s - s.max()) / (s.max() - s.min()) if s.max() - s.min() > 1e-12 else np.zeros(len(idx))


def oracle_pairs(pod: Pod, state: ClusterState, cand: np.ndarray, target,
                 objective: str = "composite") -> tuple[np.ndarray, np.ndarray]:
    """``pair_features`` of one pod, from scratch (no memo, no cached node terms)."""
    idx = np.asarray(cand, np.int64)
    access = target.accessible(state.gpu_model)
    after, dev = placement_frag(pod_shape(pod), state, idx, access[idx], target)
    delta = after - state_frag(state, target, access)[idx]
    milli = pod.gpu_milli if pod.num_gpu > 0 else 0
    gpu_req = pod.num_gpu * milli
    cpu_cap = np.maximum(state.cpu_cap[idx], 1)
    cpu_free = state.cpu_cap[idx] - state.cpu_used[idx]
    cpu_after = cpu_free - pod.cpu_milli
    mem_after = state.mem_cap[idx] - state.mem_used[idx] - pod.memory_mib
    left = state.gpu_free()[idx]
    gcap = state.gpu_count[idx] * GPU_MILLI
    gpu_after = left.sum(axis=1) - gpu_req
    dev_left = np.where(dev >= 0, left[np.arange(len(idx)), np.maximum(dev, 0)] - milli, 0) / GPU_MILLI
    whole_after = (left >= GPU_MILLI).sum(axis=1) - (pod.num_gpu if milli >= GPU_MILLI else 0)
    cols = [
        cpu_after / cpu_cap, mem_after / np.maximum(state.mem_cap[idx], 1), gpu_after / GPU_SCALE,
        np.divide(gpu_after, gcap, out=np.zeros(len(idx)), where=gcap > 0),
        np.clip(delta / FRAG_SCALE, -8.0, 8.0), 1.0 / (1.0 + np.exp(delta / FRAG_SCALE)), after / GPU_SCALE,
        dev_left, np.where(state.gpu_count[idx] > 0, whole_after, 0) / MAX_GPUS,
        np.divide(pod.cpu_milli, cpu_free, out=np.zeros(len(idx)), where=cpu_free > 0),
        0.5 * cpu_after / CPU_SCALE + 0.5 * gpu_after / GPU_SCALE, (state.pods_used[idx] == 0).astype(np.float64),
        ((gcap > 0) & (gpu_after <= 0) & (gpu_req > 0)).astype(np.float64),
        np.divide(gpu_req, gcap, out=np.zeros(len(idx)), where=gcap > 0),
        oracle_gain(pod, state, idx, objective),
    ]
    return np.stack(cols, axis=1).astype(np.float32).reshape(len(idx), F_EDGE), dev


def assert_same_pairs(got_attr, got_dev, want_attr, want_dev) -> None:
    assert got_attr.dtype == np.float32 and got_attr.shape == want_attr.shape
    np.testing.assert_array_equal(got_dev, want_dev)
    np.testing.assert_array_equal(got_attr, want_attr)


def assert_graph_matches_oracle(pods, state, cands, context) -> None:
    g = build_graph(pods, state, cands, context)
    parts = [oracle_pairs(p, state, c, context.target, context.objective) for p, c in zip(pods, cands)]
    want_attr = np.concatenate([a for a, _ in parts]) if parts else np.zeros((0, F_EDGE), np.float32)
    want_dev = np.concatenate([d for _, d in parts]) if parts else np.zeros(0, np.int64)
    np.testing.assert_array_equal(g.cand_pod, np.repeat(np.arange(len(pods)), [len(c) for c in cands]))
    np.testing.assert_array_equal(g.cand_node, np.concatenate(cands) if cands else np.zeros(0, np.int64))
    assert_same_pairs(g.cand_attr, g.cand_device, want_attr, want_dev)


# ---------------------------------------------------------------------------------------------
# Random clusters

MODELS = ("", "T4", "V100", "A100")


def random_nodes(rng: np.random.Generator, n: int) -> tuple[Node, ...]:
    out = []
    for i in range(n):
        gpus = int(rng.choice([0, 1, 2, 4, 8]))
        out.append(Node(f"n{i}", int(rng.choice([8000, 32000, 64000, 96000])), int(rng.choice([16384, 65536, 262144])),
                        gpu_count=gpus, gpu_model=str(rng.choice(MODELS[1:])) if gpus else ""))
    return tuple(out)


def random_pod(rng: np.random.Generator, name: str) -> Pod:
    kind = int(rng.integers(6))
    cpu = int(rng.choice([0, 500, 1000, 4000, 8000, 16000]))
    mem = int(rng.choice([512, 4096, 16384, 65536]))
    spec = (str(rng.choice(MODELS[1:])),) if rng.random() < 0.2 else ()
    if kind <= 1:  # a share of one GPU
        return Pod(name, cpu, mem, num_gpu=1, gpu_milli=int(rng.choice([100, 250, 300, 500, 700, 900])), gpu_spec=spec)
    if kind == 2:  # whole GPUs
        return Pod(name, cpu, mem, num_gpu=int(rng.choice([1, 2, 4])), gpu_milli=GPU_MILLI, gpu_spec=spec)
    return Pod(name, cpu, mem)


def fill(rng: np.random.Generator, state: ClusterState, count: int, prefix: str) -> ClusterState:
    for k in range(count):
        pod = random_pod(rng, f"{prefix}-{k}")
        cand = feasible_nodes(pod, state)
        if cand.size:
            i = int(rng.choice(cand))
            gpus = choose_gpus(pod, state.gpu_free()[i])
            if gpus is not None:
                state = bind(state, pod, i, gpus)
    return state


def random_candidates(rng: np.random.Generator, pods, state) -> list[np.ndarray]:
    """Feasible nodes mostly; also an empty list, an arbitrary subset and an unsorted one with repeats."""
    out = []
    for k, p in enumerate(pods):
        c = feasible_nodes(p, state)
        if k % 7 == 3:
            c = np.zeros(0, np.int64)
        elif k % 7 == 5:
            c = rng.choice(state.n_nodes, size=min(state.n_nodes, 9), replace=False).astype(np.int64)
        elif k % 7 == 6:
            c = rng.integers(0, state.n_nodes, size=12).astype(np.int64)
        out.append(c)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_batched_features_equal_the_per_pod_definition_on_random_clusters(seed):
    rng = np.random.default_rng(seed)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 40)), 90, "fill")
    pods = [random_pod(rng, f"p{k}") for k in range(24)] + [random_pod(rng, "dup")] * 3  # repeated shapes
    context = FeatureContext(target_workload([random_pod(rng, f"t{k}") for k in range(200)]))
    assert_graph_matches_oracle(pods, state, random_candidates(rng, pods, state), context)


def test_warm_caches_follow_every_bind_and_unbind():
    """One context across changing states (the serving pattern): each graph still equals the oracle."""
    rng = np.random.default_rng(7)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 30)), 60, "fill")
    context = FeatureContext(target_workload([random_pod(rng, f"t{k}") for k in range(200)]))
    pods = [random_pod(rng, f"p{k}") for k in range(12)]
    states = []
    for step in range(6):
        cands = [feasible_nodes(p, state) for p in pods]
        assert_graph_matches_oracle(pods, state, cands, context)
        states.append(state)
        state = fill(rng, state, 3, f"s{step}")  # a few binds ...
        busy = np.flatnonzero(state.pods_used > 0)
        i = int(rng.choice(busy))
        state = unbind_at(state, i, state.bound[i][0].key)  # ... and a pod finishing
    for old in (states[2], states[0], states[0]):  # back to earlier states (and the same one twice)
        assert_graph_matches_oracle(pods, old, [feasible_nodes(p, old) for p in pods], context)


def test_pair_features_of_one_pod_equal_their_slice_of_the_batch():
    rng = np.random.default_rng(11)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 25)), 50, "fill")
    context = FeatureContext(target_workload([random_pod(rng, f"t{k}") for k in range(100)]))
    pods = [random_pod(rng, f"p{k}") for k in range(10)]
    cands = [feasible_nodes(p, state) for p in pods]
    attr, dev = pair_features_batch(pods, state, cands, context)
    start = 0
    for p, c in zip(pods, cands):
        a, d = pair_features(p, state, c, context)
        np.testing.assert_array_equal(attr[start:start + c.size], a)
        np.testing.assert_array_equal(dev[start:start + c.size], d)
        start += c.size
    assert start == attr.shape[0]


def test_one_pod_reads_the_same_rows_whatever_the_candidate_order():
    """One pod on ascending candidates takes the one-pod path (its memo read at the candidates); any other
    order goes through ``shape_jobs``: the same rows, bit for bit, in the candidates' order."""
    rng = np.random.default_rng(12)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 30)), 60, "fill")
    context = FeatureContext(target_workload([random_pod(rng, f"t{k}") for k in range(100)]))
    for k in range(8):
        pod = random_pod(rng, f"p{k}")
        cand = feasible_nodes(pod, state)
        if cand.size < 2:
            continue
        order = rng.permutation(cand.size)
        a, d = pair_features(pod, state, cand, context)
        a2, d2 = pair_features(pod, state, cand[order], context)
        assert a2.tobytes() == a[order].tobytes() and d2.tobytes() == d[order].tobytes()
        twice = np.concatenate([cand, cand[:1]])  # a repeated node: not strictly ascending either
        a3, _ = pair_features(pod, state, twice, context)
        assert a3.tobytes() == np.concatenate([a, a[:1]]).tobytes()


def test_one_pods_memoised_rows_follow_binds_and_read_its_own_memory():
    """The one-pod path keeps its pair rows per (pod shape, cpu) and node version: across binds and unbinds,
    and for pods of one shape with other memory or a zero cpu request (the shape counts it as 100m), its rows
    equal those the batch path computes afresh (candidates in another order), bit for bit."""
    rng = np.random.default_rng(21)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 30)), 60, "fill")
    context = FeatureContext(target_workload([random_pod(rng, f"t{k}") for k in range(100)]))
    base = [random_pod(rng, f"p{k}") for k in range(6)]
    pods = base + [replace(p, name=f"{p.name}-mem", memory_mib=p.memory_mib * 2 + 1) for p in base] \
        + [Pod("zero", 0, 1024), Pod("default", 100, 1024)]
    assert pod_shape(pods[-1]) == pod_shape(pods[-2])
    for step in range(5):
        for pod in pods:
            cand = feasible_nodes(pod, state)
            if cand.size < 2:
                continue
            order = rng.permutation(cand.size)
            a, d = pair_features(pod, state, cand, context)  # ascending: the memoised rows
            a2, d2 = pair_features(pod, state, cand[order], context)  # any other order: computed afresh
            assert a.tobytes() == a2[np.argsort(order)].tobytes() and d.tobytes() == d2[np.argsort(order)].tobytes()
        state = fill(rng, state, 4, f"s{step}")
        busy = np.flatnonzero(state.pods_used > 0)
        i = int(rng.choice(busy))
        state = unbind_at(state, i, state.bound[i][0].key)


def test_placement_frag_many_equals_placement_frag_shape_by_shape():
    """Bit for bit: each row's fragmentation is the same whichever batch computes it."""
    rng = np.random.default_rng(5)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 50)), 120, "fill")
    target = target_workload([random_pod(rng, f"t{k}") for k in range(200)])
    access = target.accessible(state.gpu_model)
    access_class = np.unique(access, axis=0, return_inverse=True)[1].reshape(-1)
    shapes = sorted({pod_shape(random_pod(rng, f"s{k}")) for k in range(40)})
    jobs = [(sh, np.sort(rng.choice(state.n_nodes, size=int(rng.integers(1, 50)), replace=False))) for sh in shapes]
    for (sh, rows), (after, dev) in zip(jobs, placement_frag_many(jobs, state, access, access_class, target)):
        want_after, want_dev = placement_frag(sh, state, rows, access[rows], target)
        assert dev.tobytes() == want_dev.tobytes() and after.tobytes() == want_after.tobytes()


def test_the_fragmentation_memo_keeps_every_shape_when_its_tables_grow(monkeypatch):
    """``ShapeMemo`` doubles its (S, n) tables when a new shape finds them full: the rows written before stay, and
    ``current_memos`` over jobs whose shapes make the tables grow (twice here) returns the views of the grown tables,
    each equal to ``placement_frag`` of its shape bit for bit, and a second call recomputes nothing."""
    rng = np.random.default_rng(7)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 30)), 60, "fill")
    target = target_workload([random_pod(rng, f"t{k}") for k in range(200)])
    access = target.accessible(state.gpu_model)
    access_class = np.unique(access, axis=0, return_inverse=True)[1].reshape(-1)
    shapes = sorted({pod_shape(random_pod(rng, f"s{k}")) for k in range(40)})[:7]
    assert len(shapes) == 7
    version, frag = np.ones(state.n_nodes, np.int64), np.zeros(state.n_nodes)
    memo = ShapeMemo(state.n_nodes, capacity=2)
    (first,) = current_memos(memo, [(shapes[0], None)], state, version, frag, access, access_class, target)
    kept = first[2].copy()
    entries = current_memos(memo, [(sh, None) for sh in shapes], state, version, frag, access, access_class, target)
    assert memo.ver.shape == (8, state.n_nodes)  # 2 -> 4 -> 8
    rows = np.arange(state.n_nodes)
    for sh, (ver, delta, after, dev) in zip(shapes, entries):
        want_after, want_dev = placement_frag(sh, state, rows, access, target)
        assert after.tobytes() == want_after.tobytes() and dev.tobytes() == want_dev.tobytes()
        assert (ver == 1).all() and delta.tobytes() == (want_after - frag).tobytes()
    assert entries[0][2].tobytes() == kept.tobytes()
    calls, real = [], pairs_module.placement_frag_flat
    monkeypatch.setattr(pairs_module, "placement_frag_flat", lambda *a, **k: calls.append(1) or real(*a, **k))
    current_memos(memo, [(sh, None) for sh in shapes], state, version, frag, access, access_class, target)
    assert calls == []


def test_a_full_fragmentation_memo_gives_the_least_recently_used_shape_row_to_a_new_one():
    """Past ``limit`` shapes a new shape takes the row of the shape used least recently (rows computed again give
    the same bits), never one handed out in the same call: a call with more shapes than the limit grows the tables."""
    rng = np.random.default_rng(8)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 25)), 50, "fill")
    target = target_workload([random_pod(rng, f"t{k}") for k in range(200)])
    access = target.accessible(state.gpu_model)
    access_class = np.unique(access, axis=0, return_inverse=True)[1].reshape(-1)
    a, b, c, d, e = sorted({pod_shape(random_pod(rng, f"s{k}")) for k in range(40)})[:5]
    version, frag, rows = np.ones(state.n_nodes, np.int64), np.zeros(state.n_nodes), np.arange(state.n_nodes)
    memo = ShapeMemo(state.n_nodes, capacity=4, limit=3)

    def current(*shapes):
        return current_memos(memo, [(sh, None) for sh in shapes], state, version, frag, access, access_class, target)

    for sh in (a, b, c, a):  # b is now the least recently used
        current(sh)
    current(d)
    assert set(memo.slots) == {a, c, d} and memo.ver.shape[0] == 4
    entries = current(a, b, c, d, e)  # five in one call: nothing of this call is taken, the tables grow
    assert set(memo.slots) == {a, b, c, d, e} and memo.ver.shape[0] == 8
    for sh, (_, _, after, dev) in zip((a, b, c, d, e), entries):
        want_after, want_dev = placement_frag(sh, state, rows, access, target)
        assert after.tobytes() == want_after.tobytes() and dev.tobytes() == want_dev.tobytes()


def test_a_context_that_meets_ever_new_pod_shapes_holds_a_bounded_memo_and_the_same_rows(monkeypatch):
    """A service meets new pod shapes for ever: with room for 2 shapes and 3 counted entries the context holds no
    more, keeps counting the entries whose rows it memoises, and gives the oracle's rows bit for bit."""
    monkeypatch.setattr(pairs_module, "MEMO_SHAPES", 2)
    monkeypatch.setattr(features_module, "USES_KEPT", 3)
    monkeypatch.setattr(features_module, "ROW_MEMOS", 2)
    rng = np.random.default_rng(9)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 20)), 30, "fill")
    target = target_workload([random_pod(rng, f"t{k}") for k in range(50)])
    context = FeatureContext(target)
    for k in range(12):
        pod = random_pod(rng, f"p{k}")
        cand = feasible_nodes(pod, state)
        assert_same_pairs(*pair_features(pod, state, cand, context), *oracle_pairs(pod, state, cand, target))
        assert len(context._pairs.slots) <= 2 and len(context._uses) <= 3 and set(context._rows) <= set(context._uses)
        context.warm(state)
        if k % 3 == 2:
            state = fill(rng, state, 2, f"more{k}")


def test_placement_frag_many_reads_kept_free_resources_and_single_rows_exactly():
    """``free`` (what ``FeatureContext`` keeps) gives the same bits as recomputing it, and a job of one row
    (no deduplication) the same as ``placement_frag`` of that row."""
    rng = np.random.default_rng(6)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 40)), 90, "fill")
    target = target_workload([random_pod(rng, f"t{k}") for k in range(200)])
    access = target.accessible(state.gpu_model)
    access_class = np.unique(access, axis=0, return_inverse=True)[1].reshape(-1)
    free = (state.cpu_cap - state.cpu_used, state.gpu_free())
    shapes = sorted({pod_shape(random_pod(rng, f"s{k}")) for k in range(30)})
    jobs = [(sh, np.sort(rng.choice(state.n_nodes, size=int(rng.integers(1, 30)), replace=False))) for sh in shapes]
    for got, want in zip(placement_frag_many(jobs, state, access, access_class, target, free),
                         placement_frag_many(jobs, state, access, access_class, target)):
        assert got[0].tobytes() == want[0].tobytes() and got[1].tobytes() == want[1].tobytes()
    for sh in shapes:
        row = np.array([int(rng.integers(state.n_nodes))])
        ((after, dev),) = placement_frag_many([(sh, row)], state, access, access_class, target, free)
        want_after, want_dev = placement_frag(sh, state, row, access[row], target)
        assert dev.tobytes() == want_dev.tobytes() and after.tobytes() == want_after.tobytes()


@pytest.mark.parametrize("share, left, expected", [
    (300, [1000, 1000, 1000, 1000], 0),  # all devices alike: the lowest index
    (300, [0, 200, 1000, 1000], 2),  # device 1 cannot take it
    (500, [0, 0, 0, 0], -1),  # none fits: no device
])
def test_a_share_goes_to_the_first_of_equal_devices(share, left, expected):
    nodes = (Node("g", 64000, 262144, gpu_count=4, gpu_model="T4"),)
    state = ClusterState.empty(nodes)
    state = replace(state, gpu_used=np.array([[GPU_MILLI - x for x in left] + [0] * (MAX_GPUS - 4)], np.int64))
    pod = Pod("s", 1000, 1024, num_gpu=1, gpu_milli=share)
    context = FeatureContext(target_workload([pod, Pod("w", 1000, 1024, num_gpu=1, gpu_milli=GPU_MILLI)]))
    g = build_graph([pod], state, [np.array([0])], context)
    assert int(g.cand_device[0]) == expected
    assert int(oracle_pairs(pod, state, np.array([0]), context.target)[1][0]) == expected


def test_out_of_range_candidate_names_its_pod():
    nodes = (Node("a", 8000, 16384),)
    pods = [Pod("ok", 100, 100), Pod("bad", 100, 100)]
    context = FeatureContext(target_workload(pods))
    with pytest.raises(ValueError, match="default/bad"):
        build_graph(pods, ClusterState.empty(nodes), [np.array([0]), np.array([0, 1])], context)


def test_pod_edges_without_groups_are_the_self_loops():
    pods = [Pod(f"p{k}", 100, 100) for k in range(4)] + [Pod("s1", 100, 100, service="web"),
                                                          Pod("s2", 100, 100, service="web")]
    np.testing.assert_array_equal(pod_edges(pods[:4]), np.stack([np.arange(4)] * 2))
    edges = pod_edges(pods)
    assert {(4, 5), (5, 4)} <= set(map(tuple, edges.T.tolist())) and edges.shape[1] == 8
    assert pod_edges([]).shape == (2, 0)


def test_pods_with_equal_feature_keys_get_equal_model_inputs():
    """Whatever else differs (name, labels, priority, service, a QoS class the features do not tell apart),
    equal keys mean equal pod rows and pair rows: scoring one of them scores them all."""
    rng = np.random.default_rng(13)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 20)), 40, "fill")
    context = FeatureContext(target_workload([random_pod(rng, f"t{k}") for k in range(100)]))
    base = [random_pod(rng, f"b{k}") for k in range(8)]
    pods = [replace(base[int(rng.integers(len(base)))], name=f"p{k}", namespace=str(rng.choice(["a", "b"])),
                    labels={"app": str(k % 3)}, priority=int(rng.integers(3)), service=str(rng.choice(["", "web"])),
                    qos=str(rng.choice(["", "BE", "Burstable"])), creation_time=float(k), duration=float(rng.random()))
            for k in range(40)]
    cand = np.arange(state.n_nodes)
    x = pod_features(pods, context)
    attr, _ = pair_features_batch(pods, state, [cand] * len(pods), context)
    attr = attr.reshape(len(pods), cand.size, F_EDGE)
    reps, group = identical_pods(pods, [cand] * len(pods))
    assert len(reps) == len({pod_feature_key(p) for p in pods}) < len(pods)
    for k, g in enumerate(group):
        r = reps[g]
        assert pod_feature_key(pods[k]) == pod_feature_key(pods[r])
        np.testing.assert_array_equal(x[k], x[r])
        np.testing.assert_array_equal(attr[k], attr[r])


@pytest.mark.parametrize("change", [
    {"cpu_milli": 1001}, {"memory_mib": 1025}, {"gpu_milli": 600}, {"num_gpu": 0}, {"gpu_spec": ("T4",)},
    {"qos": "LS"},
])
def test_a_pod_reading_differently_is_not_identical(change):
    pod = Pod("a", 1000, 1024, num_gpu=1, gpu_milli=500, qos="BE")
    other = replace(pod, name="b", **change)
    same = [np.arange(3), np.arange(3)]
    reps, group = identical_pods([pod, other], same)
    assert reps == [0, 1] and group.tolist() == [0, 1]
    assert identical_pods([pod, replace(pod, name="c")], same)[0] == [0]
    assert identical_pods([pod, replace(pod, name="c")], [np.arange(3), np.arange(2)])[0] == [0, 1]


# ---------------------------------------------------------------------------------------------
# openb: the real trace's nodes and pods


@pytest.fixture(scope="module")
def openb():
    nodes = traces.load_openb_nodes(traces.openb_node_path(traces.ALL_NODES))
    pods = traces.load_openb_pods(traces.openb_pod_path("default"))
    return nodes, pods


def test_batched_features_equal_the_per_pod_definition_on_openb(openb):
    nodes, workload = openb
    rng = np.random.default_rng(3)
    state = ClusterState.empty(nodes[::4])
    for k, j in enumerate(rng.integers(0, len(workload), size=700)):
        pod = replace(workload[j], name=f"fill-{k}")
        cand = feasible_nodes(pod, state)
        if cand.size:
            i = int(cand[int(rng.integers(cand.size))])
            gpus = choose_gpus(pod, state.gpu_free()[i])
            if gpus is not None:
                state = bind(state, pod, i, gpus)
    context = FeatureContext.from_workload(workload)
    for step in range(2):
        pods = [replace(workload[int(j)], name=f"b{step}-{k}") for k, j in enumerate(rng.integers(0, len(workload), 64))]
        cands = [feasible_nodes(p, state) for p in pods]
        assert sum(c.size for c in cands) > 1000
        assert_graph_matches_oracle(pods, state, cands, context)
        busy = np.flatnonzero(state.pods_used > 0)
        for i in rng.choice(busy, size=20, replace=False):
            state = unbind_at(state, int(i), state.bound[int(i)][0].key)


def test_warm_rows_are_the_rows_a_decision_computes_and_leave_it_none(monkeypatch):
    """``FeatureContext.warm`` (the live loop, between pods, after ``prepare``) brings the most scored (pod shape, cpu)
    entries up to the state: across binds and unbinds, a context warmed after every change gives the same pair
    rows, bit for bit, as one never warmed, and a pod of a warm entry then computes no fragmentation row at all;
    entries outside the warm set (or entering it) still come out right."""
    rng = np.random.default_rng(31)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 30)), 60, "fill")
    target = target_workload([random_pod(rng, f"t{k}") for k in range(100)])
    warm, cold = FeatureContext(target), FeatureContext(target)
    pods = [random_pod(rng, f"p{k}") for k in range(10)] + [Pod("zero", 0, 1024), Pod("default", 100, 1024)]
    computed = []
    many = pairs_module.placement_frag_many
    monkeypatch.setattr(pairs_module, "placement_frag_many",
                        lambda jobs, *a, **k: computed.append(sum(len(r) for _, r in jobs)) or many(jobs, *a, **k))
    checked, warm_set = 0, []
    for step in range(8):
        hot = pods[(3 * step + 5) % len(pods)]  # scored more often than the rest: it enters the warm set
        for k, pod in enumerate(pods + [hot] * (2 * step + 2)):
            cand = feasible_nodes(pod, state)
            if cand.size < 2:
                continue
            key = (pod_shape(pod), pod.cpu_milli)
            in_warm_set = key in warm_set
            computed.clear()
            a, d = pair_features(pod, state, cand, warm)
            if in_warm_set:
                assert computed == [], f"step {step}: a warm entry computed {computed} rows"
                checked += 1
            b, e = pair_features(pod, state, cand, cold)
            assert a.tobytes() == b.tobytes() and d.tobytes() == e.tobytes()
            if k % 3 == 0:  # a change between pods, then the loop's warm (with a small warm set: some left out)
                state = fill(rng, state, 1, f"s{step}-{k}")
                busy = np.flatnonzero(state.pods_used > 0)
                if k % 2 and busy.size:
                    i = int(rng.choice(busy))
                    state = unbind_at(state, i, state.bound[i][0].key)
                warm_set = warm.warm(state, keys=4)
    assert checked >= 20


def test_a_full_row_memo_drops_its_least_scored_entry_only(monkeypatch):
    """Past ``ROW_MEMOS`` (pod shape, cpu) entries, a new one takes the place of the entry scored least, not of all
    of them (openb:default has 81 such entries: clearing the memo made the common shapes recompute every row)."""
    monkeypatch.setattr(features_module, "ROW_MEMOS", 3)
    rng = np.random.default_rng(41)
    state = fill(rng, ClusterState.empty(random_nodes(rng, 20)), 30, "fill")
    context = FeatureContext(target_workload([random_pod(rng, f"t{k}") for k in range(50)]))
    pods = [Pod(f"c{k}", 1000 * (k + 1), 1024) for k in range(5)]  # five cpu pods: five entries
    key = [(pod_shape(p), p.cpu_milli) for p in pods]
    for p, times in zip(pods[:3], (3, 1, 2)):
        for _ in range(times):
            pair_features(p, state, feasible_nodes(p, state), context)
    assert list(context._rows) == key[:3]
    pair_features(pods[3], state, feasible_nodes(pods[3], state), context)
    assert list(context._rows) == [key[0], key[2], key[3]]  # c1 (scored once) made room
    a, _ = pair_features(pods[4], state, feasible_nodes(pods[4], state), context)  # c3 (once, first of equals)
    assert list(context._rows) == [key[0], key[2], key[4]]
    b, _ = pair_features(pods[4], state, feasible_nodes(pods[4], state)[::-1].copy(), context)
    assert a.tobytes() == b[::-1].tobytes()
