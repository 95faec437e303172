"""The processes a test started, followed through ``/proc``: the tree under one of them, and waiting for
processes that are not the test's children to end (Linux pidfds: readable once the process has exited).
"""
from __future__ import annotations

import os
import select
import signal
import time


def _stat(pid: str) -> tuple[int, str] | None:
    """(parent pid, command line) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, ValueError, IndexError):
        return None
    return ppid, cmdline


def descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every process below ``root`` (children, their children, ...): pid -> (depth, command line), depth 1
    for a child."""
    procs = {int(p): st for p in os.listdir("/proc") if p.isdigit() and (st := _stat(p)) is not None}
    found: dict[int, tuple[int, str]] = {}
    level, depth = {root}, 0
    while level:
        depth += 1
        level = {pid for pid, (ppid, _) in procs.items() if ppid in level and pid not in found}
        found.update({pid: (depth, procs[pid][1]) for pid in level})
    return found


class ProcessWatch:
    """A pidfd on each of ``pids`` that is still there, opened now: a pid reused later is never mistaken for
    the process watched. Use as a context manager (closes the pidfds)."""

    def __init__(self, pids):
        self.fds: dict[int, int] = {}
        for pid in pids:
            try:
                self.fds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                pass

    def __enter__(self) -> "ProcessWatch":
        return self

    def __exit__(self, *exc) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def running(self, timeout: float = 0.0) -> list[int]:
        """Wait (at most ``timeout`` seconds) until every watched process has ended; the pids still running."""
        poller = select.poll()
        by_fd = {fd: pid for pid, fd in self.fds.items()}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        left, deadline = set(by_fd), time.monotonic() + timeout
        while left:
            ready = poller.poll(max(0.0, deadline - time.monotonic()) * 1000)
            if not ready:
                break
            for fd, _ in ready:
                poller.unregister(fd)
                left.discard(fd)
        return sorted(by_fd[fd] for fd in left)

    def kill(self, pids) -> None:
        """SIGKILL to the watched ``pids`` (through their pidfds: never to a process that took a pid over)."""
        for pid in pids:
            try:
                signal.pidfd_send_signal(self.fds[pid], signal.SIGKILL)
            except ProcessLookupError:
                pass
