"""The parts of the real-Kubernetes rig (tools/kube/control_plane.py) and of benchmarks/kube_real.py that
run without kube-apiserver: certificates and kubeconfigs (checked with the official client against a TLS
server that demands the client certificate), the scheduler configurations the rig derives from the
shipped ones, etcd under the rig (when an etcd binary is installed), and the benchmark's arithmetic.
tests/e2e/test_real_kube.py runs the whole thing against the real binaries."""

from __future__ import annotations

import http.server
import shutil
import ssl
import sys
import threading
from pathlib import Path

import pytest
import yaml

from agmarl_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "kube"))
import control_plane as rig  # noqa: E402


kube_real = load_script(ROOT / "benchmarks" / "kube_real.py", "kube_real_bench")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return rig.Pki(tmp_path_factory.mktemp("pki")).make()


def _tls_server(pki: rig.Pki, body: bytes):
    """An HTTPS server on 127.0.0.1 with the rig's serving certificate that demands a client certificate
    signed by the rig's CA, as kube-apiserver with --client-ca-file and --anonymous-auth=false."""
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.connection.getpeercert())
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.files["apiserver.crt"], pki.files["apiserver.key"])
    ctx.load_verify_locations(pki.files["ca.crt"])
    ctx.verify_mode = ssl.CERT_REQUIRED
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_admin_kubeconfig_works_with_the_official_client_and_names_system_masters(pki, tmp_path):
    from kubernetes import client, config

    body = b'{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}'
    server, seen = _tls_server(pki, body)
    try:
        path = tmp_path / "admin.kubeconfig"
        path.write_text(yaml.safe_dump(rig.kubeconfig(f"https://127.0.0.1:{server.server_port}", pki, "admin")))
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(path), client_configuration=cfg)
        nodes = client.CoreV1Api(client.ApiClient(cfg)).list_node()
        assert nodes.items == [] and nodes.metadata.resource_version == "1"
        subject = dict(x[0] for x in seen[0]["subject"])
        assert subject == {"commonName": "agmarl-rig-admin", "organizationName": "system:masters"}
    finally:
        server.shutdown()


def test_no_client_certificate_no_answer(pki):
    """Nothing anonymous: a client without the rig's client certificate is refused at the handshake."""
    server, seen = _tls_server(pki, b"{}")
    try:
        ctx = ssl.create_default_context(cafile=str(pki.files["ca.crt"]))
        import http.client

        conn = http.client.HTTPSConnection("127.0.0.1", server.server_port, context=ctx, timeout=5)
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            conn.request("GET", "/api/v1/nodes")
            conn.getresponse().read()
        assert seen == []
    finally:
        server.shutdown()


def test_scheduler_identity_is_kube_scheduler(pki):
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pki.files["scheduler.crt"].read_bytes())
    assert cert.subject.rfc4514_string() == "CN=system:kube-scheduler"
    assert all((pki.files[k].stat().st_mode & 0o077) == 0 for k in pki.files)  # keys and certs 0600


@pytest.mark.parametrize("mode", sorted(rig.SHIPPED_CONFIGS))
def test_scheduler_config_changes_only_kubeconfig_and_extender_url(mode):
    shipped = yaml.safe_load(rig.SHIPPED_CONFIGS[mode].read_text())
    out = rig.rewrite_scheduler_config(shipped, "/x/scheduler.kubeconfig", "http://127.0.0.1:1234")
    assert out["clientConnection"]["kubeconfig"] == "/x/scheduler.kubeconfig"
    assert [e["urlPrefix"] for e in out["extenders"]] == ["http://127.0.0.1:1234"] * len(shipped["extenders"])
    # everything else as shipped
    for e_out, e_in in zip(out["extenders"], shipped["extenders"]):
        assert {k: v for k, v in e_out.items() if k != "urlPrefix"} == {k: v for k, v in e_in.items() if k != "urlPrefix"}
    strip = lambda c: {k: v for k, v in c.items() if k not in ("extenders", "clientConnection")}  # noqa: E731
    assert strip(out) == strip(shipped)
    assert {k: v for k, v in out["clientConnection"].items() if k != "kubeconfig"} == shipped["clientConnection"]
    alone = rig.rewrite_scheduler_config(shipped, "/x/k", None)  # kube-scheduler alone: same profile, no extender
    assert "extenders" not in alone and alone["profiles"] == shipped["profiles"]


@pytest.mark.parametrize("mode", sorted(rig.SHIPPED_CONFIGS))
def test_scheduler_config_for_kube_1_20_is_v1beta1_with_the_same_profile_and_no_open_port(mode):
    shipped = yaml.safe_load(rig.SHIPPED_CONFIGS[mode].read_text())
    assert rig.scheduler_config_for(shipped, (1, 36)) == shipped  # a v1 scheduler reads it as shipped
    out = rig.scheduler_config_for(shipped, (1, 20), insecure_port=4321)
    assert out["apiVersion"] == "kubescheduler.config.k8s.io/v1beta1"
    # 1.20's plain-HTTP health / metrics port: loopback only, never 0.0.0.0:10251
    assert out["healthzBindAddress"] == out["metricsBindAddress"] == "127.0.0.1:4321"
    # the same score plugins and weights, NodeResourcesFit under its 1.20 name
    def names(c):
        return [(p["name"], p["weight"]) for p in c["profiles"][0]["plugins"]["score"]["enabled"]]
    renamed = [("NodeResourcesLeastAllocated" if n == "NodeResourcesFit" else n, w) for n, w in names(shipped)]
    assert names(out) == renamed
    assert ("NodeResourcesFit", 1) in names(shipped)
    changed = ("apiVersion", "profiles", "healthzBindAddress", "metricsBindAddress")
    same = lambda c: {k: v for k, v in c.items() if k not in changed}  # noqa: E731
    assert same(out) == same(shipped) and out["extenders"] == shipped["extenders"]
    assert shipped["apiVersion"] == "kubescheduler.config.k8s.io/v1"  # the input is not changed in place
    for version in ((1, 23), (1, 18), (2, 0)):  # a configuration API the rig does not know: said, not guessed
        with pytest.raises(rig.RigError, match="configuration API"):
            rig.scheduler_config_for(shipped, version)


def test_an_old_apiserver_gets_its_insecure_port_closed():
    assert rig.apiserver_version_flags((1, 20)) == ["--insecure-port=0"]
    assert rig.apiserver_version_flags((1, 23)) == ["--insecure-port=0"]
    assert rig.apiserver_version_flags((1, 24)) == [] and rig.apiserver_version_flags((1, 36)) == []


def test_rig_starts_and_ends_etcd_by_pid(tmp_path):
    assert shutil.which("etcd"), "no etcd binary: apt-get install -y etcd-server (.ci/run installs it)"
    import os

    cp = rig.ControlPlane(tmp_path / "rig")
    cp.bins = {"etcd": shutil.which("etcd")}
    cp.pki.make()
    try:
        cp.start_etcd(timeout=60)
        (child,) = cp.children
        os.kill(child.pid, 0)  # running
        data = cp.etcd_data
        assert data is not None and data.exists()
    finally:
        cp.stop()
    assert child.proc.poll() is not None and cp.children == [] and not data.exists()


def test_missing_binaries_say_how_to_build(tmp_path):
    with pytest.raises(rig.RigError, match="tools/kube/build.sh"):
        rig.find_binaries(tmp_path)


# --- benchmarks/kube_real.py's arithmetic --------------------------------------------------------------

def test_quantities():
    assert kube_real.cpu_milli("100m") == 100 and kube_real.cpu_milli("32") == 32000
    assert kube_real.cpu_milli("1.5") == 1500
    assert kube_real.mem_bytes("128Mi") == 128 * 2**20 and kube_real.mem_bytes("128Gi") == 128 * 2**30
    assert kube_real.mem_bytes("1G") == 10**9 and kube_real.mem_bytes("1024") == 1024


def test_node_usage_finds_overcommit_and_spread():
    nodes = {"a": {"cpu": "1", "memory": "1Gi", "pods": "110"}, "b": {"cpu": "1", "memory": "1Gi", "pods": "2"},
             "c": {"cpu": "1", "memory": "1Gi", "pods": "110"}}
    pods = ([{"node": "a", "cpu": "500m", "memory": "128Mi"}] * 2 + [{"node": "a", "cpu": "100m", "memory": "1Mi"}]
            + [{"node": "b", "cpu": "10m", "memory": "1Mi"}] * 3)
    u = kube_real.node_usage(pods, nodes)
    assert {(o["node"], o["resource"]) for o in u["overcommitted"]} == {("a", "cpu_m"), ("b", "pods")}
    assert (u["max_pods_per_node"], u["min_pods_per_node"]) == (3, 0)
    fits = kube_real.node_usage(pods[:2], nodes)
    assert fits["overcommitted"] == []


def test_decision_log_against_bindings():
    text = "\n".join([
        "12:00:01  bench/p00000                             -> node-001             policy=model:default score=7.0 mode=hybrid trace=ab",
        "12:00:01  bench/p00001                             -> node-002             policy=model:default score=7.0 mode=hybrid trace=cd",
        "12:00:02  bench/p00001                             -> node-003             policy=model:default score=7.0 mode=hybrid trace=cd",
        "12:00:02  bench/p00002                             -> (unschedulable)      policy=kube-default score=0.0 mode=full trace=",
        "(undecodable decision: x)",
    ])
    logged = kube_real.parse_decisions(text)
    assert logged == {"bench/p00000": ["node-001"], "bench/p00001": ["node-002", "node-003"],
                      "bench/p00002": ["(unschedulable)"]}
    got = kube_real.decision_agreement(logged, {"bench/p00000": "node-001", "bench/p00001": "node-003",
                                                "bench/p00002": "node-004", "bench/p00003": "node-005"})
    assert (got["matched"], got["wrong"], got["missing"], got["pods_with_several_entries"]) == (2, 1, 1, 1)


def test_prometheus_samples():
    text = ('# HELP x\nagmarl_extender_fallbacks_total{reason="model_timeout"} 3.0\n'
            'agmarl_extender_fallbacks_total{reason="cold_cache"} 0.0\nscheduler_schedule_attempts_total'
            '{profile="agmarl-scheduler",result="scheduled"} 2000\nother 1\n')
    fb = kube_real.prom_samples(text, "agmarl_extender_fallbacks_total")
    assert {kube_real.label(k, "reason"): v for k, v in fb.items()} == {"model_timeout": 3.0, "cold_cache": 0.0}
    att = kube_real.prom_samples(text, "scheduler_schedule_attempts_total")
    assert [kube_real.label(k, "result") for k in att] == ["scheduled"]
    assert kube_real.prom_samples(text, "other") == {"": 1.0}


def test_pod_manifest_names_the_scheduler_and_requests():
    pod = kube_real.pod_manifest("p1", "agmarl-batch-scheduler", "100m", "128Mi")
    assert pod["spec"]["schedulerName"] == "agmarl-batch-scheduler"
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    assert pod["metadata"]["namespace"] == kube_real.NAMESPACE
