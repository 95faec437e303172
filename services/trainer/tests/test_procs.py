"""``procs.pool_worker``: rollout workers arm ``die_with_parent`` (tested in libs/common/tests/test_lifetime.py),
so none outlives the trainer. Only pool workers arm it: an in-process run (``workers`` 1) must not tie the
caller, e.g. ``agmarl train`` started in the background, to its shell."""
from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor

from agmarl_trainer.procs import pool_worker

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
