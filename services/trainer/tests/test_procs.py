"""``procs.die_with_parent``: a child that armed it ends when its parent is killed outright (SIGKILL), so no
rollout worker outlives the trainer."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

# the parent starts a child that arms die_with_parent, prints the child's pid, then waits to be killed
PARENT = r"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c",
    "from agmarl_trainer.procs import die_with_parent; import sys, time; "
    "armed = die_with_parent(); print('armed' if armed else 'unarmed', flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE, text=True)
state = child.stdout.readline().strip()
print(child.pid, state, flush=True)
import time; time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (reaped later by init) counts as gone
        return f.read().split(") ", 1)[1][0] != "Z"


def test_a_child_ends_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        pid, state = parent.stdout.readline().split()
        child = int(pid)
        assert state == "armed"
        assert _alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived its killed parent"
    finally:
        for pid in (parent.pid, child):
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        parent.wait(timeout=10)
