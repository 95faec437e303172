"""The services' code publishes and writes only what their generated NATS permissions allow (which the
subject catalogue decides): a publish the catalogue does not list would be refused by the server."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from agmarl_common.runtime import permissions, subjects
from agmarl_common.core.adaptive import history

ROOT = Path(__file__).resolve().parents[1]
PUBLISH_CALLS = {"publish", "js_publish", "request", "request_many"}
KV_WRITES = {"kv_put"}
KEY_NAMES = {"KEY_ACTIVE_POLICY": subjects.KEY_ACTIVE_POLICY, "KEY_ROLLOUT": subjects.KEY_ROLLOUT,
             "KEY_POLICY_HISTORY": history.KEY_POLICY_HISTORY}


def concrete(fn_name: str) -> str:
    """A subject the helper ``subjects.<fn_name>`` builds, with a sample value for every argument."""
    fn = getattr(subjects, fn_name)
    return fn(*["sample"] * len(inspect.signature(fn).parameters))


def calls(service: str):
    """(method, first argument node) of every bus call in the service's shipped code."""
    for path in (ROOT / "services" / service).rglob("*.py"):
        if "tests" in path.parts or path.name == "testing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                yield path.name, node.func.attr, node.args


def subject_of(arg: ast.AST) -> str | None:
    if (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and isinstance(arg.func.value, ast.Name)
            and arg.func.value.id == "subjects"):
        return concrete(arg.func.attr)
    return None


@pytest.mark.parametrize("service", permissions.services())
def test_every_publish_is_allowed_by_the_generated_permissions(service: str):
    perms = permissions.permissions_for(service)
    checked = 0
    for where, method, args in calls(service):
        if method in PUBLISH_CALLS:
            subject = subject_of(args[0])
            if subject is not None:
                checked += 1
                assert permissions.may_publish(perms, subject), f"{service} ({where}) publishes {subject}: " \
                    "not in its catalogue permissions (add it to the producer in agmarl_common/runtime/subjects.py)"
        if method in KV_WRITES and len(args) >= 2:
            key = args[1].attr if isinstance(args[1], ast.Attribute) else None
            if key in KEY_NAMES:
                subject = f"$KV.{subjects.CONFIG_BUCKET}.{KEY_NAMES[key]}"
                checked += 1
                assert permissions.may_publish(perms, subject), f"{service} ({where}) writes KV {KEY_NAMES[key]}"
        if method == "object_put":
            assert permissions.may_publish(perms, f"$O.{subjects.MODELS_BUCKET}.C.x"), f"{service} writes models"
    assert checked, f"found no publish in {service}: the scan is broken"


def test_matching_follows_nats_wildcards():
    assert permissions.matches("a.*.c", "a.b.c") and not permissions.matches("a.*.c", "a.b.d")
    assert permissions.matches("a.>", "a.b.c") and not permissions.matches("a.>", "a")
    assert not permissions.matches("a.*", "a.b.c")


def test_a_service_may_publish_only_what_it_produces():
    for entry in subjects.CATALOGUE:
        sample = entry.pattern.replace("{cluster}", "c").replace("{namespace}", "n")
        for service in permissions.services():
            perms = permissions.permissions_for(service)
            subject = sample.replace("{service}", service)
            produces = service in permissions.names(entry.producer) or entry.producer == "*"
            if entry.kind == "health":  # services answer health requests, they never send them
                assert not permissions.may_publish(perms, subject)
                continue
            assert permissions.may_publish(perms, subject) == produces, (service, entry.pattern)
            if entry.producer == "*":  # a dead letter is sent as oneself only
                other = next(s for s in permissions.services() if s != service)
                assert not permissions.may_publish(perms, sample.replace("{service}", other))


def test_no_identity_may_delete_or_purge_a_stream_or_a_consumer():
    for identity, perms in permissions.all_permissions().items():
        for stream in (subjects.DECISIONS.name, subjects.EXPERIENCE.name, f"KV_{subjects.CONFIG_BUCKET}"):
            for verb in ("STREAM.DELETE", "STREAM.PURGE", "STREAM.MSG.DELETE", "CONSUMER.DELETE"):
                assert not permissions.may_publish(perms, f"$JS.API.{verb}.{stream}.x"), (identity, verb, stream)
                assert not permissions.may_publish(perms, f"$JS.API.{verb}.{stream}"), (identity, verb, stream)
        assert not permissions.may_subscribe(perms, "_INBOX.other.x")  # nobody reads another's replies
        assert not permissions.may_subscribe(perms, ">")
