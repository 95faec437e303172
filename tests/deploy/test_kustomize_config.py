"""Kubernetes manifests, continued: the scheduler extender configuration and its weight arithmetic,
the rollout mode of each overlay, settings names and service URLs in the config maps, the Grafana
dashboards config map, and NATS with JetStream fsync on every write (checked on a real nats-server)."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from agmarl_common.runtime.natsauth import ensure_credentials
from agmarl_common.runtime.natsserver import DEFAULT_MAX_PAYLOAD

from agmarl_common.core.cluster.specs import AGMARL_BATCH_SCHEDULER, AGMARL_SCHEDULER
from agmarl_common.runtime.settings import load_settings
from agmarl_state_collector.settings import CollectorSettings

from .test_compose import SERVICES, settings_fields
from .kustomize import (
    MAX_EXTENDER_PRIORITY,
    MAX_NODE_SCORE,
    EXTENDER_KEYS,
    EXTENDER_OVERLAYS,
    NAMESPACE,
    NATS_BIN,
    OVERLAYS,
    ROOT,
    SCHEDULER_CONFIG_KEYS,
    configmap,
    objects,
    one,
    parse_duration,
    pod_spec,
    scheduler_config,
    workloads,
)


# --- scheduler configuration and rollout modes ------------------------------------------------------

@pytest.mark.parametrize("overlay", EXTENDER_OVERLAYS)
def test_scheduler_config_calls_the_inference_extender(overlay: str):
    config = scheduler_config(overlay)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) <= SCHEDULER_CONFIG_KEYS, set(config) - SCHEDULER_CONFIG_KEYS
    assert [p["schedulerName"] for p in config["profiles"]] == ["agmarl-scheduler"]
    assert config["percentageOfNodesToScore"] == 100
    (ext,) = config["extenders"]
    assert set(ext) <= EXTENDER_KEYS, set(ext) - EXTENDER_KEYS
    assert ext["prioritizeVerb"] == "prioritize" and "managedResources" not in ext  # verbs: test_scheduler_verbs
    assert ext["ignorable"] is True and ext["nodeCacheCapable"] is True
    assert 0 < parse_duration(ext["httpTimeout"]) <= 5
    assert isinstance(ext["weight"], int) and ext["weight"] > 0
    # urlPrefix -> the inference Service -> the container port the extender listens on
    url = urlsplit(ext["urlPrefix"])
    assert url.scheme == "http" and url.hostname == f"inference.{NAMESPACE}.svc"
    svc = one(overlay, "Service", "inference")
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == url.port]
    container = pod_spec(one(overlay, "Deployment", "inference"))["containers"][0]
    (listen,) = [p["containerPort"] for p in container["ports"] if p["name"] == port["targetPort"]]
    config_map = configmap(overlay, "agmarl-config")["data"]
    assert int(config_map["AGMARL_HTTP_PORT"]) == listen


def score_plugin_weights(config: dict) -> dict[str, int]:
    score = config["profiles"][0]["plugins"]["score"]
    assert score["disabled"] == [{"name": "*"}], "list every score plugin explicitly: the sum must be known"
    return {p["name"]: p["weight"] for p in score["enabled"]}


def model_share(config: dict) -> float:
    """Largest extender contribution / (that + largest sum of default plugin contributions)."""
    (ext,) = config["extenders"]
    extender = MAX_EXTENDER_PRIORITY * ext["weight"] * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
    plugins = MAX_NODE_SCORE * sum(score_plugin_weights(config).values())
    return extender / (extender + plugins)


def test_score_plugins_are_the_defaults_with_default_weights():
    defaults = {"TaintToleration": 3, "NodeAffinity": 2, "PodTopologySpread": 2, "InterPodAffinity": 2,
                "NodeResourcesFit": 1, "NodeResourcesBalancedAllocation": 1, "ImageLocality": 1}
    for overlay in EXTENDER_OVERLAYS:
        assert score_plugin_weights(scheduler_config(overlay)) == defaults


def test_hybrid_extender_weight_gives_the_promised_blend():
    config = scheduler_config("hybrid")
    weight = float(configmap("hybrid", "agmarl-config")["data"]["AGMARL_HYBRID_MODEL_WEIGHT"])
    assert weight == 0.7
    assert model_share(config) == pytest.approx(weight, abs=1e-9)
    assert config["extenders"][0]["weight"] == 28  # 10*28*10 = 2800 ; 100*12 = 1200 ; 2800/4000 = 0.7


@pytest.mark.parametrize("overlay", ["full", "canary"])
def test_model_decides_in_full_and_canary(overlay: str):
    """One model point (1 x weight x 10) outweighs the widest possible default-plugin difference."""
    config = scheduler_config(overlay)
    one_point = config["extenders"][0]["weight"] * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
    assert one_point > MAX_NODE_SCORE * sum(score_plugin_weights(config).values())


def test_shadow_extender_has_the_least_weight():
    assert scheduler_config("shadow")["extenders"][0]["weight"] == 1


@pytest.mark.parametrize("overlay,mode", OVERLAYS.items())
def test_overlay_sets_its_rollout_mode(overlay: str, mode: str):
    data = configmap(overlay, "agmarl-config")["data"]
    assert data["AGMARL_ROLLOUT_MODE"] == mode
    assert data["AGMARL_DEFAULT_MODE"] == mode  # the adaptive engine starts in the same mode
    assert mode in ("shadow", "recommend", "canary", "hybrid", "full")
    if overlay == "canary":
        assert data["AGMARL_CANARY_NAMESPACES"] and "=" in data["AGMARL_CANARY_LABEL_SELECTOR"]
    if overlay == "batch":
        assert data["AGMARL_BATCH_SCHEDULER_NAME"] == AGMARL_BATCH_SCHEDULER
        assert not [w for w in workloads("batch") if "kube-scheduler" in json.dumps(pod_spec(w))]
    else:
        assert "AGMARL_BATCH_SCHEDULER_NAME" not in data


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pod_has_one_decider(overlay: str):
    """kube-scheduler with the extender answers to agmarl-scheduler; the batch scheduler (inference places
    and binds, the state-collector announces its pods on the bus) to another name, and only in the batch
    overlay. Built from the overlay's own config map, the state-collector's settings agree."""
    data = configmap(overlay, "agmarl-config")["data"]
    collector = load_settings(CollectorSettings, environ=data)  # what the state-collector pod reads
    extender = overlay in EXTENDER_OVERLAYS
    profiles = [p["schedulerName"] for p in scheduler_config(overlay)["profiles"]] if extender else []
    if overlay == "batch":
        assert collector.batch_scheduler_name == AGMARL_BATCH_SCHEDULER != AGMARL_SCHEDULER
        assert not profiles
    else:
        assert profiles == [AGMARL_SCHEDULER]
        assert collector.batch_scheduler_name == ""  # nothing reaches the NATS loop: kube-scheduler decides
    assert collector.batch_scheduler_name not in profiles


def test_config_names_are_settings_fields():
    fields = settings_fields()
    every = set().union(*fields.values())
    for overlay in OVERLAYS:
        for key in configmap(overlay, "agmarl-config")["data"]:
            if key.startswith("AGMARL_"):
                assert key[len("AGMARL_"):].lower() in every, f"{overlay}: {key} matches no settings field"
        for service in SERVICES:
            for env in pod_spec(one(overlay, "Deployment", service))["containers"][0].get("env", []):
                if env["name"].startswith("AGMARL_"):
                    assert env["name"][len("AGMARL_"):].lower() in fields[service], (service, env["name"])


def test_urls_in_config_point_at_rendered_services():
    services = {(s["metadata"]["name"], p["port"]) for s in objects("hybrid", "Service") for p in s["spec"]["ports"]}
    data = configmap("hybrid", "agmarl-config")["data"]
    for key in ("NATS_URL", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        url = urlsplit(data[key])
        assert url.hostname == f"{url.hostname.split('.')[0]}.{NAMESPACE}.svc", data[key]
        assert (url.hostname.split(".")[0], url.port) in services, data[key]
    otel = yaml.safe_load(configmap("hybrid", "otel-collector-config")["data"]["otel-collector.yaml"])
    for exporter in otel["exporters"].values():
        host, port = exporter["endpoint"].split(":")
        assert (host, int(port)) in services, exporter
    grafana = yaml.safe_load(configmap("hybrid", "grafana-datasources")["data"]["datasources.yaml"])
    for ds in grafana["datasources"]:
        url = urlsplit(ds["url"])
        assert (url.hostname, url.port) in services, ds["url"]


def test_grafana_dashboards_configmap_holds_every_dashboard():
    files = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "deploy/grafana/dashboards").glob("*.json")}
    assert configmap("hybrid", "grafana-dashboards")["data"] == files
    grafana = pod_spec(one("hybrid", "Deployment", "grafana"))["containers"][0]
    mounts = {m["mountPath"] for m in grafana["volumeMounts"]}
    assert {"/var/lib/grafana/dashboards", "/etc/grafana/provisioning/dashboards",
            "/etc/grafana/provisioning/datasources"} <= mounts


# --- NATS -------------------------------------------------------------------------------------------

def test_nats_statefulset_keeps_jetstream_on_a_volume():
    sts = one("hybrid", "StatefulSet", "nats")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    container = pod_spec(sts)["containers"][0]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in container["volumeMounts"]
    assert container["args"][:2] == ["--config", "/etc/nats/nats-cluster.conf"]
    conf = configmap("hybrid", "nats-config")["data"]["nats.conf"]
    assert re.search(r'^\s*store_dir:\s*"/data"', conf, re.M)
    assert re.search(r"jetstream\s*\{[^}]*^\s*sync_interval:\s*always\s*$", conf, re.M | re.S)


def test_nats_is_a_three_server_cluster_and_the_streams_have_three_replicas():
    sts = one("hybrid", "StatefulSet", "nats")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["podManagementPolicy"] == "Parallel"
    args = pod_spec(sts)["containers"][0]["args"]
    flags = dict(zip(args[::2], args[1::2]))
    # the cluster is in the config (routes with their credentials: test_nats_security.py), no route on the command line
    assert flags == {"--config": "/etc/nats/nats-cluster.conf", "--server_name": "$(POD_NAME)"}
    conf = configmap("hybrid", "nats-config")["data"]["nats-cluster.conf"]
    assert re.search(r'^cluster\s*\{[^}]*^\s*listen:\s*"0\.0\.0\.0:6222"', conf, re.M | re.S)
    assert re.search(r'^\s*name:\s*agmarl\s*$', conf, re.M)
    headless = one("hybrid", "Service", "nats-headless")
    assert {p["port"] for p in headless["spec"]["ports"]} == {4222, 6222}
    routes = {p["metadata"]["name"]: p["spec"] for p in objects("hybrid", "NetworkPolicy")}["nats-routes"]
    (rule,) = routes["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6222}]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "nats"}}}]
    assert configmap("hybrid", "agmarl-config")["data"]["AGMARL_STREAM_REPLICAS"] == "3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nats_config_runs_jetstream_with_sync_always(tmp_path: Path):
    """The rendered nats.conf, on the real nats-server: valid, and JetStream fsyncs every write."""
    assert NATS_BIN.is_file(), NATS_BIN
    conf = configmap("hybrid", "nats-config")["data"]["nats.conf"]
    conf = re.sub(r'store_dir:\s*"/data"', f'store_dir: "{tmp_path}"', conf)
    path = tmp_path / "nats.conf"
    path.write_text(conf, encoding="utf-8")
    ensure_credentials(tmp_path / "creds")  # the auth.conf it includes, as `agmarl nats-creds` makes it
    (tmp_path / "auth.conf").write_bytes((tmp_path / "creds" / "auth.conf").read_bytes())
    check = subprocess.run([str(NATS_BIN), "-t", "-c", str(path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and "is valid" in check.stdout + check.stderr, check.stderr
    client, monitor = free_port(), free_port()
    proc = subprocess.Popen([str(NATS_BIN), "-c", str(path), "-a", "127.0.0.1", "-p", str(client),
                             "-m", str(monitor)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        varz, deadline = None, time.monotonic() + 10
        while varz is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/varz", timeout=1) as resp:
                    varz = json.load(resp)
            except OSError:
                time.sleep(0.1)
        assert varz is not None, "nats-server did not start"
        js = varz["jetstream"]["config"]
        assert js["sync_always"] is True
        assert js["store_dir"].startswith(str(tmp_path))
        assert varz["max_payload"] == DEFAULT_MAX_PAYLOAD  # the project's 1 MiB limit plus headers
    finally:
        proc.terminate()
        proc.wait(timeout=10)
