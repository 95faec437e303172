"""The inference service's ``objective`` setting: what learned models are asked to optimise."""

import pytest
from pydantic import ValidationError

from agmarl_common.settings import load_settings
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
