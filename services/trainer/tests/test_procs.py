"""``procs.die_with_parent``: a child that armed it ends when its parent is killed outright (SIGKILL), so no
rollout worker outlives the trainer. Only pool workers arm it (``procs.pool_worker``): an in-process run
(``workers`` 1) must not tie the caller, e.g. ``agmarl train`` started in the background, to its shell."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor

from agmarl_trainer.procs import pool_worker

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


PR_GET_PDEATHSIG = 2

def pdeathsig() -> int:
    sig = ctypes.c_int(0)
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0) == 0
    return sig.value


def noop() -> None:
    pass


def test_a_pool_worker_ends_with_its_parent():
    with ProcessPoolExecutor(max_workers=1, initializer=pool_worker, initargs=(noop,)) as pool:
        assert pool.submit(pdeathsig).result(timeout=60) == signal.SIGTERM


def test_in_process_initialisers_leave_the_caller_alone():
    # a fresh interpreter (pytest's own process must stay as it is): the three initialisers the trainer runs
    # in-process with workers 1, then the process's parent-death signal
    code = textwrap.dedent("""
        import ctypes
        from agmarl_trainer import evaluate, imitation, search
        from agmarl_trainer.model import NetConfig, PolicyNet
        cfg = NetConfig()
        imitation.init_worker(None, None)
        search.init_worker(PolicyNet(cfg).state_dict(), cfg)
        evaluate._init(None)
        sig = ctypes.c_int(-1)
        ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)
        print(sig.value)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "0"
