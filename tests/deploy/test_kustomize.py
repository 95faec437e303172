"""Kubernetes manifests: every overlay is built with `kubectl kustomize`, every rendered object is
validated against the Kubernetes API models (kubernetes client: pydantic, unknown fields rejected),
and the properties the deployment promises are asserted on the rendered output: least-privilege
RBAC, the scheduler extender configuration and its weight arithmetic, the rollout mode of each
overlay, NATS with JetStream fsync on every write (checked on a real nats-server)."""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes.client
import pytest
import yaml

from .test_compose import SERVICES, settings_fields

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
OVERLAYS = {"shadow": "shadow", "hybrid": "hybrid", "canary": "canary", "full": "full", "batch": "full"}
EXTENDER_OVERLAYS = ["shadow", "hybrid", "canary", "full"]
NAMESPACE = "agmarl"
# kube-scheduler: plugin scores are 0..MaxNodeScore, extender scores 0..MaxExtenderPriority and are
# multiplied by weight * MaxNodeScore / MaxExtenderPriority before being added.
MAX_NODE_SCORE, MAX_EXTENDER_PRIORITY = 100, 10
EXTENDER_KEYS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
                 "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"}
SCHEDULER_CONFIG_KEYS = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
                         "healthzBindAddress", "metricsBindAddress", "enableProfiling", "enableContentionProfiling",
                         "percentageOfNodesToScore", "podInitialBackoffSeconds", "podMaxBackoffSeconds",
                         "profiles", "extenders", "delayCacheUntilActive"}
NATS_BIN = ROOT / ".venv/bin/nats-server"


def kubectl() -> str:
    path = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if not path:
        pytest.fail("kubectl not found: install it (see docs/deploy.md, deploy/tools/install-kubectl.sh)")
    return path


@functools.lru_cache(maxsize=None)
def build(path: str) -> tuple[dict, ...]:
    proc = subprocess.run([kubectl(), "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def objects(overlay: str, kind: str | None = None) -> list[dict]:
    return [o for o in build(f"overlays/{overlay}") if kind is None or o["kind"] == kind]


def one(overlay: str, kind: str, name: str) -> dict:
    found = [o for o in objects(overlay, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{overlay}: {kind}/{name}: found {len(found)}"
    return found[0]


def configmap(overlay: str, name: str) -> dict:
    """The generated ConfigMap whose name is ``name`` plus kustomize's hash suffix."""
    found = [o for o in objects(overlay, "ConfigMap") if re.fullmatch(rf"{name}-[a-z0-9]{{10}}", o["metadata"]["name"])]
    assert len(found) == 1, f"{overlay}: ConfigMap {name}-<hash>: found {len(found)}"
    return found[0]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def workloads(overlay: str) -> list[dict]:
    return [o for o in objects(overlay) if o["kind"] in ("Deployment", "StatefulSet")]


def rules_of(overlay: str, kind: str, name: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples a Role/ClusterRole grants."""
    out = set()
    for rule in one(overlay, kind, name)["rules"]:
        assert not rule.get("resourceNames")
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def bound_roles(overlay: str, service_account: str) -> set[tuple[str, str]]:
    """(roleRef kind, roleRef name) bound to ServiceAccount agmarl/<service_account>."""
    out = set()
    for b in objects(overlay):
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for s in b.get("subjects", []):
                if s["kind"] == "ServiceAccount" and s["name"] == service_account and s.get("namespace") == NAMESPACE:
                    out.add((b["roleRef"]["kind"], b["roleRef"]["name"]))
    return out


def scheduler_config(overlay: str) -> dict:
    """The KubeSchedulerConfiguration the agmarl-scheduler Deployment reads (--config)."""
    dep = one(overlay, "Deployment", "agmarl-scheduler")
    container = pod_spec(dep)["containers"][0]
    (config_path,) = [a.split("=", 1)[1] for a in container["command"] if a.startswith("--config=")]
    mount = next(m for m in container["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod_spec(dep)["volumes"] if v["name"] == mount["name"])
    cm = one(overlay, "ConfigMap", volume["configMap"]["name"])
    return yaml.safe_load(cm["data"][config_path[len(mount["mountPath"]) + 1:]])


def parse_duration(text: str) -> float:
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"bad duration {text!r}"
    return sum(float(n) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[u] for n, u in parts)


# --- build and schema -------------------------------------------------------------------------

def test_kubectl_has_kustomize():
    out = subprocess.run([kubectl(), "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    assert "Kustomize Version: v5" in out, out


@pytest.mark.parametrize("path", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
def test_builds_and_matches_kubernetes_schema(path: str):
    docs = build(path)
    assert len(docs) >= 30
    for obj in docs:
        group_version = obj["apiVersion"].split("/")[-1]
        assert group_version == "v1", f"{obj['kind']}/{obj['metadata']['name']}: {obj['apiVersion']}"
        model = getattr(kubernetes.client, f"V1{obj['kind']}")
        model.model_validate(obj)  # pydantic: unknown fields, missing required fields, wrong types fail
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in docs]
    assert len(set(names)) == len(names), "duplicate objects"


def test_schema_check_rejects_bad_objects():
    dep = one("hybrid", "Deployment", "inference")
    for mutate in (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(livenesProbe={}),
                   lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name"),
                   lambda d: d["spec"].update(replicas="1")):
        bad = json.loads(json.dumps(dep))
        mutate(bad)
        with pytest.raises(Exception):
            kubernetes.client.V1Deployment.model_validate(bad)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_everything_lives_in_the_agmarl_namespace(overlay: str):
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    for obj in objects(overlay):
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert ns is None, obj["metadata"]["name"]
        elif obj["kind"] == "RoleBinding" and ns == "kube-system":
            # the one exception, from "Configure Multiple Schedulers"
            assert obj["roleRef"]["name"] == "extension-apiserver-authentication-reader"
        else:
            assert ns == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']} in {ns}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_references_resolve(overlay: str):
    """ConfigMaps, ServiceAccounts and volumes named by pods exist; Services select pods and ports."""
    cms = {o["metadata"]["name"] for o in objects(overlay, "ConfigMap")}
    sas = {o["metadata"]["name"] for o in objects(overlay, "ServiceAccount")}
    for w in workloads(overlay):
        spec = pod_spec(w)
        assert spec.get("serviceAccountName", "default") in sas | {"default"}
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in w["spec"].get("volumeClaimTemplates", [])}
        for v in volumes.values():
            if "configMap" in v:
                assert v["configMap"]["name"] in cms, f"{w['metadata']['name']}: {v['configMap']['name']}"
        for c in spec["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes or m["name"] in claims, f"{w['metadata']['name']}: {m['name']}"
            for src in c.get("envFrom", []):
                assert src["configMapRef"]["name"] in cms
    for svc in objects(overlay, "Service"):
        selector = svc["spec"]["selector"]
        pods = [w for w in workloads(overlay)
                if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert pods, f"Service {svc['metadata']['name']} selects no pod"
        ports = {p["name"] for w in pods for c in pod_spec(w)["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {svc['metadata']['name']}: {port['targetPort']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_probes_resources_and_runs_unprivileged(overlay: str):
    for w in workloads(overlay):
        spec = pod_spec(w)
        assert spec["securityContext"]["runAsNonRoot"] is True, w["metadata"]["name"]
        for c in spec["containers"]:
            where = f"{w['metadata']['name']}/{c['name']}"
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe"):
                assert probe in c, f"{where}: no {probe}"
                port = c[probe]["httpGet"]["port"]
                assert port in ports or port in ports.values(), f"{where}: {probe} port {port}"
            requests = c["resources"]["requests"]
            assert requests.get("cpu") and requests.get("memory"), where
            assert c["resources"]["limits"].get("memory"), where
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], where
            assert not c["image"].endswith(":latest") and ":" in c["image"], where


def test_agmarl_services_are_deployed_with_metrics_for_prometheus():
    for overlay in OVERLAYS:
        for service in SERVICES:
            dep = one(overlay, "Deployment", service)
            container = pod_spec(dep)["containers"][0]
            assert container["image"] == f"agmarl/{service}:0.1.0"
            annotations = dep["spec"]["template"]["metadata"]["annotations"]
            assert annotations["prometheus.io/scrape"] == "true"
            assert int(annotations["prometheus.io/port"]) in [p["containerPort"] for p in container["ports"]]
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env["OTEL_SERVICE_NAME"] == service
    inference = pod_spec(one("hybrid", "Deployment", "inference"))["containers"][0]
    assert inference["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert inference["livenessProbe"]["httpGet"]["path"] == "/healthz"
    collector = pod_spec(one("hybrid", "Deployment", "state-collector"))["containers"][0]
    assert {"name": "AGMARL_SOURCE", "value": "kubernetes"} in collector["env"]


# --- RBAC ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_has_no_wildcards_or_admin_roles(overlay: str):
    for role in objects(overlay):
        if role["kind"] in ("Role", "ClusterRole"):
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs", "nonResourceURLs"):
                    assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: * in {field}"
        if role["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert role["roleRef"]["name"] not in ("cluster-admin", "admin", "edit"), role["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_collector_may_only_read_pods_and_nodes(overlay: str):
    assert rules_of(overlay, "ClusterRole", "agmarl-collector") == {
        ("", resource, verb) for resource in ("pods", "nodes") for verb in ("get", "list", "watch")}
    assert bound_roles(overlay, "agmarl-collector") == {("ClusterRole", "agmarl-collector")}
    assert pod_spec(one(overlay, "Deployment", "state-collector"))["serviceAccountName"] == "agmarl-collector"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_without_api_access_get_no_token(overlay: str):
    assert bound_roles(overlay, "agmarl-service") == set()
    for service in SERVICES:
        spec = pod_spec(one(overlay, "Deployment", service))
        if spec["serviceAccountName"] == "agmarl-service":
            assert spec["automountServiceAccountToken"] is False, service


def test_batch_binder_may_get_pods_and_create_bindings_only():
    assert rules_of("batch", "ClusterRole", "agmarl-binder") == {("", "pods", "get"), ("", "pods/binding", "create")}
    assert bound_roles("batch", "agmarl-binder") == {("ClusterRole", "agmarl-binder")}
    spec = pod_spec(one("batch", "Deployment", "inference"))
    assert spec["serviceAccountName"] == "agmarl-binder" and spec["automountServiceAccountToken"] is True
    for overlay in EXTENDER_OVERLAYS:  # the extender does not bind: no binder anywhere else
        assert not [o for o in objects(overlay) if "binder" in o["metadata"]["name"]]
        assert pod_spec(one(overlay, "Deployment", "inference"))["serviceAccountName"] == "agmarl-service"


@pytest.mark.parametrize("overlay", EXTENDER_OVERLAYS)
def test_second_scheduler_rbac_follows_the_multiple_schedulers_guide(overlay: str):
    assert bound_roles(overlay, "agmarl-scheduler") == {
        ("ClusterRole", "system:kube-scheduler"), ("ClusterRole", "system:volume-scheduler"),
        ("Role", "extension-apiserver-authentication-reader")}
    reader = [o for o in objects(overlay, "RoleBinding") if o["roleRef"]["name"] == "extension-apiserver-authentication-reader"]
    assert [r["metadata"]["namespace"] for r in reader] == ["kube-system"]
    dep = one(overlay, "Deployment", "agmarl-scheduler")
    assert pod_spec(dep)["serviceAccountName"] == "agmarl-scheduler"
    # leader election off (no Lease role granted): exactly one replica, never two at once
    assert scheduler_config(overlay)["leaderElection"]["leaderElect"] is False
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"


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
    assert ext["filterVerb"] == "filter" and ext["prioritizeVerb"] == "prioritize"
    assert "bindVerb" not in ext and "managedResources" not in ext
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
        assert data["AGMARL_BATCH_SCHEDULER_NAME"] == "agmarl-scheduler"
        assert not [w for w in workloads("batch") if "kube-scheduler" in json.dumps(pod_spec(w))]
    else:
        assert "AGMARL_BATCH_SCHEDULER_NAME" not in data


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
    assert container["args"] == ["--config", "/etc/nats/nats.conf"]
    conf = configmap("hybrid", "nats-config")["data"]["nats.conf"]
    assert re.search(r'^\s*store_dir:\s*"/data"', conf, re.M)
    assert re.search(r"jetstream\s*\{[^}]*^\s*sync_interval:\s*always\s*$", conf, re.M | re.S)


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
        assert varz["max_payload"] == 8 * 1024 * 1024
    finally:
        proc.terminate()
        proc.wait(timeout=10)
