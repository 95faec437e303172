"""`agmarl up`'s cluster source: the simulator by default; a real cluster with one kubeconfig for every
service and the cluster name the deploy files use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from agmarl_cli.source import KUBE_CLUSTER, UpSource, source_env

ROOT = Path(__file__).resolve().parents[2]


def test_simulator_by_default(tmp_path):
    env, cluster = source_env(UpSource(), {"HOME": str(tmp_path)})
    assert (env, cluster) == ({"AGMARL_CLUSTER": "sim", "AGMARL_SOURCE": "simulator"}, "sim")


def test_kubernetes_uses_the_deploy_files_cluster_name(tmp_path):
    base = yaml.safe_load((ROOT / "deploy/k8s/base/kustomization.yaml").read_text())
    literals = dict(x.split("=", 1) for x in base["configMapGenerator"][0]["literals"])
    assert literals["AGMARL_CLUSTER"] == KUBE_CLUSTER
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("{}")
    env, cluster = source_env(UpSource("kubernetes", kubeconfig=str(kubeconfig), context="ctx",
                                       batch_scheduler="agmarl-batch-scheduler"), {"HOME": str(tmp_path)})
    assert cluster == KUBE_CLUSTER
    assert env == {"AGMARL_CLUSTER": KUBE_CLUSTER, "AGMARL_SOURCE": "kubernetes", "AGMARL_KUBECONFIG": str(kubeconfig),
                   "AGMARL_KUBE_CONTEXT": "ctx", "AGMARL_BATCH_SCHEDULER_NAME": "agmarl-batch-scheduler"}


def test_kubeconfig_from_the_environment_becomes_one_absolute_setting(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").write_text("{}")
    (tmp_path / "b").write_text("{}")
    # the shell's AGMARL_SOURCE / $KUBECONFIG (relative, a list) -> an absolute AGMARL_KUBECONFIG for all
    env, cluster = source_env(UpSource(), {"AGMARL_SOURCE": "kubernetes", "KUBECONFIG": f"a{os.pathsep}b"})
    assert env["AGMARL_KUBECONFIG"] == f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}" and cluster == KUBE_CLUSTER
    # ~/.kube/config when nothing else is set
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    env, _ = source_env(UpSource("kubernetes", cluster="prod"), {"HOME": str(tmp_path)})
    assert env["AGMARL_KUBECONFIG"] == str(tmp_path / ".kube" / "config") and env["AGMARL_CLUSTER"] == "prod"


@pytest.mark.parametrize("spec,message", [
    (UpSource("kubernetes"), "no kubeconfig"),
    (UpSource("kubernetes", kubeconfig="/no/such/file"), "not found"),
    (UpSource("kubernetes", kubeconfig="{kc}", batch_scheduler="agmarl-scheduler"), "kube-scheduler"),
    (UpSource("kubernetes", kubeconfig="{kc}", batch_scheduler="Bad.Name"), "DNS-1123"),
    (UpSource(cluster="a.b"), "DNS-1123"),
    (UpSource(batch_scheduler="agmarl-batch-scheduler"), "need --source kubernetes"),
])
def test_refused_with_the_reason(tmp_path, spec, message):
    kc = tmp_path / "kc"
    kc.write_text("{}")
    if spec.kubeconfig == "{kc}":
        spec = UpSource(spec.source, spec.cluster, str(kc), spec.context, spec.batch_scheduler)
    with pytest.raises(SystemExit, match=message):
        source_env(spec, {"HOME": str(tmp_path)})
