"""Child processes that end with their parent.

The trainer's run process and the rollout/evaluation workers of its process pools (``pool_worker``, their
initializer) call ``die_with_parent`` first: Linux then sends them SIGTERM when the process that started them ends, however it ends (a SIGKILL
from a supervisor included), so no worker outlives the trainer and keeps a core busy. Elsewhere (no
``prctl``) it does nothing; the run's process group (``app._stop``) still covers an orderly stop.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel for ``sig`` when the parent ends; True when it is armed. A parent that is already
    gone (this process re-parented before the call) ends this one at once."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() == 1:  # the parent died between fork and prctl
        os.kill(os.getpid(), sig)
    return True


def pool_worker(init, *args) -> None:
    """A process pool's initializer: the worker ends with its parent, then ``init(*args)``. (``init`` itself
    must not arm that: run in-process, with ``workers`` 1, it would tie the caller, e.g. ``agmarl train`` in
    the background, to its own parent shell.)"""
    die_with_parent()
    init(*args)
