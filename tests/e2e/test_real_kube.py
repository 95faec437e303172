"""AGMARL-DKS against a REAL kube-apiserver and kube-scheduler (not the stand-in): 10 nodes, 60 pods, the hybrid
overlay's extender config and batch mode, the services started by `agmarl up --source kubernetes`. Every pod
bound, no node overcommitted, the decision log's node equal to the binding (also for an answer that fell back to
neutral scores), and kube-scheduler really called the extender.

The binaries: whatever ``.state/kube/bin`` holds (v1.36 from ``tools/kube/build.sh`` where the Go module proxy is
reachable), else v1.20.2 built here from Debian's source by ``tools/kube/build_debian.py`` (~6 minutes on 2 cores
the first time, then reused; docs/kube-real.md). etcd: Debian's ``etcd-server`` (``.ci/run`` installs it)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from agmarl_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1500


@pytest.fixture(scope="module")
def bench():
    mod = load_script(ROOT / "benchmarks" / "kube_real.py", "kube_real_e2e")
    try:
        mod.rig.find_binaries(mod.rig.DEFAULT_BIN)
    except mod.rig.RigError:
        done = subprocess.run([sys.executable, str(ROOT / "tools" / "kube" / "build_debian.py")],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        assert done.returncode == 0, f"tools/kube/build_debian.py failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    mod.rig.find_binaries(mod.rig.DEFAULT_BIN)  # RigError names what is missing (etcd: apt-get install etcd-server)
    return mod


def _args(bench) -> argparse.Namespace:
    return argparse.Namespace(nodes=10, pods=60, cpu="100m", memory="128Mi", node_cpu="32", node_memory="128Gi",
                              create_threads=4, timeout=180.0, ready_timeout=240.0, log_timeout=60.0,
                              bin_dir=str(bench.rig.DEFAULT_BIN), etcd=None)


@pytest.mark.parametrize("mode", ["hybrid", "batch"])
def test_every_pod_bound_none_overcommitted_log_names_the_binding(bench, mode, tmp_path):
    r = bench.run_mode(mode, _args(bench), tmp_path / mode)
    assert r["kube_version"], r  # which control plane this was (the build's KUBE_VERSION file)
    assert r["every_pod_bound"] and r["bound_api"] == 60, r
    assert r["overcommitted_nodes"] == [], r
    log = r["decision_log"]
    assert (log["matched"], log["wrong"], log["missing"]) == (60, 0, 0), r
    if mode == "hybrid":
        assert r["extender_calls"].get("prioritize", 0) > 0, r  # kube-scheduler really called the extender
    else:
        assert not r.get("extender_calls", {}).get("prioritize"), r
