"""Subject tokens from cluster data: NATS token rules (printable ASCII, no '.', '*', '>'), at most
``TOKEN_MAX`` characters, deterministic; a long value keeps a readable prefix and a hash suffix."""
import hashlib
import re

import pytest

from agmarl_common.runtime import subjects
from agmarl_common.runtime.subjects import TOKEN_MAX, token

VALID = re.compile(r"[!-~]+")  # one NATS token: printable ASCII, no whitespace


@pytest.mark.parametrize("value,expected", [
    ("team-a", "team-a"),
    ("kube-system", "kube-system"),
    ("a" * 63, "a" * 63),  # the longest Kubernetes namespace passes unchanged
    ("prod.eu", "prod_eu"),
    ("team a", "team_a"),
    ("a*b>c", "a_b_c"),
    ("tab\there\r\nnul\x00", "tab_here__nul_"),
    ("café", "caf_"),
    ("\ud800", "_"),  # a lone surrogate
    ("", "_"),
    ("*", "*"),  # wildcards themselves stay wildcards, for subscription patterns
    (">", ">"),
])
def test_token_table(value, expected):
    assert token(value) == expected


@pytest.mark.parametrize("value", ["n" * 64, "n" * 4100, "é" * 4100, "x." * 3000, "a" * 100 + "\ud800"])
def test_long_values_are_cut_with_a_hash_suffix(value):
    out = token(value)
    assert len(out) == TOKEN_MAX and VALID.fullmatch(out) and "." not in out
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    assert out.endswith("-" + digest)
    assert token(value) == out  # deterministic


def test_long_values_that_share_a_prefix_stay_apart():
    assert token("a" * 100 + "1") != token("a" * 100 + "2")
    assert token("a" * 100)[:50] == token("a" * 200)[:50]


def test_a_4100_character_namespace_makes_a_short_decision_subject():
    subject = subjects.decision("c" * 300, "n" * 4100)
    assert len(subject) <= len("agmarl.v1.decision..") + 2 * TOKEN_MAX
    assert subject.split(".")[:3] == ["agmarl", "v1", "decision"] and len(subject.split(".")) == 5


@pytest.mark.parametrize("namespace", ["*", ">"])
def test_a_namespace_is_never_a_wildcard(namespace):
    assert subjects.decision("c", namespace) == "agmarl.v1.decision.c._"


def test_every_subject_builder_makes_valid_tokens():
    nasty = "x" * 5000 + ". *>\t\n\x00é"
    for build in (subjects.pending, subjects.snapshot, subjects.event, subjects.graph, subjects.graph_sync,
                  subjects.reward, subjects.experience, subjects.dead_letter, subjects.health,
                  lambda v: subjects.decision(v, v)):
        subject = build(nasty)
        tokens = subject.split(".")
        assert all(VALID.fullmatch(t) and len(t) <= max(TOKEN_MAX, len("selection_refused")) for t in tokens), subject
