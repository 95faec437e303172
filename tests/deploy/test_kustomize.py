"""Kubernetes manifests: every overlay is built with `kubectl kustomize`, every rendered object is
validated against the Kubernetes API models (kubernetes client: pydantic, unknown fields rejected),
and the deployment's promises on the rendered output: one namespace, references that resolve, probes,
resources and unprivileged containers, metrics for Prometheus, least-privilege RBAC, the model signing key and
trusted public keys mounted where the services' settings read them (the scheduler configuration, rollout modes
and NATS: test_kustomize_config.py)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import kubernetes.client
import pytest

from agmarl_adaptive_engine.settings import AdaptiveSettings
from agmarl_common.runtime.settings import load_settings
from agmarl_common.serving import modelstore, signing
from agmarl_inference.settings import InferenceSettings
from agmarl_trainer.settings import TrainerSettings

from .test_compose import SERVICES
from .kustomize import (
    ROOT,
    configmap,
    EXTENDER_OVERLAYS,
    NAMESPACE,
    OVERLAYS,
    bound_roles,
    build,
    kubectl,
    objects,
    one,
    pod_spec,
    rules_of,
    scheduler_config,
    workloads,
)


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
    assert inference["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}  # the extender's
    collector = pod_spec(one("hybrid", "Deployment", "state-collector"))["containers"][0]
    assert {"name": "AGMARL_SOURCE", "value": "kubernetes"} in collector["env"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_liveness_and_readiness_reflect_nats_and_handlers(overlay: str):
    """Every service's liveness is the runtime's /healthz on its metrics port (NATS within its grace, event
    loop beating, no handler stuck: libs/common/agmarl_common/runtime/health.py); readiness is a /readyz."""
    for service in SERVICES:
        container = pod_spec(one(overlay, "Deployment", service))["containers"][0]
        live = container["livenessProbe"]
        assert live["httpGet"] == {"path": "/healthz", "port": "metrics"}, service
        assert live.get("timeoutSeconds", 1) >= 3, service  # a busy node answers late, not never
        assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}, service
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", service
        assert {"name": "metrics", "containerPort": 9100} in container["ports"], service


# --- model signing ------------------------------------------------------------------------------

MODEL_LOADERS = {"inference": InferenceSettings, "adaptive-engine": AdaptiveSettings, "trainer": TrainerSettings}
RELEASE_KEYS = "agmarl-release-model-keys"  # generated in base (hash suffix)
OPERATOR_KEYS = "agmarl-trusted-model-keys"  # the operator's, optional
SIGNING_SECRET = "agmarl-model-signing"


def mounted_volume(spec: dict, container: dict, path: str) -> tuple[dict, str]:
    """(the volume mounted at the directory holding ``path``, or at ``path`` itself; the mount's path)."""
    for mount in container.get("volumeMounts", []):
        if path == mount["mountPath"] or path.startswith(mount["mountPath"] + "/"):
            assert mount.get("readOnly") is True, mount
            (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
            return volume, mount["mountPath"]
    raise AssertionError(f"nothing is mounted at {path}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_model_loaders_trust_the_release_key_and_the_operator_s_keys(overlay: str):
    """inference, the adaptive-engine and the trainer read AGMARL_TRUSTED_MODEL_KEYS: a mounted directory of
    *.pub holding the shipped release key (a generated ConfigMap) and the operator's optional ConfigMap; the
    services that load no model get neither."""
    release = configmap(overlay, RELEASE_KEYS)["metadata"]["name"]
    for service in SERVICES:
        spec = pod_spec(one(overlay, "Deployment", service))
        container = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if service not in MODEL_LOADERS:
            assert "AGMARL_TRUSTED_MODEL_KEYS" not in env and "AGMARL_MODEL_SIGNING_KEY" not in env, service
            continue
        keys_dir = env["AGMARL_TRUSTED_MODEL_KEYS"]
        settings = load_settings(MODEL_LOADERS[service], environ={"AGMARL_TRUSTED_MODEL_KEYS": keys_dir})
        assert settings.trusted_model_keys == keys_dir, service  # the name the service's settings read
        volume, mount_path = mounted_volume(spec, container, keys_dir)
        assert mount_path == keys_dir, service  # the directory itself: every *.pub in it is trusted
        sources = volume["projected"]["sources"]
        (shipped,) = [s["configMap"] for s in sources if s["configMap"]["name"] == release]
        assert [item["path"].endswith(signing.PUBLIC_SUFFIX) for item in shipped["items"]] == [True], service
        (own,) = [s["configMap"] for s in sources if s["configMap"]["name"] == OPERATOR_KEYS]
        assert own.get("optional") is True and "items" not in own, service  # every key the operator adds
        assert "secret" not in str(sources), service  # public keys only


def test_the_mounted_release_key_is_the_shipped_one_and_verifies_the_shipped_model(tmp_path: Path):
    """The ConfigMap's key equals models/trusted (a rotation changes both); written as the projected volume
    writes it, it is what a service trusts, and models/default verifies against it (and against it alone)."""
    data = configmap("hybrid", RELEASE_KEYS)["data"]
    shipped = {p.name: p.read_text() for p in (ROOT / "models/trusted").glob(f"*{signing.PUBLIC_SUFFIX}")}
    assert data == shipped
    spec = pod_spec(one("hybrid", "Deployment", "inference"))
    volume, _ = mounted_volume(spec, spec["containers"][0], "/etc/agmarl/trusted-model-keys")
    for source in volume["projected"]["sources"]:
        for item in source["configMap"].get("items", []):
            (tmp_path / item["path"]).write_text(data[item["key"]])
    trust = modelstore.ModelTrust.load(str(tmp_path))
    assert set(trust.keys) == set(signing.load_public_keys([ROOT / "models/trusted"]))
    assert modelstore.load_dir(ROOT / "models/default", trust=trust).version


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_trainer_signs_with_a_key_from_a_secret(overlay: str):
    spec = pod_spec(one(overlay, "Deployment", "trainer"))
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    key_file = env["AGMARL_MODEL_SIGNING_KEY"]
    settings = load_settings(TrainerSettings, environ={"AGMARL_MODEL_SIGNING_KEY": key_file})
    assert settings.model_signing_key == key_file
    volume, mount_path = mounted_volume(spec, container, key_file)
    secret = volume["secret"]
    assert secret["secretName"] == SIGNING_SECRET and not secret.get("optional")  # no key, no trainer start
    assert secret["items"] == [{"key": "trainer.key", "path": str(Path(key_file).relative_to(mount_path))}]
    assert secret["defaultMode"] == 0o440 and spec["securityContext"]["fsGroup"]  # not world-readable
    for service in SERVICES:  # the private key is the trainer's alone
        if service != "trainer":
            assert SIGNING_SECRET not in json.dumps(pod_spec(one(overlay, "Deployment", service))), service
    assert not objects(overlay, "Secret"), "no Secret is rendered from the repository"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_trainer_writes_its_work_files_to_a_volume(overlay: str):
    """Its root filesystem is read-only: AGMARL_STATE_DIR (the experience mirror, runs, models) is a writable
    mounted volume, an emptyDir or a claim."""
    spec = pod_spec(one(overlay, "Deployment", "trainer"))
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    state = {e["name"]: e.get("value") for e in container.get("env", [])}["AGMARL_STATE_DIR"]
    assert load_settings(TrainerSettings, environ={"AGMARL_STATE_DIR": state}).state_dir == state
    (mount,) = [m for m in container.get("volumeMounts", []) if m["mountPath"] == state]
    assert not mount.get("readOnly"), mount
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume or "persistentVolumeClaim" in volume, volume


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
