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
