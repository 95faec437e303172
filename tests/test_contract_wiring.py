"""The subject catalogue (and so proto/subjects.yaml) says who consumes what; the services' code
registers handlers. This test fails when the two disagree."""

from __future__ import annotations

import ast
from pathlib import Path

from agmarl_common.runtime import messages, subjects

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("state-collector", "graph-builder", "inference", "reward-calculator", "adaptive-engine", "trainer")
# subject helper -> catalogue kind (helpers are named after their kind, wildcards aside)
HELPER_KIND = {"decision_wildcard": "decision", "pending": "pending_pod", "graph": "graph_update"}


def handled(service: str) -> set[tuple[str, str]]:
    """(subject kind, message KIND) for every rt.handle*(subjects.<fn>(...), m.<Class>, ...) in a service."""
    out = set()
    for path in (ROOT / "services" / service).rglob("*.py"):
        if "tests" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr.startswith("handle") and len(node.args) >= 2):
                continue
            # handle(subject, cls, ...) / handle_request(subject, cls, reply_cls) /
            # handle_stream(stream, subject, durable, cls): the first subjects.<fn>(...) call is the
            # subject, the first m.<Class> after it the message class
            subj = next((a for a in node.args if isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute)
                         and isinstance(a.func.value, ast.Name) and a.func.value.id == "subjects"), None)
            if subj is None:
                continue
            rest = node.args[node.args.index(subj) + 1:]
            cls = next((a for a in rest if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name)
                        and a.value.id == "m"), None)
            if cls is not None:
                kind = HELPER_KIND.get(subj.func.attr, subj.func.attr)
                out.add((kind, getattr(messages, cls.attr).KIND))
    return out


def read_back(service: str) -> set[str]:
    """Subject kinds a service reads back from their stream (``bus.read_back(subjects.<fn>(...), ...)`` or
    ``bus.follow_since(subjects.<fn>(...), ...)``): a consumer without a live handler (inference's catch-up)."""
    out = set()
    for path in (ROOT / "services" / service).rglob("*.py"):
        if "tests" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name not in ("read_back", "follow_since"):
                continue
            for a in node.args:
                if isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and \
                        isinstance(a.func.value, ast.Name) and a.func.value.id == "subjects":
                    out.add(HELPER_KIND.get(a.func.attr, a.func.attr))
    return out


def catalogue_consumers() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for entry in subjects.CATALOGUE:
        out.setdefault(entry.kind, set()).update(entry.consumers)
    return out


def test_every_handler_is_in_the_catalogue_with_its_message_kind():
    consumers = catalogue_consumers()
    for service in SERVICES:
        for subject_kind, message_kind in handled(service):
            assert subject_kind == message_kind, f"{service}: subject {subject_kind} decoded as {message_kind}"
            assert service in consumers.get(subject_kind, set()), \
                f"{service} consumes {subject_kind} but the catalogue does not say so"


def test_every_catalogued_service_consumer_has_a_handler():
    consumers = catalogue_consumers()
    for kind, names in consumers.items():
        for service in names & set(SERVICES):
            if kind == "health":
                continue
            assert kind in {k for k, _ in handled(service)} | read_back(service), \
                f"catalogue says {service} consumes {kind}; no handler and no read-back"
