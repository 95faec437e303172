"""A long-running service's heap and Python's cyclic garbage collector.

A full (generation-2) collection scans every tracked object alive, on the event loop's thread. A service
that holds a large state (every module, a model, a 1,523-node cluster and its pods) pays tens of ms for each
one, and one comes whenever the objects that survived the young collections grow by a quarter of the old
ones: a stall in which messages queue. ``settle`` collects once, then moves every object alive into the
permanent generation (``gc.freeze``), which later collections do not scan, so they scan only what was made
since. Call it once the service holds its start-up state. Frozen objects are still freed by reference
counting; only reference cycles among them are never collected (a service keeps what it held at start-up).

``in_background`` runs a large piece of work (a snapshot of the whole cluster) in one worker thread, off the
event loop: the loop keeps its turns (the GIL changes hands every few ms) instead of stalling for the whole
piece. The thread keeps the process's OS priority: a lowered one (nice 19, tried) can hold the GIL while it
waits for a core, so on a saturated machine the loop waits with it (priority inversion; the suspected cause
of a health request that timed out after 2 s in one CI run).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def settle() -> float:
    """Collect the garbage start-up left, then freeze every object alive; returns the seconds it took."""
    began = time.perf_counter()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - began


_background: ThreadPoolExecutor | None = None


async def in_background(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in this process's background thread, so that work which may take its time (a snapshot of
    the whole cluster: ~0.1 s of CPU) does not hold the event loop. One thread: one piece at a time."""
    global _background
    if _background is None:
        _background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background")
    return await asyncio.get_running_loop().run_in_executor(_background, fn, *args)
