"""A policy selected in mode "canary" (safe exploration) applies to opted-in pods only."""

import asyncio
import time

from agmarl_common.runtime import messages as m
from agmarl_common.core.cluster.model import Pod
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_inference.app import InferenceApp
from agmarl_inference.settings import InferenceSettings


def test_canary_selection_is_scoped_to_opted_in_namespaces_and_labels():
    settings = InferenceSettings(canary_namespaces=["team-a"], canary_label_selector="canary=yes")
    app = InferenceApp(ServiceRuntime("inference", settings), settings)
    app.select(m.PolicySelection(policy="most-allocated", mode="canary", reason="explore", time=time.time()))
    assert app.policy_for(Pod("p", 1, 1, namespace="team-a"))[0].name == "most-allocated"
    assert app.policy_for(Pod("p", 1, 1, namespace="team-b", labels={"canary": "yes"}))[0].name == "most-allocated"
    assert app.policy_for(Pod("p", 1, 1, namespace="team-b"))[0].name == "kube-resources"
    # a normal selection ends the canary and applies everywhere
    app.select(m.PolicySelection(policy="kube-default", mode="full", reason="promote", time=time.time()))
    assert app.policy_for(Pod("p", 1, 1, namespace="team-a"))[0].name == "kube-default"
    assert app.policy_for(Pod("p", 1, 1, namespace="team-b"))[0].name == "kube-default"


def test_a_capped_selection_serves_the_policy_with_its_admission():
    settings = InferenceSettings()
    app = InferenceApp(ServiceRuntime("inference", settings), settings)
    app.select(m.PolicySelection(policy="capped:kube-default", mode="full", reason="gate: batch", time=time.time()))
    policy = app.policy_for(Pod("p", 1, 1, qos="BE"))[0]
    assert policy.name == "capped:kube-default" and callable(policy.admit)


async def test_a_selection_that_wraps_a_model_serves_it_with_the_objective_the_services_serve():
    # cpu-first:model:default is a model selection: the model registry loads the model (with the services'
    # objective) and serves it inside the rule; the decisions name the wrapped model's version
    settings = InferenceSettings(objective="allocation")
    app = InferenceApp(ServiceRuntime("inference", settings), settings)
    installed = {"full": lambda: app.policy.name.startswith("cpu-first:model:"),
                 "canary": lambda: app.canary is not None}
    for mode, done in installed.items():
        app.select(m.PolicySelection(policy="cpu-first:model:default", mode=mode, reason="test", time=time.time()))
        deadline = time.monotonic() + 30  # bounded: loading the model takes a second or two
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    policy = app.policy_for(Pod("p", 1, 1))[0]
    assert policy.name.startswith("cpu-first:model:") and policy.policy.objective == "allocation"
    assert app.model_version == policy.policy.version != ""
    assert app.canary[0].name == policy.name and app.canary[0].policy.objective == "allocation"
