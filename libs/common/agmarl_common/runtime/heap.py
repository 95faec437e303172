"""A long-running service's heap and Python's cyclic garbage collector.

A full (generation-2) collection scans every tracked object alive, on the event loop's thread. A service
that holds a large state (every module, a model, a 1,523-node cluster and its pods) pays tens of ms for each
one, and one comes whenever the objects that survived the young collections grow by a quarter of the old
ones: a stall in which messages queue. ``settle`` collects once, then moves every object alive into the
permanent generation (``gc.freeze``), which later collections do not scan, so they scan only what was made
since. Call it once the service holds its start-up state. Frozen objects are still freed by reference
counting; only reference cycles among them are never collected (a service keeps what it held at start-up).

``in_background`` runs a large piece of work (a snapshot of the whole cluster) in a thread of low OS priority,
so that on a machine with few cores it does not take one from a decision. The catch: while that thread holds
the GIL, the event loop waits for it, and on a saturated machine a nice-19 thread may wait long for a core, so
use it in services whose loop can wait (graph-builder, the collector's snapshots), not on a decision's path.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
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


BACKGROUND_NICE = 19  # the OS priority (Linux nice) of the background worker's thread


def _lower_priority() -> None:
    try:  # Linux: PRIO_PROCESS with a thread id sets that thread's nice only
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):  # elsewhere: the thread runs at the process's priority
        pass


_background: ThreadPoolExecutor | None = None


async def in_background(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in this process's background thread (nice 19: when it competes for a core with
    normal-priority threads it gets ~1/70 of their share), so that work which may take its time (a snapshot of
    the whole cluster: ~0.1 s of CPU) does not take a core from a decision. One thread: one piece at a time."""
    global _background
    if _background is None:
        _background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background",
                                         initializer=_lower_priority)
    return await asyncio.get_running_loop().run_in_executor(_background, fn, *args)
