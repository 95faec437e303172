"""``runtime.lifetime``: a child armed with ``die_with_parent`` (a Python child) or started with
``pdeathsig_preexec`` (a program it execs: nats-server under ``agmarl up``) ends when its parent is killed
outright (SIGKILL), so nothing the parent started keeps running or holds its port."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from agmarl_testing.processes import ProcessWatch, descendants

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

# the parent starts a child from a multiprocessing fork server (as the trainer starts a run); the child arms
# die_with_parent, the parent prints its pid, then waits to be killed
FORK_SERVER_CHILD = r"""
import multiprocessing, time
ctx = multiprocessing.get_context("forkserver")
ready = ctx.Event()
child = ctx.Process(target=exec, args=(
    "from agmarl_common.runtime.lifetime import die_with_parent; import time; "
    "die_with_parent(); ready.set(); time.sleep(60)", {"ready": ready}))
child.start()
assert ready.wait(60)
print(child.pid, "armed", flush=True)
time.sleep(60)
"""

# the parent starts a nats-server that ends with it (or not), prints the server's pid, then waits to be killed
NATS_CHILD = r"""
import sys, time
from agmarl_common.runtime.natsserver import NatsServer
ns = NatsServer(store_dir=sys.argv[2], die_with_parent=sys.argv[1] == "1").start()
print(ns.pid, "armed", flush=True)
time.sleep(60)
"""


def _kill_parent_and_watch(code: str, *args: str, tmp: str | None = None) -> tuple[list[int], int]:
    """Start ``code`` as the parent, SIGKILL it once it has printed its child's pid; returns the processes it
    had started (children and theirs) still running 10 s later, then killed, and the child's pid. ``tmp``: the
    parent's TMPDIR (where a killed fork server's parent leaves its ``pymp-*`` folder)."""
    env = {**os.environ, "TMPDIR": tmp} if tmp else None
    parent = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pid, state = parent.stdout.readline().split()
        started = descendants(parent.pid)
        assert state == "armed" and int(pid) in started, (state, started)
        with ProcessWatch(started) as watch:
            os.kill(parent.pid, signal.SIGKILL)
            parent.wait(timeout=10)
            left = watch.running(timeout=10)
            watch.kill(left)
        return left, int(pid)
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait(timeout=10)


def test_a_python_child_ends_when_its_parent_is_killed():
    left, _ = _kill_parent_and_watch(PYTHON_CHILD)
    assert not left, "the child outlived its killed parent"


def test_a_fork_server_and_its_armed_child_end_when_the_parent_that_started_them_is_killed(tmp_path_factory):
    # the child's parent is the fork server, which lived on while the child held its "alive" pipe: the
    # trainer's run (and its own server and workers) outlived a killed trainer under init. What the killed
    # parent leaves goes to a short pytest folder (not /tmp; short: the server's socket path must fit AF_UNIX)
    tmp = tmp_path_factory.mktemp("fs")
    left, child = _kill_parent_and_watch(FORK_SERVER_CHILD, tmp=str(tmp))
    assert not left, f"{left} (child {child}) outlived the killed parent"
    assert list(tmp.glob("pymp-*"))  # its socket folder, which the SIGKILL left


@pytest.mark.parametrize("armed", [True, False])
def test_nats_server_ends_with_its_parent_only_when_asked(armed, tmp_path):
    left, child = _kill_parent_and_watch(NATS_CHILD, "1" if armed else "0", str(tmp_path))
    # unarmed (tests, benchmarks): the server lives on in its own session until someone stops it
    assert (child not in left) is armed, f"nats-server {child} {'outlived' if armed else 'ended with'} its killed parent"
