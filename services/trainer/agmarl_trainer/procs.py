"""Child processes that end with their parent.

The trainer's run process and the rollout/evaluation workers of its process pools (``pool_worker``, their
initializer) call ``die_with_parent`` first: Linux then sends them SIGTERM when their parent ends, however it
ends (a SIGKILL from a supervisor included). Their parent is a fork server (the run's, the trainer's); it ends
with the process that started it, since ``die_with_parent`` also lets go of the server's "alive" pipe. So no
worker outlives the trainer and keeps a core busy. Elsewhere (no
``prctl``) it does nothing; the run's process group (``app._stop``) still covers an orderly stop.
``die_with_parent`` itself lives in ``agmarl_common.runtime.lifetime`` (nats-server under ``agmarl up`` uses it too).
"""
from __future__ import annotations

from agmarl_common.runtime.lifetime import die_with_parent


def pool_worker(init, *args) -> None:
    """A process pool's initializer: the worker ends with its parent, then ``init(*args)``. (``init`` itself
    must not arm that: run in-process, with ``workers`` 1, it would tie the caller, e.g. ``agmarl train`` in
    the background, to its own parent shell.)"""
    die_with_parent()
    init(*args)
