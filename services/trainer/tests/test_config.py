"""Training configs: typed dataclasses from YAML; unknown keys and bad types are errors."""

from pathlib import Path

import pytest

from agmarl_trainer.config import TrainConfig, config_from_dict, config_to_dict, load_config

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["default", "smoke"])
def test_shipped_configs_load(name):
    cfg = load_config(ROOT / "configs" / "train" / f"{name}.yaml")
    assert isinstance(cfg, TrainConfig) and cfg.name == name
    assert cfg.sim.nodes_max <= 200  # trained on sub-clusters of at most 200 nodes
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_unknown_key_is_an_error():
    with pytest.raises(ValueError, match="unknown keys"):
        config_from_dict({"imitation": {"epochz": 3}})


def test_integer_fields_reject_fractions():
    with pytest.raises(ValueError):
        config_from_dict({"workers": 1.5})


def test_held_out_workloads_exist():
    cfg = load_config(ROOT / "configs" / "train" / "default.yaml")
    assert "default" in cfg.train_workloads and "gpushare60" not in cfg.train_workloads
