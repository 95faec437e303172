"""One settings reference: docs/configuration.md is generated from the settings classes and current,
every AGMARL_* name means one thing in every service that reads it, closed choices are Literal types,
and every AGMARL_* name the docs and deploy files use is a setting."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from agmarl_common.core.features.pairs import OBJECTIVES
from agmarl_common.core.reward import SCHEMES
from agmarl_common.runtime.settings import CommonSettings, Objective, RolloutMode, Scheme, Source
from agmarl_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


GEN = load_script(ROOT / "tools" / "gen_config_docs.py", "gen_config_docs")


def test_configuration_doc_is_current():
    path = ROOT / "docs" / "configuration.md"
    assert path.exists(), "docs/configuration.md is missing: run `python tools/gen_config_docs.py`"
    assert path.read_text(encoding="utf-8") == GEN.render(), \
        "docs/configuration.md differs from the settings classes: run `python tools/gen_config_docs.py` and commit it"


def test_every_service_has_one_settings_class_and_the_reference_lists_each():
    variables, classes = GEN.collect()
    assert set(classes) == {"state-collector", "graph-builder", "inference", "reward-calculator", "adaptive-engine",
                            "trainer"}
    every = {v.name for v in variables.values() if len(v.readers) == len(classes)}
    assert {"AGMARL_NATS_URL", "AGMARL_CLUSTER", "AGMARL_METRICS_PORT", "AGMARL_LOG_LEVEL"} <= every
    # the names that once meant different things in different services now mean one thing each
    readers = {name: v.readers for name, v in variables.items()}
    assert readers["AGMARL_TICK_SECONDS"] == ["state-collector"]
    assert readers["AGMARL_ENGINE_TICK_SECONDS"] == ["adaptive-engine"]
    assert readers["AGMARL_EXPERIENCE_MAX_BYTES"] == ["reward-calculator"]
    assert readers["AGMARL_EXPERIENCE_BUFFER_BYTES"] == ["trainer"]
    assert readers["AGMARL_CANARY_NAMESPACES"] == ["inference"]
    assert readers["AGMARL_EXPLORE_NAMESPACES"] == ["adaptive-engine"]
    assert readers["AGMARL_BATCH_SCHEDULER_NAME"] == readers["AGMARL_KUBECONFIG"] == ["state-collector", "inference"]
    assert readers["AGMARL_SCHEME"] == ["inference", "reward-calculator", "trainer"]
    assert len(readers.get("AGMARL_QUEUE_GROUP", [])) <= 1


def test_a_name_with_two_meanings_is_refused():
    class A(CommonSettings):
        tick_seconds: float = 0.25

    class B(CommonSettings):
        tick_seconds: float = 0.5

    class C(CommonSettings):
        tick_seconds: float = 0.25

    variables: dict = {}
    GEN.merge(variables, "a", GEN.variables_of(A))
    GEN.merge(variables, "c", GEN.variables_of(C))  # declared alike: one meaning, two readers
    assert variables["AGMARL_TICK_SECONDS"].readers == ["a", "c"]
    with pytest.raises(ValueError, match="AGMARL_TICK_SECONDS means two things"):
        GEN.merge(variables, "b", GEN.variables_of(B))


def test_nested_fields_and_types_render():
    class Blend(BaseModel):
        weight: float = 0.7  # share of the model

    class S(CommonSettings):
        blend: Blend = Blend()
        mode: RolloutMode = "full"

    found = {v.name: v for v in GEN.variables_of(S)}
    assert found["AGMARL_BLEND__WEIGHT"].description == "share of the model"
    assert GEN.type_text(found["AGMARL_MODE"].annotation) == "`shadow` \\| `recommend` \\| `canary` \\| `hybrid` \\| `full`"
    assert GEN.type_text(found["AGMARL_TRACE_DIR"].annotation) == "str or none"


def test_closed_choices_are_literal_types_matching_the_code():
    assert typing.get_args(Scheme) == SCHEMES
    assert typing.get_args(Objective) == OBJECTIVES
    from agmarl_inference.extender import MODES  # noqa: PLC0415
    assert typing.get_args(RolloutMode) == MODES
    variables, _ = GEN.collect()
    closed = {"AGMARL_SOURCE": Source, "AGMARL_ROLLOUT_MODE": RolloutMode, "AGMARL_DEFAULT_MODE": RolloutMode,
              "AGMARL_SCHEME": Scheme, "AGMARL_OBJECTIVE": Objective}
    for name, literal in closed.items():
        assert variables[name].annotation == literal, name
    assert typing.get_origin(variables["AGMARL_LOG_LEVEL"].annotation) is typing.Literal


def test_closed_choices_refuse_other_values():
    from agmarl_reward_calculator.settings import RewardSettings  # noqa: PLC0415
    from agmarl_state_collector.settings import CollectorSettings  # noqa: PLC0415
    with pytest.raises(ValueError):
        CollectorSettings(source="kubernets")
    with pytest.raises(ValueError):
        RewardSettings(scheme="greedy")
    assert CommonSettings(log_level="debug").log_level == "DEBUG"


def read_from_the_environment() -> set[str]:
    """AGMARL_* names some code reads itself (os.environ / getenv), outside the settings classes."""
    names: set[str] = set()
    pattern = re.compile(r"(?:environ(?:\.get)?\(?\[?|getenv\()\s*[\"'](AGMARL_[A-Z0-9_]+)[\"']")
    for top in ("libs", "services", "cli", "tools", "tests", "benchmarks"):
        for path in (ROOT / top).rglob("*.py"):
            names |= set(pattern.findall(path.read_text(encoding="utf-8")))
    return names


def test_every_agmarl_name_in_docs_and_deploy_files_is_in_the_reference():
    """A name in the docs or deploy files is a setting (listed in the reference) or read by code directly:
    a renamed setting cannot linger in the docs."""
    reference = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(AGMARL_[A-Z0-9_]+)`", reference, flags=re.M)) | read_from_the_environment()
    files = [ROOT / "README.md", ROOT / "docker-compose.yml", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "deploy").rglob("*.yaml")), ROOT / "Dockerfile"]
    unknown = {}
    for path in files:
        names = set(re.findall(r"AGMARL_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8"))) - listed
        if names:
            unknown[path.relative_to(ROOT).as_posix()] = sorted(names)
    assert not unknown, f"AGMARL_* names that are no setting: {unknown}"
