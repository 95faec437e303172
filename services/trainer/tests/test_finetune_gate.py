"""The retrain's promotion gate: paired per held-out run, a margin on the mean gain, more runs won than lost,
and seeds that the fine-tune never used."""

import pytest

from agmarl_trainer.app import CONFIG_DIR
from agmarl_trainer.config import config_from_dict, load_config
from agmarl_trainer.finetune import check_held_out
from agmarl_trainer.promotion import GateRule, promotion_gate

SERVING = {"alloc_at_100": 90.0, "alloc_at_100_runs": [90.0, 90.0, 90.0, 90.0]}


def runs(*xs: float) -> dict:
    return {"alloc_at_100": sum(xs) / len(xs), "alloc_at_100_runs": list(xs), "hard_violations": 0}


def test_a_candidate_better_on_most_runs_by_the_margin_is_promoted_with_its_figures():
    verdict = promotion_gate(runs(91.0, 91.0, 92.0, 92.0), SERVING, GateRule(min_gain=1.0))
    assert verdict.promote and verdict.reason.startswith("better")
    assert verdict.figures == {"runs": 4, "gains": [1.0, 1.0, 2.0, 2.0], "mean_gain": 1.5, "se": 0.2887,
                               "ci95": [0.5814, 2.4186], "wins": 4, "losses": 0, "ties": 0}
    assert "95 % CI +0.581 .. +2.419" in verdict.reason


def test_a_gain_within_seed_noise_is_refused_although_the_mean_and_the_wins_pass():
    # +0.14 mean over 8 seeds, 5 won / 3 lost: what a fine-tune of the shipped model looked like
    noisy = {"alloc_at_100": 90.14, "alloc_at_100_runs": [90.6, 90.5, 89.7, 90.4, 89.8, 90.3, 90.05, 89.77],
             "hard_violations": 0}
    serving = {"alloc_at_100": 90.0, "alloc_at_100_runs": [90.0] * 8}
    verdict = promotion_gate(noisy, serving, GateRule(min_gain=0.05))
    assert not verdict.promote and "95 % interval of the gain not above 0" in verdict.reason
    low, high = verdict.figures["ci95"]
    assert low < 0 < high
    assert promotion_gate(noisy, serving, GateRule(min_gain=0.05, require_interval=False)).promote


@pytest.mark.parametrize("candidate,margin,why", [
    (runs(91.0, 91.0, 92.0, 92.0), 2.0, "gain <= 2"),  # better, but not by the margin
    (runs(98.0, 89.0, 89.0, 89.0), 1.0, "no more runs won than lost"),  # one lucky seed carries the mean
    (runs(90.0, 90.0, 90.0, 90.0), 0.0, "gain <= 0"),  # the serving model itself
    (runs(89.0, 90.0, 90.0, 90.0), 0.0, "gain <= 0"),
])
def test_a_candidate_that_is_not_better_by_the_margin_is_refused(candidate, margin, why):
    verdict = promotion_gate(candidate, SERVING, GateRule(min_gain=margin))
    assert not verdict.promote and verdict.reason.startswith("not better") and why in verdict.reason
    assert verdict.figures["runs"] == 4


def test_the_hard_violations_guard_comes_first():
    verdict = promotion_gate({**runs(99.0, 99.0, 99.0, 99.0), "hard_violations": 1}, SERVING)
    assert not verdict.promote and "hard_violations=1" in verdict.reason


def test_the_gate_seeds_must_be_held_out_from_the_fine_tune():
    base = {"eval": {"sub_seeds": [1000, 1001]}, "gate": {"seeds": [2000, 2001]}}
    check_held_out(config_from_dict(base))
    with pytest.raises(ValueError, match="1001"):
        check_held_out(config_from_dict({**base, "gate": {"seeds": [1001, 2000]}}))
    with pytest.raises(ValueError, match="2001"):
        check_held_out(config_from_dict(base), train_seeds=(7, 2001))
    with pytest.raises(ValueError, match="empty"):
        check_held_out(config_from_dict({**base, "gate": {"seeds": []}}))


@pytest.mark.parametrize("name", ["finetune.yaml", "finetune_smoke.yaml", "finetune_dryrun.yaml",
                                  "finetune_learns.yaml"])
def test_the_shipped_fine_tune_configs_hold_out_their_gate_seeds(name):
    cfg = load_config(CONFIG_DIR / name)
    check_held_out(cfg)
    assert len(cfg.gate.seeds) >= 2 and cfg.gate.min_gain > 0 and cfg.gate.require_interval
