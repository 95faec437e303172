"""NATS security in the deployments: the Kubernetes server config with TLS and the generated identities on
a real nats-server, the cluster's routes (three real servers on loopback with the rendered configuration: the
routes come up with the generated route credentials and TLS, a server without the password or without TLS is
refused), NetworkPolicies, each service's identity Secret, docker-compose on loopback only."""
from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from agmarl_common.runtime import permissions
from agmarl_common.runtime.bus import Bus
from agmarl_cli.natscreds import k8s_route_hosts, k8s_secrets
from agmarl_common.runtime.natsauth import NatsAuth, ensure_credentials, ensure_route_password, route_config
from agmarl_common.runtime.natsserver import free_port

from .kustomize import NATS_BIN, OVERLAYS, configmap, objects, one, pod_spec
from .test_compose import SERVICES, compose

SEED_FILE = "/var/run/agmarl/nats/seed.nk"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_tls(directory: Path) -> None:
    """A CA and a server certificate for 127.0.0.1 (what docs/security.md has the operator make for
    nats.agmarl.svc)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl not found (it makes the test certificates)")
    d = str(directory)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=agmarl-test-ca",
            "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=nats", "-keyout", f"{d}/tls.key",
            "-out", f"{d}/tls.csr")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", f"{d}/tls.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", f"{d}/san.ext", "-out", f"{d}/tls.crt")


@pytest.fixture
def k8s_nats(tmp_path: Path):
    """The rendered nats-tls.conf + nats.conf as the StatefulSet mounts them (paths moved to tmp_path),
    with a generated auth.conf and a test certificate, running on the real nats-server."""
    data = configmap("hybrid", "nats-config")["data"]
    for name, text in data.items():
        text = text.replace('"/data"', f'"{tmp_path}/data"').replace('"/etc/nats/', f'"{tmp_path}/')
        (tmp_path / name).write_text(text, encoding="utf-8")
    creds = ensure_credentials(tmp_path / "creds")
    (tmp_path / "auth.conf").write_bytes(creds.auth_config.read_bytes())
    make_tls(tmp_path)
    check = subprocess.run([str(NATS_BIN), "-t", "-c", str(tmp_path / "nats-tls.conf")], capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    proc = subprocess.Popen([str(NATS_BIN), "-c", str(tmp_path / "nats-tls.conf"), "-a", "127.0.0.1", "-p", str(port),
                             "-m", str(free_port())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"tls://127.0.0.1:{port}", creds, tmp_path
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_k8s_nats_needs_tls_and_an_identity(k8s_nats):
    url, creds, tls = k8s_nats
    ca = str(tls / "ca.crt")
    service = NatsAuth(seed_file=str(creds.seed("inference")), identity="inference", tls_ca_file=ca)
    bus = await Bus.connect(url, "inference", auth=service, connect_wait=15.0)  # retries until it listens
    try:
        assert bus.is_connected and bus.nc.connected_url.scheme == "tls"
    finally:
        await bus.close()
    with pytest.raises(ConnectionError, match="refused"):  # TLS but no identity
        await Bus.connect(url, "anonymous", auth=NatsAuth(tls_ca_file=ca), connect_wait=5.0)
    with pytest.raises((ConnectionError, asyncio.TimeoutError)):  # an identity but no trust in the certificate
        await Bus.connect(url, "no-ca", auth=NatsAuth(seed_file=str(creds.seed("inference")),
                                                      identity="inference"), connect_wait=3.0)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_has_its_own_identity_and_trusts_the_nats_ca(overlay: str):
    data = configmap(overlay, "agmarl-config")["data"]
    assert data["NATS_URL"].startswith("tls://")
    ca_file = data["AGMARL_NATS_TLS_CA_FILE"]
    for service in SERVICES:
        spec = pod_spec(one(overlay, "Deployment", service))
        container = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env["AGMARL_NATS_NKEY_SEED_FILE"] == SEED_FILE, service
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(Path(SEED_FILE).parent)]
        assert mount.get("readOnly") and Path(ca_file).parent == Path(SEED_FILE).parent
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        secrets = {s["secret"]["name"]: s["secret"]["items"] for s in volume["projected"]["sources"]}
        assert secrets[f"agmarl-nats-{service}"] == [{"key": "seed.nk", "path": "seed.nk"}], service
        assert secrets["agmarl-nats-tls"] == [{"key": "ca.crt", "path": "ca.crt"}]
        assert volume["projected"]["defaultMode"] == 0o440 and spec["securityContext"]["fsGroup"]
    assert sorted(SERVICES) == permissions.services()  # one identity per deployed service
    assert not objects(overlay, "Secret"), "no Secret is rendered from the repository"


def test_nats_mounts_its_user_list_and_certificate_and_hides_monitoring():
    sts = one("hybrid", "StatefulSet", "nats")
    spec = pod_spec(sts)
    (volume,) = [v for v in spec["volumes"] if v["name"] == "config"]
    sources = volume["projected"]["sources"]
    assert {s["secret"]["name"] for s in sources if "secret" in s} == {"agmarl-nats-auth", "agmarl-nats-routes",
                                                                     "agmarl-nats-tls"}
    (routes,) = [s["secret"] for s in sources if s.get("secret", {}).get("name") == "agmarl-nats-routes"]
    assert routes["items"] == [{"key": "routes.conf", "path": "routes.conf"}]
    assert [s["configMap"]["name"].startswith("nats-config-") for s in sources if "configMap" in s] == [True]
    svc = one("hybrid", "Service", "nats")
    assert [p["port"] for p in svc["spec"]["ports"]] == [4222]


def test_network_policies_admit_only_the_project():
    policies = {p["metadata"]["name"]: p["spec"] for p in objects("hybrid", "NetworkPolicy")}
    nats = policies["nats-clients"]
    assert nats["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "nats"}
    (rule,) = nats["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 4222}]  # never the monitoring port
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": "agmarl-service"}}}]
    for service in SERVICES:  # every service carries the label NATS admits
        labels = one("hybrid", "Deployment", service)["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == "agmarl-service", service
    ext = policies["inference-extender"]
    (rule,) = ext["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    scheduler = one("hybrid", "Deployment", "agmarl-scheduler")["spec"]["template"]["metadata"]["labels"]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= scheduler.items()
    metrics = policies["agmarl-service-metrics"]
    prometheus = one("hybrid", "Deployment", "prometheus")["spec"]["template"]["metadata"]["labels"]
    assert metrics["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items() <= prometheus.items()


def test_compose_publishes_on_loopback_only_and_not_the_monitoring_port():
    services = compose()["services"]
    published = 0
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} is published on every interface"
            published += 1
    assert published
    assert not [p for p in services["nats"].get("ports", []) if str(p).endswith(":8222")]


def test_compose_services_run_authenticated_with_generated_credentials(tmp_path: Path):
    services = compose()["services"]
    creds = ensure_credentials(tmp_path)  # what `agmarl nats-creds --dir .state/nats-creds` writes
    for volume in services["nats"]["volumes"]:
        source, target = volume.split(":")[:2]
        if target == "/etc/nats/auth.conf":
            assert Path(source).name == creds.auth_config.name
            break
    else:
        pytest.fail("nats does not mount auth.conf")
    for name in SERVICES:
        env = services[name]["environment"]
        seed = env["AGMARL_NATS_NKEY_SEED_FILE"]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in services[name].get("volumes", [])}
        assert Path(mounts[seed]).name == creds.seed(name).name, name


# --- the cluster's routes -------------------------------------------------------------------------------

def routez(monitor_port: int) -> list[str]:
    """The names of the servers this one has routes to (from its monitoring endpoint)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/routez", timeout=3) as resp:
        return sorted({r.get("remote_name", "") for r in json.load(resp)["routes"]})


def test_the_k8s_route_secret_matches_the_statefulset(tmp_path: Path):
    """`agmarl nats-creds --k8s` makes Secret agmarl-nats-routes: routes.conf with the route user and password
    and a route to every server of the StatefulSet, by its headless Service; the password is kept in DIR."""
    creds = ensure_credentials(tmp_path)
    password = ensure_route_password(tmp_path)
    assert ensure_route_password(tmp_path) == password and len(password) == 64  # made once, kept
    assert (tmp_path / "route.password").stat().st_mode & 0o777 == 0o600
    secrets = {s["metadata"]["name"]: s for s in k8s_secrets(creds, "agmarl", password)}
    text = base64.b64decode(secrets["agmarl-nats-routes"]["data"]["routes.conf"]).decode()
    assert text == route_config(password, k8s_route_hosts("agmarl"))
    sts = one("hybrid", "StatefulSet", "nats")
    headless = one("hybrid", "Service", sts["spec"]["serviceName"])
    port = next(p["port"] for p in headless["spec"]["ports"] if p["name"] == "cluster")
    want = [f"nats-route://agmarl-route:{password}@{sts['metadata']['name']}-{i}.{headless['metadata']['name']}"
            f".agmarl.svc:{port}" for i in range(sts["spec"]["replicas"])]
    assert re.findall(r'"(nats-route://[^"]+)"', text) == want
    assert f'"password": "{password}"' in text
    assert ensure_route_password(tmp_path, rotate=True) != password
    conf = configmap("hybrid", "nats-config")["data"]["nats-cluster.conf"]
    assert password not in conf and "include \"routes.conf\"" in conf  # the repository holds no password


def test_cluster_routes_need_the_route_password_and_tls(tmp_path: Path):
    """Three servers run the rendered nats-cluster.conf on loopback (ports and paths moved; routes.conf made
    by route_config with loopback addresses): every server routes to the other two. A fourth with TLS but a
    wrong password, and a fifth with the password but no TLS, get no route."""
    data = configmap("hybrid", "nats-config")["data"]
    make_tls(tmp_path)
    creds = ensure_credentials(tmp_path / "creds")
    password = ensure_route_password(tmp_path / "creds")
    cports = [free_port() for _ in range(3)]
    procs = []

    def start(name: str, cport: int, routes_conf: str, tls: bool = True) -> int:
        d = tmp_path / name
        d.mkdir()
        for file, text in data.items():
            text = text.replace('"/data"', f'"{d}/data"').replace('"/etc/nats/', f'"{tmp_path}/')
            text = text.replace('listen: "0.0.0.0:6222"', f'listen: "127.0.0.1:{cport}"')
            if not tls:
                text = re.sub(r"\n  tls \{[^}]*\}", "", text)
            (d / file).write_text(text, encoding="utf-8")
        (d / "auth.conf").write_bytes(creds.auth_config.read_bytes())
        (d / "routes.conf").write_text(routes_conf, encoding="utf-8")
        check = subprocess.run([str(NATS_BIN), "-t", "-c", str(d / "nats-cluster.conf")], capture_output=True,
                               text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
        monitor = free_port()
        log = open(d / "server.log", "w")  # noqa: SIM115 - closed with the process
        procs.append((subprocess.Popen([str(NATS_BIN), "-c", str(d / "nats-cluster.conf"), "--server_name", name,
                                        "-a", "127.0.0.1", "-p", str(free_port()), "-m", str(monitor)],
                                       stdout=log, stderr=subprocess.STDOUT), log))
        return monitor

    def wait_routes(monitor: int, want: list[str], timeout: float = 30.0) -> list[str]:
        deadline, got = time.monotonic() + timeout, []
        while time.monotonic() < deadline:
            try:
                got = routez(monitor)
            except OSError:
                got = []
            if got == want:
                break
            time.sleep(0.2)
        return got

    def wait_refusals(path: Path, timeout: float = 30.0) -> str:
        """The server's log once it holds both refusals (wrong password, no TLS), or at the deadline."""
        deadline, log = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            log = path.read_text()
            if (("Authentication Failure" in log or "authentication error" in log)
                    and "TLS" in log and "handshake" in log.lower()):
                break
            time.sleep(0.1)
        return log

    hosts = [f"127.0.0.1:{p}" for p in cports]
    names = [f"nats-{i}" for i in range(3)]
    try:
        monitors = [start(names[i], cports[i], route_config(password, hosts)) for i in range(3)]
        for i, monitor in enumerate(monitors):
            others = sorted(n for n in names if n != names[i])
            assert wait_routes(monitor, others) == others, (tmp_path / names[i] / "server.log").read_text()[-3000:]
        wrong = start("wrong-password", free_port(), route_config("0" * 64, hosts))
        plain = start("no-tls", free_port(), route_config(password, hosts), tls=False)
        # each intruder's route attempts have been refused by every member (its log says so), then no route
        for name in names:
            log = wait_refusals(tmp_path / name / "server.log")
            assert "Authentication Failure" in log or "authentication error" in log, log[-3000:]
            assert "TLS" in log and "handshake" in log.lower(), log[-3000:]
        assert routez(wrong) == [] and routez(plain) == []
        for monitor in monitors:
            assert set(routez(monitor)) <= set(names)
    finally:
        for proc, log in procs:
            proc.terminate()
        for proc, log in procs:
            proc.wait(timeout=10)
            log.close()
