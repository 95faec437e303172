"""Guard verdicts, rollback targets and exploration scope/rate."""

import numpy as np
import pytest

from agmarl_common.core.adaptive.explore import MAX_EXPLORE_RATE, ExploreConfig, explore_choice, in_canary_scope
from agmarl_common.core.adaptive.guard import GuardConfig, decided_delta, guard_check
from agmarl_common.core.adaptive.history import decode_history, encode_history, push, rollback, rollback_index

CFG = GuardConfig(window=10, min_samples=5, min_reward=0.3, max_drop=0.25, min_success=0.8, min_decided=10)


@pytest.mark.parametrize("rewards,reference,bound,decided,ok,why", [
    ([0.8] * 10, None, 0, 0, True, ""),
    ([0.1] * 4, None, 0, 0, True, ""),                 # too few samples to judge
    ([0.1] * 5, None, 0, 0, False, "floor"),
    ([0.8] * 20 + [0.2] * 10, None, 0, 0, False, "floor"),  # only the last window counts
    ([0.5] * 10, 0.8, 0, 0, False, "dropped"),          # 0.5 < 0.8 * 0.75
    ([0.65] * 10, 0.8, 0, 0, True, ""),                 # 0.65 >= 0.6
    ([], None, 7, 10, False, "success"),                # 70 % bound
    ([], None, 7, 9, True, ""),                         # too few decided
    ([0.8] * 10, 0.8, 9, 10, True, ""),
])
def test_guard_check(rewards, reference, bound, decided, ok, why):
    v = guard_check(rewards, reference, bound, decided, CFG)
    assert v.ok is ok
    assert why in v.reason
    if not ok:
        assert v.evidence


def test_decided_delta():
    before = {"bound": 10, "bind_rejected": 1, "unschedulable": 0, "failed": 0}
    after = {"bound": 18, "bind_rejected": 2, "unschedulable": 1, "failed": 0}
    assert decided_delta(before, after) == (8, 10)


def sel(policy, mode="full", reason="x"):
    return {"policy": policy, "model_version": "", "mode": mode, "reason": reason, "time": 0.0, "previous": ""}


@pytest.mark.parametrize("policies,target,kept", [
    (["a", "b"], "a", 0),
    (["a", "b", "c"], "b", 1),
    (["a", "b", "b"], "a", 0),                # same choice twice: skip it
    (["a", ("x", "canary"), "b"], "a", 0),    # explorations are not rollback targets
    (["a"], "base", 0),
    ([], "base", 0),
])
def test_rollback_targets(policies, target, kept):
    hist = [sel(*p) if isinstance(p, tuple) else sel(p) for p in policies]
    chosen, new = rollback(hist, "base", "rollback: test", 5.0)
    assert chosen["policy"] == target and chosen["reason"] == "rollback: test" and chosen["time"] == 5.0
    assert new[-1] == chosen and len(new) == kept + 1


def test_consecutive_rollbacks_walk_back():
    hist = [sel("a"), sel("b"), sel("c")]
    first, hist = rollback(hist, "base", "r1", 1.0)
    second, hist = rollback(hist, "base", "r2", 2.0)
    assert (first["policy"], second["policy"]) == ("b", "a")
    assert rollback_index(hist) is None


def test_history_codec_and_push_bound():
    hist = []
    for k in range(7):
        hist = push(hist, sel(f"p{k}"), max_len=5)
    assert [e["policy"] for e in hist] == ["p2", "p3", "p4", "p5", "p6"]
    assert decode_history(encode_history(hist)) == hist
    assert decode_history(b"not json") == [] and decode_history(None) == []


def test_exploration_needs_canary_scope():
    assert ExploreConfig(rate=0.05).effective_rate == 0.0
    assert explore_choice(ExploreConfig(rate=0.05), "a", ["a", "b"], u=0.0, pick=0.0) is None
    cfg = ExploreConfig(rate=0.05, canary_namespaces=("team-a",))
    assert in_canary_scope("team-a", cfg) and not in_canary_scope("prod", cfg)
    assert explore_choice(cfg, "a", ["a", "b", "c"], u=0.01, pick=0.99) == "c"
    assert explore_choice(cfg, "a", ["a", "b", "c"], u=0.01, pick=0.0, blocked=["b"]) == "c"
    assert explore_choice(cfg, "a", ["a"], u=0.0, pick=0.0) is None


@pytest.mark.parametrize("rate", [0.02, 0.05, 0.5])
def test_exploration_rate_is_small_and_capped(rate):
    cfg = ExploreConfig(rate=rate, canary_namespaces=("c",))
    rng = np.random.default_rng(0)
    n = 20000
    explored = sum(explore_choice(cfg, "a", ["a", "b"], float(rng.random()), float(rng.random())) is not None
                   for _ in range(n))
    assert explored / n == pytest.approx(min(rate, MAX_EXPLORE_RATE), abs=0.006)
    assert explored / n <= MAX_EXPLORE_RATE + 0.006
