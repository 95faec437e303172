"""``runtime.heap.settle``: what is alive then leaves the collector's reach; garbage made later is still
collected."""

import gc

from agmarl_common.runtime.heap import settle


class Node:
    def __init__(self):
        self.other = None


def test_settle_freezes_what_is_alive_and_later_cycles_are_still_collected():
    kept = [Node() for _ in range(1000)]
    try:
        settle()
        assert gc.get_freeze_count() >= len(kept)
        assert not any(gc.is_tracked(x) and x in gc.get_objects(generation=2) for x in kept[:3])
        a, b = Node(), Node()  # a reference cycle made after: a full collection still frees it
        a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2
    finally:
        gc.unfreeze()


async def test_background_work_runs_in_one_thread_at_the_process_priority():
    import os
    import threading

    from agmarl_common.runtime.heap import in_background

    def where() -> tuple[int, int]:
        return threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    first, second = await in_background(where), await in_background(where)
    assert first[0] == second[0] != threading.get_native_id()  # one worker, not the loop's thread
    # not lowered: a low-priority thread holding the GIL would stall the loop while it waits for a core
    assert first[1] == os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert await in_background(sum, [1, 2, 3]) == 6
