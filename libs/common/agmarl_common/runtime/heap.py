"""A long-running service's heap and Python's cyclic garbage collector.

A full (generation-2) collection scans every tracked object alive, on the event loop's thread. A service
that holds a large state (every module, a model, a 1,523-node cluster and its pods) pays tens of ms for each
one, and one comes whenever the objects that survived the young collections grow by a quarter of the old
ones: a stall in which messages queue. ``settle`` collects once, then moves every object alive into the
permanent generation (``gc.freeze``), which later collections do not scan, so they scan only what was made
since. Call it once the service holds its start-up state. Frozen objects are still freed by reference
counting; only reference cycles among them are never collected (a service keeps what it held at start-up).
"""

from __future__ import annotations

import gc
import time


def settle() -> float:
    """Collect the garbage start-up left, then freeze every object alive; returns the seconds it took."""
    began = time.perf_counter()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - began
