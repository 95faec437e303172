"""`agmarl bench extender` end to end (its own nats-server and inference service, real HTTP): 2,000 pods
on 100 nodes at full speed under kube-default scoring spread as the policy intends (issue 13, item 3:
the fullest node holds <= 25 pods), every logged decision names the node the pod was bound to (item 4),
and the extender's view ends equal to the bindings. Timing is reported, not asserted (a benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys

from agmarl_cli.extender_bench import pod_body, select_host

import numpy as np


def test_bench_extender_spreads_2000_pods_and_logs_every_binding(tmp_path):
    out = tmp_path / "ext.json"
    run = subprocess.run([sys.executable, "-m", "agmarl_cli.main", "bench", "extender", "--nodes", "100", "--pods",
                          "2000", "--warmup", "0", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["verbs"] == ["prioritize"] and report["pods"] == 2000 and report["policy"] == "kube-default"
    spread = report["spread"]
    assert spread["bound_pods"] == 2000 and sum(spread["pods_per_node"].values()) == 2000
    assert spread["max_pods_per_node"] <= 25, spread["pods_per_node"]
    assert spread["view_matches_bindings"] and spread["view_assumed"] == 0 and spread["view_held_decisions"] == 0
    log = report["decision_log"]
    assert log["logged"] == log["node_equals_binding"] == 2000 and log["missing"] == 0
    for key in ("p50", "p99", "mean"):
        assert report["added_ms"][key] > 0
    assert 0 < report["rate_fraction"] < 1 and "extender on 100 nodes" in run.stdout


def test_bench_extender_waits_kube_schedulers_own_time_between_pods(tmp_path):
    out = tmp_path / "gap.json"
    run = subprocess.run([sys.executable, "-m", "agmarl_cli.main", "bench", "extender", "--nodes", "10", "--pods",
                          "40", "--warmup", "0", "--gap-ms", "25", "--json", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["gap_ms"] == 25 and report["pods"] == 40 and report["decision_log"]["missing"] == 0
    # 39 gaps of 25 ms slept between the 40 pods: at most 40 / 0.975 s driven
    assert report["pods_per_s_driven"] <= 40 / (39 * 0.025)


def test_select_host_breaks_ties_among_the_top_scores_only():
    rng = np.random.default_rng(0)
    names = ["a", "b", "c", "d"]
    picks = {select_host(names, {"a": 10, "b": 3, "c": 10, "d": 10}, rng) for _ in range(200)}
    assert picks == {"a", "c", "d"}
    assert select_host(names, None, rng) in names


def test_pod_bodies_are_shaped_like_the_recorded_v1_36_requests():
    body = pod_body(7, "100m", "128Mi")
    assert set(body) == {"metadata", "spec", "status"} and body["status"]["phase"] == "Pending"
    assert body["metadata"]["uid"].endswith("000000000007") and body["spec"]["schedulerName"] == "agmarl-scheduler"
    assert body["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
