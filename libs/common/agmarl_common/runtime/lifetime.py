"""Child processes that end with their parent, however the parent ends (a SIGKILL included).

Linux's ``PR_SET_PDEATHSIG``: the kernel sends the child a signal when the thread that started it ends.
``die_with_parent`` arms it in the calling process (a Python child: the trainer's run and pool workers);
``pdeathsig_preexec`` gives a ``subprocess.Popen(preexec_fn=...)`` that arms it in a child before it execs
another program (nats-server under ``agmarl up``). Elsewhere (no ``prctl``) both do nothing.

A child of a ``multiprocessing`` fork server (the trainer's run, its pool workers) has the server for parent,
and the server stays up while any process holds the write end of its "alive" pipe, which every child it
forks inherits. So ``die_with_parent`` also closes that inherited end: otherwise a run kept its server alive
after the process that started the server was killed, and the server, its parent, kept the run alive (a
chain under init). With it, the server ends when the process that started it ends (the pipe reads EOF), and
the server's children get their signal in turn.
"""
from __future__ import annotations

import ctypes
import multiprocessing.forkserver
import os
import signal
import sys
from typing import Callable

PR_SET_PDEATHSIG = 1


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` is running (signal 0: exists; another user's process counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    gone (this process re-parented before the call) ends this one at once. In a fork server's child, the
    inherited end of the server's "alive" pipe is closed first (see the module docstring)."""
    parent = os.getppid()
    _release_fork_server()  # a fork server whose starter is gone ends now: prctl below must see that
    prctl = _prctl()
    if prctl is None or prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    now = os.getppid()
    if now == 1 or now != parent:  # the parent died before prctl (re-parented to init or a subreaper)
        os.kill(os.getpid(), sig)
    return True


def _release_fork_server() -> None:
    """Close the write end of the "alive" pipe of the fork server this process was forked from, if any (a
    process that started a fork server itself keeps its own: ``_forkserver_pid`` is set there)."""
    server = multiprocessing.forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and getattr(server, "_forkserver_pid", None) is None:
        server._forkserver_alive_fd = None
        os.close(fd)


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
