"""The lookahead reference: short rollouts on a copy of the simulator state change a greedy decision."""

import numpy as np

from agmarl_common.core.cluster.model import Node, Pod
from agmarl_common.core.policies.registry import get_policy
from agmarl_common.core.sim import dynamic
from agmarl_common.core.sim.lookahead import LookaheadConfig, LookaheadPolicy, rollout

CONFIG = dynamic.SimConfig(horizon_s=10.0)


def blocked_whole_gpu() -> dynamic.SimState:
    """Node y runs a pod on half of its one GPU; a 500-milli share (a) and a whole-GPU pod (b) wait.
    Balance sends a to the idle node x, which leaves no whole GPU for b; a on y leaves x to b."""
    nodes = [Node("x", 4000, 4000, gpu_count=1), Node("y", 4000, 4000, gpu_count=1)]
    pods = [Pod("old", 3000, 3000, num_gpu=1, gpu_milli=500, creation_time=0.0, duration=0.0),
            Pod("a", 100, 100, num_gpu=1, gpu_milli=500, creation_time=1.0, duration=0.0),
            Pod("b", 100, 100, num_gpu=1, gpu_milli=1000, creation_time=1.0, duration=0.0)]
    state, _ = dynamic.advance(dynamic.reset(nodes, pods, CONFIG, seed=0), 0.0, CONFIG)
    state, ok = dynamic.bind(state, "default/old", "y", (0,))
    assert ok.ok
    state, _ = dynamic.advance(state, 1.0, CONFIG)
    assert list(state.pending) == ["default/a", "default/b"]
    return state


def placed(state: dynamic.SimState) -> dict[str, str]:
    return {k: state.cluster.nodes[r.node_index].name for k, r in state.running.items()}


def test_greedy_reward_aware_blocks_the_whole_gpu_pod():
    state = dynamic.schedule_pending(get_policy("reward-aware"), blocked_whole_gpu(), CONFIG, {})
    assert placed(state) == {"default/old": "y", "default/a": "x"} and "default/b" in state.pending


def test_lookahead_tries_both_nodes_and_places_both_pods():
    state = dynamic.schedule_pending(get_policy("lookahead"), blocked_whole_gpu(), CONFIG, {})
    assert placed(state) == {"default/old": "y", "default/a": "y", "default/b": "x"} and not state.pending


def test_rollouts_are_scored_by_the_window_reward_and_leave_the_state_alone():
    state = blocked_whole_gpu()
    pod = state.pending["default/a"].pod
    look, base = LookaheadConfig(horizon_ticks=2), get_policy("reward-aware")
    on_x = rollout(state, CONFIG, pod, 0, (0,), base, look)
    on_y = rollout(state, CONFIG, pod, 1, (0,), base, look)
    assert on_y > on_x and on_y == rollout(state, CONFIG, pod, 1, (0,), base, look)  # paired, deterministic
    assert list(state.pending) == ["default/a", "default/b"] and len(state.running) == 1  # frozen state


def test_without_a_simulator_state_it_scores_as_its_base_policy():
    state = blocked_whole_gpu()
    pod, c = state.pending["default/a"].pod, np.array([0, 1])
    look, base = LookaheadPolicy(), get_policy("reward-aware")
    assert np.array_equal(look.score(pod, state.cluster, c), base.score(pod, state.cluster, c))
    look.observe_sim(state, CONFIG)
    assert int(np.argmax(look.score(pod, state.cluster, c))) == 1



def two_cpu_nodes() -> dynamic.SimState:
    """y runs a 2000-milli pod; a (1000) and c (1000) wait. With a on x, balance sends c to x and packing to y."""
    nodes = [Node("x", 4000, 4000), Node("y", 4000, 4000)]
    pods = [Pod("old", 2000, 2000, creation_time=0.0, duration=0.0),
            Pod("a", 1000, 1000, creation_time=1.0, duration=0.0), Pod("c", 1000, 1000, creation_time=1.0, duration=0.0)]
    state, _ = dynamic.advance(dynamic.reset(nodes, pods, CONFIG, seed=0), 0.0, CONFIG)
    state, ok = dynamic.bind(state, "default/old", "y")
    assert ok.ok
    state, _ = dynamic.advance(state, 1.0, CONFIG)
    return state


def test_with_several_rollout_policies_a_candidate_is_worth_its_best_rollout():
    state = two_cpu_nodes()
    pod, c = state.pending["default/a"].pod, np.array([0, 1])
    look = LookaheadConfig(top_k=2, horizon_ticks=2, base="most-allocated", rollout_bases=("reward-aware",))
    policy = LookaheadPolicy(look)
    policy.observe_sim(state, CONFIG)
    scores = policy.score(pod, state.cluster, c)
    per_base = {name: [rollout(state, CONFIG, pod, j, (), get_policy(name), look) for j in (0, 1)]
                for name in ("reward-aware", "most-allocated")}
    assert np.all(np.greater(per_base["reward-aware"], per_base["most-allocated"]))  # balance places c better
    assert np.allclose(scores, np.maximum(per_base["reward-aware"], per_base["most-allocated"]), atol=1e-6)


def test_the_stronger_references_are_registered_with_their_settings():
    wide, deep = get_policy("lookahead-wide"), get_policy("lookahead-deep")
    assert (wide.name, wide.config.top_k, wide.config.horizon_ticks) == ("lookahead-wide", 8, 2)
    assert (deep.name, deep.config.top_k, deep.config.horizon_ticks) == ("lookahead-deep", 3, 8)
