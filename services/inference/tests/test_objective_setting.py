"""The inference service's ``objective`` setting: what learned models are asked to optimise."""

import pytest
from pydantic import ValidationError

from agmarl_common.runtime.settings import load_settings
from agmarl_inference.settings import InferenceSettings


def test_objective_defaults_to_composite_and_reads_the_environment(monkeypatch):
    monkeypatch.delenv("AGMARL_OBJECTIVE", raising=False)
    assert load_settings(InferenceSettings).objective == "composite"
    monkeypatch.setenv("AGMARL_OBJECTIVE", "allocation")
    assert load_settings(InferenceSettings).objective == "allocation"


def test_an_unknown_objective_is_refused_at_start(monkeypatch):
    monkeypatch.setenv("AGMARL_OBJECTIVE", "throughput")
    with pytest.raises(ValidationError, match="objective"):
        load_settings(InferenceSettings)


def test_scheme_follows_the_reward_calculators_variable(monkeypatch):
    monkeypatch.delenv("AGMARL_SCHEME", raising=False)
    assert load_settings(InferenceSettings).scheme == "fixed"
    monkeypatch.setenv("AGMARL_SCHEME", "load_conditional")
    assert load_settings(InferenceSettings).scheme == "load_conditional"
    monkeypatch.setenv("AGMARL_SCHEME", "greedy")
    with pytest.raises(ValidationError, match="scheme"):
        load_settings(InferenceSettings)
