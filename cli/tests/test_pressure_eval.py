"""`agmarl eval` runs a pressure variant with its simulator settings (shorter timeout, scripted node loss)."""

from agmarl_cli.evaluate import EvalSpec, run_job
from agmarl_common.core.sim import dynamic


def test_the_node_loss_variant_loses_and_recovers_its_nodes():
    spec = EvalSpec("dynamic", "synthetic:pressure_node_loss", nodes="synthetic:10", horizon_s=120.0)
    m = run_job(spec, "kube-default", 3)["metrics"]
    lost = len(dynamic.lost_nodes(10, 0.2, 3))
    assert lost == 2 and m["node_failures"] == lost and m["node_recoveries"] == lost  # at 40 s, back at 80 s
    assert m["evicted"] > 0 and m["hard_violations"] == 0


def test_other_workloads_run_with_the_default_simulator():
    m = run_job(EvalSpec("dynamic", "synthetic:burst", nodes="synthetic:6", horizon_s=60.0), "kube-default", 1)
    assert m["metrics"]["node_failures"] == 0
