"""`agmarl policy show | set | rollback`: the active policy selection in KV ``agmarl_config``.

``set`` and ``rollback`` write the selection (key ``active_policy``) and the history (key
``policy_history``) and publish the PolicySelection event, as the adaptive-engine does for its own
switches; the engine adopts the change and leaves it alone for its hold time. ``set`` accepts any name
the policy registry knows, and ``model:<version>`` for a version stored only in the Object Store
bucket ``agmarl_models`` (``<version>/manifest.json`` there; the inference service fetches it).
"""

from __future__ import annotations

import sys
import time

from agmarl_cli.supervisor import find_nats_auth, find_nats_url
from agmarl_common.runtime import messages as m
from agmarl_common.serving import modelstore
from agmarl_common.runtime import subjects
from agmarl_common.core.adaptive import history as hist
from agmarl_common.runtime.bus import Bus
from agmarl_common.core.policies.registry import get_policy, is_model, model_ref

MODES = ("shadow", "recommend", "canary", "hybrid", "full")
SHOW_HISTORY = 10


def format_selection(e: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(e.get("time", 0.0))))
    return (f"{when}  policy={e.get('policy')} version={e.get('model_version') or '-'} mode={e.get('mode')} "
            f"reason={e.get('reason', '')}")


def unknown_policy(name: str) -> str | None:
    """None when the registry knows ``name``, else the one-line error."""
    try:
        get_policy(name)
    except (KeyError, ValueError) as exc:
        return str(exc.args[0] if exc.args else exc)
    return None


def stored_version(name: str) -> str | None:
    """The version ``model:<version>`` (or ``cpu-first:model:<version>``) names when it is not on disk (then only
    the Object Store can have it)."""
    if not is_model(name):
        return None
    ref = model_ref(name)
    if ref in ("", "default", "latest") or "/" in ref or ref.startswith(".") or modelstore.local_dir(ref) is not None:
        return None
    return ref


async def _read(bus: Bus) -> tuple[m.PolicySelection | None, list[dict]]:
    raw = await bus.kv_get(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY)
    history = hist.decode_history(await bus.kv_get(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY))
    sel = m.decode(m.PolicySelection, raw) if raw else None
    if sel is not None:
        history = hist.with_active(history, sel.model_dump(exclude={"v"}))
    return sel, history


async def _write(bus: Bus, sel: m.PolicySelection, history: list[dict]) -> None:
    await bus.kv_put(subjects.CONFIG_BUCKET, subjects.KEY_ACTIVE_POLICY, m.encode(sel))
    await bus.kv_put(subjects.CONFIG_BUCKET, hist.KEY_POLICY_HISTORY, hist.encode_history(history))
    await bus.publish(subjects.policy_selection(), sel)
    await bus.flush()


async def policy_show(nats_url: str | None = None) -> int:
    bus = await Bus.connect(nats_url or find_nats_url(), name="agmarl-policy", auth=find_nats_auth())
    try:
        sel, history = await _read(bus)
        if sel is None:
            print("no active policy selected yet")
            return 1
        print(f"policy={sel.policy} version={sel.model_version or '-'} mode={sel.mode} reason={sel.reason}")
        print("history (oldest first):")
        for e in history[-SHOW_HISTORY:]:
            print("  " + format_selection(e))
        return 0
    finally:
        await bus.close()


async def policy_set(name: str, mode: str, reason: str, nats_url: str | None = None) -> int:
    version = stored_version(name)  # not on disk: look in the Object Store once connected
    error = None if version else unknown_policy(name)
    if error:
        print(f"agmarl: {error}", file=sys.stderr)
        return 2
    bus = await Bus.connect(nats_url or find_nats_url(), name="agmarl-policy",
                              auth=find_nats_auth(write=True))
    try:
        if version and not await modelstore.in_object_store(bus, version):
            print(f"agmarl: model {version!r} not found: no model folder on disk and no {version}/"
                  f"{modelstore.MANIFEST} in the Object Store bucket {subjects.MODELS_BUCKET}", file=sys.stderr)
            return 2
        current, history = await _read(bus)
        sel = m.PolicySelection(policy=name, mode=mode, reason=f"manual: {reason}", time=time.time(),
                                previous=current.policy if current else "")
        await _write(bus, sel, hist.push(history, sel.model_dump(exclude={"v"})))
        print(f"policy={sel.policy} mode={sel.mode} (was {sel.previous or '-'})")
        return 0
    finally:
        await bus.close()


async def policy_rollback(reason: str, nats_url: str | None = None) -> int:
    bus = await Bus.connect(nats_url or find_nats_url(), name="agmarl-policy",
                              auth=find_nats_auth(write=True))
    try:
        current, history = await _read(bus)
        if current is None or hist.rollback_index(history) is None:
            print("agmarl: nothing to roll back to (no earlier selection in the history)", file=sys.stderr)
            return 1
        target, new_history = hist.rollback(history, current.policy, f"rollback: manual: {reason}", time.time())
        sel = m.PolicySelection(**target)
        await _write(bus, sel, new_history)
        print(f"policy={sel.policy} mode={sel.mode} (rolled back from {current.policy})")
        return 0
    finally:
        await bus.close()
