"""Child processes that end with their parent, however the parent ends (a SIGKILL included).

Linux's ``PR_SET_PDEATHSIG``: the kernel sends the child a signal when the thread that started it ends.
``die_with_parent`` arms it in the calling process (a Python child: the trainer's run and pool workers);
``pdeathsig_preexec`` gives a ``subprocess.Popen(preexec_fn=...)`` that arms it in a child before it execs
another program (nats-server under ``agmarl up``). Elsewhere (no ``prctl``) both do nothing.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable

PR_SET_PDEATHSIG = 1


def _prctl():
    """libc's prctl, looked up in the parent (a forked child must not load libraries before it execs)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel for ``sig`` when the parent ends; True when it is armed. A parent that is already
    gone (this process re-parented before the call) ends this one at once."""
    prctl = _prctl()
    if prctl is None or prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() == 1:  # the parent died between fork and prctl
        os.kill(os.getpid(), sig)
    return True


def pdeathsig_preexec(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` arming ``sig`` for when the starting thread ends, or None where that cannot be done.
    Start the child from a thread that lives as long as the child should (the main thread)."""
    prctl = _prctl()
    if prctl is None:
        return None
    number = int(sig)

    def arm() -> None:  # runs in the forked child: no imports, no library loading
        prctl(PR_SET_PDEATHSIG, number, 0, 0, 0)

    return arm
