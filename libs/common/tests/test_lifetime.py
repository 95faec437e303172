"""``runtime.lifetime``: a child armed with ``die_with_parent`` (a Python child) or started with
``pdeathsig_preexec`` (a program it execs: nats-server under ``agmarl up``) ends when its parent is killed
outright (SIGKILL), so nothing the parent started keeps running or holds its port."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

# the parent starts a child that arms die_with_parent, prints the child's pid, then waits to be killed
PYTHON_CHILD = r"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c",
    "from agmarl_common.runtime.lifetime import die_with_parent; import sys, time; "
    "armed = die_with_parent(); print('armed' if armed else 'unarmed', flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE, text=True)
state = child.stdout.readline().strip()
print(child.pid, state, flush=True)
import time; time.sleep(60)
"""

# the parent starts a nats-server that ends with it (or not), prints the server's pid, then waits to be killed
NATS_CHILD = r"""
import sys, time
from agmarl_common.runtime.natsserver import NatsServer
ns = NatsServer(store_dir=sys.argv[2], die_with_parent=sys.argv[1] == "1").start()
print(ns.pid, "armed", flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (reaped later by init) counts as gone
        return f.read().split(") ", 1)[1][0] != "Z"


def _kill_parent_and_watch(code: str, *args: str) -> tuple[bool, int]:
    """Start ``code`` as the parent, SIGKILL it once it has printed its child's pid; returns whether the
    child ended within 10 s, and the child's pid."""
    parent = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        pid, state = parent.stdout.readline().split()
        child = int(pid)
        assert state == "armed" and _alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not _alive(child), child
    finally:
        for pid in (parent.pid, child):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        parent.wait(timeout=10)


def test_a_python_child_ends_when_its_parent_is_killed():
    ended, _ = _kill_parent_and_watch(PYTHON_CHILD)
    assert ended, "the child outlived its killed parent"


@pytest.mark.parametrize("armed", [True, False])
def test_nats_server_ends_with_its_parent_only_when_asked(armed, tmp_path):
    ended, child = _kill_parent_and_watch(NATS_CHILD, "1" if armed else "0", str(tmp_path))
    # unarmed (tests, benchmarks): the server lives on in its own session until someone stops it
    assert ended is armed, f"nats-server {child} {'outlived' if armed else 'ended with'} its killed parent"
