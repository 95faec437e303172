"""The selection history kept in KV ``agmarl_config/policy_history``: a JSON list of selections
(PolicySelection fields), oldest first, the last one being the active selection.

Rollback goes to the latest earlier entry that differs from the active one and was not an
exploration (mode canary), and truncates the history there, so consecutive rollbacks walk back;
with no such entry the target is the baseline.

Promotions (reason ``promoted: ...``, written when a published model supersedes the active model)
also move the gate's experts: ``follow`` points the experts that named the superseded model at the
new one, and a rollback of a promoted model points them back, so replaying the history after a
restart gives the same experts. A rollback truncates the history, promotions included, so its
history entry (not the published selection) carries ``superseded``, the promotion chain in effect
before it (new model -> the model it superseded); replay moves experts forward along that chain
before applying the rollback.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from agmarl_common.core.policies.registry import is_model

KEY_POLICY_HISTORY = "policy_history"
MAX_HISTORY = 50
PROMOTED = "promoted:"  # the reason prefix of a promotion
SUPERSEDED = "superseded"  # a rollback's history entry: the promotion chain before it

Entry = Mapping[str, Any]


def decode_history(raw: bytes | None) -> list[dict[str, Any]]:
    """KV bytes -> list of entries ([] when absent or unreadable)."""
    if not raw:
        return []
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return []
    return [dict(e) for e in data if isinstance(e, dict) and isinstance(e.get("policy"), str)] \
        if isinstance(data, list) else []


def encode_history(history: Sequence[Entry]) -> bytes:
    return json.dumps(list(history), sort_keys=True).encode("utf-8")


def same_choice(a: Entry, b: Entry) -> bool:
    return a.get("policy") == b.get("policy") and a.get("model_version", "") == b.get("model_version", "")


def push(history: Sequence[Entry], entry: Entry, max_len: int = MAX_HISTORY) -> list[dict[str, Any]]:
    return [dict(e) for e in history][-(max_len - 1):] + [dict(entry)]


def with_active(history: Sequence[Entry], active: Entry) -> list[dict[str, Any]]:
    """``history`` ending with the ``active`` selection. A writer puts the selection and then the
    history in two KV writes, so a reader between them sees the new selection with the old history:
    the selection is pushed then, or a rollback would start from the entry before it."""
    if history and same_choice(history[-1], active):
        return [dict(e) for e in history]
    return push(history, active)


def rollback_index(history: Sequence[Entry]) -> int | None:
    """Index of the entry a rollback returns to, or None."""
    if not history:
        return None
    current = history[-1]
    for i in range(len(history) - 2, -1, -1):
        e = history[i]
        if e.get("mode") != "canary" and not same_choice(e, current):
            return i
    return None


def rollback(history: Sequence[Entry], baseline: str, reason: str, now: float,
             default_mode: str = "full") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the selection to activate, the new history) for a rollback from the active entry."""
    current = dict(history[-1]) if history else {}
    i = rollback_index(history)
    if i is None:
        target: dict[str, Any] = {"policy": baseline, "model_version": "", "mode": default_mode}
        kept: list[dict[str, Any]] = []
    else:
        target, kept = dict(history[i]), [dict(e) for e in history[:i]]
    sel = {"policy": target["policy"], "model_version": target.get("model_version", ""),
           "mode": target.get("mode", default_mode) or default_mode, "reason": reason, "time": now,
           "previous": current.get("policy", "")}
    chain = promotion_chain(history)
    return sel, kept + [{**sel, SUPERSEDED: chain} if chain else sel]


def promotion_chain(history: Sequence[Entry]) -> dict[str, str]:
    """new model -> the model it superseded, for the promotions in effect after ``history``."""
    superseded: dict[str, str] = {}
    for entry in history:
        _, superseded = follow({}, superseded, entry)
    return superseded


def follow(experts: Mapping[str, str], superseded: Mapping[str, str], entry: Mapping[str, Any]
           ) -> tuple[dict[str, str], dict[str, str]]:
    """(experts, superseded) after the selection ``entry``: a promotion points the experts that named
    its ``previous`` model at the new one (and remembers new -> old); a rollback of a promoted model
    points them back at the model it superseded."""
    experts, superseded = dict(experts), dict(superseded)
    policy, previous = str(entry.get("policy", "")), str(entry.get("previous", ""))
    reason = str(entry.get("reason", ""))
    chain = entry.get(SUPERSEDED)
    if isinstance(chain, dict):  # a rollback's entry: the promotions it truncated, replayed forward
        superseded.update({str(k): str(v) for k, v in chain.items()})
        newer = {old: new for new, old in superseded.items()}
        for r, p in experts.items():
            seen = {p}
            while p in newer and newer[p] not in seen:
                p = newer[p]
                seen.add(p)
            experts[r] = p
    if reason.startswith(PROMOTED) and is_model(previous) and previous != policy:
        superseded[policy] = previous
        return {r: policy if p == previous else p for r, p in experts.items()}, superseded
    if reason.startswith("rollback") and previous in superseded:
        old = superseded.pop(previous)
        return {r: old if p == previous else p for r, p in experts.items()}, superseded
    return experts, superseded
