"""proto/ is generated from the code and must not drift from it."""
import json
import re
from pathlib import Path

import pytest
import yaml

from agmarl_common.runtime import subjects
from agmarl_common.runtime.messages import MESSAGES
from agmarl_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[3]


def _gen_proto():
    return load_script(ROOT / "tools" / "gen_proto.py", "gen_proto")


@pytest.mark.parametrize("name", ["messages.schema.json", "subjects.yaml", "permissions.md"])
def test_committed_proto_matches_code(name):
    expected = _gen_proto().render()[name]
    path = ROOT / "proto" / name
    assert path.exists(), f"proto/{name} is missing: run `python tools/gen_proto.py`"
    assert path.read_text(encoding="utf-8") == expected, \
        f"proto/{name} differs from the code: run `python tools/gen_proto.py` and commit the result"


def test_schema_covers_every_message_with_its_version():
    schema = json.loads((ROOT / "proto" / "messages.schema.json").read_text())
    assert sorted(schema["messages"]) == sorted(MESSAGES)
    for kind, entry in schema["messages"].items():
        assert entry["version"] == 1 and entry["schema"]["additionalProperties"] is False, kind
        assert "v" in entry["schema"]["properties"], kind


def _matches(pattern: str, subject: str) -> bool:
    regex = re.escape(pattern)
    for placeholder in ("cluster", "namespace", "service"):
        regex = regex.replace(re.escape("{" + placeholder + "}"), r"[^.]+")
    return re.fullmatch(regex, subject) is not None


@pytest.mark.parametrize("subject,kind", [
    (subjects.pending("c"), "pending_pod"), (subjects.snapshot("c"), "snapshot"), (subjects.event("c"), "event"),
    (subjects.graph("c"), "graph_update"), (subjects.graph_sync("c"), "graph_sync"),
    (subjects.decision("c", "ns"), "decision"), (subjects.reward("c"), "reward"),
    (subjects.experience("c"), "experience"), (subjects.policy_selection(), "policy_selection"),
    (subjects.train_request(), "train_request"), (subjects.train_status(), "train_status"),
    (subjects.model_published(), "model_published"), (subjects.dead_letter("s"), "dead_letter"),
    (subjects.health("s"), "health"), (subjects.health_all(), "health"),
    (subjects.selection_refused(), "selection_refused"),
])
def test_every_subject_function_is_in_the_catalogue(subject, kind):
    hits = [e for e in subjects.CATALOGUE if _matches(e.pattern, subject)]
    assert [e.kind for e in hits] == [kind]


def test_catalogue_refers_to_known_kinds_and_streams():
    streams = {s.name: s for s in (subjects.DECISIONS, subjects.EXPERIENCE, subjects.EVENTS)}
    for entry in subjects.CATALOGUE:
        assert entry.kind in MESSAGES
        if entry.stream is not None:
            concrete = entry.pattern.format(cluster="c", namespace="n", service="s")
            assert any(concrete.startswith(p.rstrip(">")) for p in streams[entry.stream].subjects)
    listed = yaml.safe_load((ROOT / "proto" / "subjects.yaml").read_text())
    assert listed["streams"]["DECISIONS"]["storage"] == "file"
    assert listed["kv"] == {"agmarl_config": {"keys": ["active_policy", "rollout"]}}
