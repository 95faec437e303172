"""A real Kubernetes control plane on loopback for benchmarks and end-to-end tests (not shipped).

etcd (temp data dir), kube-apiserver and kube-scheduler (v1.36 built by ``tools/kube/build.sh``, or v1.20.2 by
``tools/kube/build_debian.py``, into ``.state/kube/bin``; ``scheduler_config_for`` and ``apiserver_version_flags``
adapt to the version) as child processes of this one, each ended by its PID; N Node objects made Ready
through the status subresource (there is no kubelet: bound pods keep phase Pending with ``spec.nodeName``).

Security, even on loopback: the API server serves TLS with a certificate of a CA made here (the
``cryptography`` package), authenticates clients by certificate only (``--anonymous-auth=false``, no
token file), authorises with RBAC; the admin kubeconfig (``O=system:masters``) is written to the state
dir (mode 0600), kube-scheduler gets its own identity (``CN=system:kube-scheduler``, the bootstrap
RBAC roles). Service accounts are signed with an RSA key made here.

    .venv/bin/python tools/kube/control_plane.py --nodes 100 \
        [--scheduler-config deploy/k8s/overlays/hybrid/scheduler-config.yaml --extender-url http://127.0.0.1:PORT]

runs until Ctrl-C and prints the admin kubeconfig. As a library::

    with ControlPlane(state_dir).start() as cp:
        cp.create_nodes(100, cpu="32", memory="128Gi", pods="110")
        cp.start_scheduler(cp.scheduler_config(SHIPPED_CONFIGS["hybrid"], extender_url=url))
        api = cp.core_api()
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE = ROOT / ".state" / "kube"
DEFAULT_BIN = DEFAULT_STATE / "bin"
# The shipped KubeSchedulerConfigurations (deploy/k8s/overlays/<mode>/scheduler-config.yaml).
SHIPPED_CONFIGS = {mode: ROOT / "deploy" / "k8s" / "overlays" / mode / "scheduler-config.yaml"
                   for mode in ("shadow", "hybrid", "canary", "full")}
SERVICE_CIDR = "10.96.0.0/24"  # an allocation range for Service ClusterIPs only: nothing is ever sent to it
ISSUER = "https://kubernetes.default.svc.cluster.local"


class RigError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.1,
               alive: Callable[[], str | None] | None = None) -> Any:
    """Poll ``cond`` until truthy (returned) or ``timeout``; ``alive`` names a dead dependency to fail fast."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            got = cond()
            if got:
                return got
        except Exception as exc:  # noqa: BLE001 - a not-yet-listening server, a 5xx: try again
            last = exc
        if alive is not None:
            dead = alive()
            if dead:
                raise RigError(f"{what}: {dead}")
        time.sleep(interval)
    raise RigError(f"{what}: not within {timeout:.0f} s" + (f" (last error: {last})" if last else ""))


# ---------------------------------------------------------------------------------------------------
# Certificates

@dataclass
class Pki:
    """A CA, the API server's serving certificate, client certificates and the service-account key."""

    directory: Path
    files: dict[str, Path] = field(default_factory=dict)

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        self.files[name] = path
        return path

    def make(self) -> "Pki":
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self.directory.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.timezone.utc)

        def key_pem(key: Any) -> bytes:
            return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())

        def name(cn: str, org: str | None = None) -> x509.Name:
            attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
            if org:
                attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
            return x509.Name(attrs)

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (x509.CertificateBuilder().subject_name(name("agmarl-rig-ca")).issuer_name(name("agmarl-rig-ca"))
              .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                           content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False,
                                           encipher_only=False, decipher_only=False), critical=True)
              .sign(ca_key, hashes.SHA256()))
        self._write("ca.crt", ca.public_bytes(serialization.Encoding.PEM))

        def leaf(stem: str, subject: x509.Name, usage: Any, sans: list[x509.GeneralName] | None = None) -> None:
            key = ec.generate_private_key(ec.SECP256R1())
            b = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
                 .public_key(key.public_key()).serial_number(x509.random_serial_number())
                 .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                 .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                 .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
            if sans:
                b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            self._write(f"{stem}.crt", b.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
            self._write(f"{stem}.key", key_pem(key))

        loopback = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"),
                    x509.DNSName("kubernetes.default.svc"), x509.IPAddress(ipaddress.ip_address("10.96.0.1"))]
        leaf("apiserver", name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, loopback)
        leaf("scheduler-serving", name("kube-scheduler"), ExtendedKeyUsageOID.SERVER_AUTH, loopback[:2])
        leaf("admin", name("agmarl-rig-admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH)
        leaf("scheduler", name("system:kube-scheduler"), ExtendedKeyUsageOID.CLIENT_AUTH)
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._write("sa.key", key_pem(sa))
        self._write("sa.pub", sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo))
        return self

    def ssl_context(self, client: str = "admin") -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.files["ca.crt"]))
        ctx.load_cert_chain(str(self.files[f"{client}.crt"]), str(self.files[f"{client}.key"]))
        return ctx


def kubeconfig(server: str, pki: Pki, client: str, cluster: str = "agmarl-rig") -> dict[str, Any]:
    """A kubeconfig naming the CA and a client certificate by path."""
    user = f"{cluster}-{client}"
    return {"apiVersion": "v1", "kind": "Config", "current-context": cluster,
            "clusters": [{"name": cluster, "cluster": {"server": server,
                                                       "certificate-authority": str(pki.files["ca.crt"])}}],
            "users": [{"name": user, "user": {"client-certificate": str(pki.files[f"{client}.crt"]),
                                              "client-key": str(pki.files[f"{client}.key"])}}],
            "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}]}


def rewrite_scheduler_config(config: dict[str, Any], kubeconfig_path: str | Path,
                             extender_url: str | None) -> dict[str, Any]:
    """A shipped KubeSchedulerConfiguration with only its kubeconfig and extender URL changed
    (``extender_url`` None: the extenders removed, kube-scheduler alone with the same profile)."""
    out = json.loads(json.dumps(config))
    out.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig_path)
    if extender_url is None:
        out.pop("extenders", None)
    else:
        if not out.get("extenders"):
            raise RigError("the scheduler configuration has no extender to point at " + extender_url)
        for ext in out["extenders"]:
            ext["urlPrefix"] = extender_url
    return out


# The shipped configurations are ``kubescheduler.config.k8s.io/v1`` (kube-scheduler >= 1.25). An older
# kube-scheduler (v1.20.2, built from Debian's source by tools/kube/build_debian.py) reads v1beta1, whose score
# plugin for the resources' "least allocated" strategy is NodeResourcesLeastAllocated (NodeResourcesFit was a
# filter only; its scoringStrategy came in v1beta2): the same plugins, weights and extenders otherwise.
V1BETA1_MINORS = range(19, 22)
V1BETA1_SCORE_NAMES = {"NodeResourcesFit": "NodeResourcesLeastAllocated"}


def scheduler_config_for(config: dict[str, Any], version: tuple[int, int], insecure_port: int = 0
                         ) -> dict[str, Any]:
    """A shipped (v1) KubeSchedulerConfiguration in the API version kube-scheduler ``version`` (major, minor)
    reads: unchanged from 1.25 on; for 1.19-1.21 ``v1beta1`` with the score plugins renamed as above (a
    v1 field v1beta1 does not know fails kube-scheduler's strict decoding, so nothing is dropped silently).
    Other versions: RigError."""
    major, minor = version
    if major != 1 or not (minor >= 25 or minor in V1BETA1_MINORS):
        raise RigError(f"kube-scheduler v{major}.{minor}: the rig knows the configuration API of 1.19-1.21 "
                       "(v1beta1) and >= 1.25 (v1)")
    out = json.loads(json.dumps(config))
    if minor >= 25:
        return out
    if out.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
        raise RigError(f"expected a kubescheduler.config.k8s.io/v1 configuration, got {out.get('apiVersion')}")
    out["apiVersion"] = "kubescheduler.config.k8s.io/v1beta1"
    # v1beta1 serves healthz and metrics over plain HTTP on 0.0.0.0:10251 by default. With --config, the --port flag
    # does not close it, an empty address is replaced by that default and port 0 fails validation: so it is
    # bound to loopback, on a free port (read-only health and metrics, no API; 1.23 removed this port)
    out["healthzBindAddress"] = out["metricsBindAddress"] = f"127.0.0.1:{insecure_port or free_port()}"
    for profile in out.get("profiles") or []:
        score = (profile.get("plugins") or {}).get("score") or {}
        for key in ("enabled", "disabled"):
            for plugin in score.get(key) or []:
                plugin["name"] = V1BETA1_SCORE_NAMES.get(plugin["name"], plugin["name"])
    return out


def binary_version(path: str | Path) -> tuple[int, int]:
    """(major, minor) of a Kubernetes binary (``Kubernetes v1.20.2`` from ``--version``)."""
    out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    found = re.search(r"v(\d+)\.(\d+)", out.stdout + out.stderr)
    if not found:
        raise RigError(f"{path} --version: no version in {out.stdout!r}")
    return int(found.group(1)), int(found.group(2))


def apiserver_version_flags(version: tuple[int, int]) -> list[str]:
    """Flags a kube-apiserver of ``version`` needs beyond the rig's own: before 1.24 it has an unauthenticated HTTP
    port (``--insecure-port``, 8080 by default before 1.20), closed here whatever the version's default."""
    return ["--insecure-port=0"] if version < (1, 24) else []


# ---------------------------------------------------------------------------------------------------
# Processes

@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path
    port: int = 0  # kube-scheduler: its secure port

    @property
    def pid(self) -> int:
        return self.proc.pid

    def dead(self) -> str | None:
        code = self.proc.poll()
        if code is None:
            return None
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return f"{self.name} exited {code}; last log lines:\n{tail}"

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM to this PID, SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


def find_binaries(bin_dir: Path = DEFAULT_BIN, etcd: str | None = None) -> dict[str, str]:
    """Paths of kube-apiserver, kube-scheduler (bin_dir) and etcd (``etcd``, bin_dir/etcd, or PATH)."""
    found = {}
    for name in ("kube-apiserver", "kube-scheduler"):
        path = Path(bin_dir) / name
        if not os.access(path, os.X_OK):
            raise RigError(f"{path} missing: run tools/kube/build.sh or tools/kube/build_debian.py (docs/kube-real.md)")
        found[name] = str(path)
    candidates = [etcd] if etcd else [str(Path(bin_dir) / "etcd"), shutil.which("etcd") or ""]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            found["etcd"] = c
            break
    else:
        raise RigError("no etcd: apt-get install -y etcd-server, or tools/kube/build.sh --etcd")
    return found


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler processes on demand) on 127.0.0.1, in ``state_dir``."""

    def __init__(self, state_dir: str | Path | None = None, bin_dir: str | Path = DEFAULT_BIN,
                 etcd: str | None = None, etcd_data: str | Path | None = None, verbosity: int = 1):
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="agmarl-rig-")).resolve()
        self.bin_dir = Path(bin_dir)
        self.etcd_bin = etcd
        self.etcd_data_arg = etcd_data
        self.verbosity = verbosity
        self.children: list[Child] = []
        self.pki = Pki(self.state_dir / "pki")
        self.kubeconfig = self.state_dir / "admin.kubeconfig"
        self.scheduler_kubeconfig = self.state_dir / "scheduler.kubeconfig"
        self.api_port = 0
        self.etcd_data: Path | None = None
        self._created_etcd_data = False
        self.bins: dict[str, str] = {}
        self.versions: dict[str, tuple[int, int]] = {}  # kube-apiserver, kube-scheduler: (major, minor)

    # -- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> "ControlPlane":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def _spawn(self, name: str, argv: list[str]) -> Child:
        log = self.state_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        out = log.open("ab")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(self.state_dir), start_new_session=True)
        out.close()
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def start(self, timeout: float = 120.0) -> "ControlPlane":
        try:
            self.bins = find_binaries(self.bin_dir, self.etcd_bin)
            self.versions = {name: binary_version(self.bins[name]) for name in ("kube-apiserver", "kube-scheduler")}
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.pki.make()
            etcd_port = self.start_etcd(timeout)
            self.start_apiserver(etcd_port, timeout)
            for path, client in ((self.kubeconfig, "admin"), (self.scheduler_kubeconfig, "scheduler")):
                path.write_text(yaml.safe_dump(kubeconfig(self.server, self.pki, client)))
                path.chmod(0o600)
            self.ensure_namespace("default")
        except BaseException:
            self.stop()
            raise
        return self

    def start_etcd(self, timeout: float = 60.0) -> int:
        if self.etcd_data_arg:
            self.etcd_data = Path(self.etcd_data_arg)
        else:  # tmpfs when there is one: fsync is the same cost on every run
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            self.etcd_data = Path(tempfile.mkdtemp(prefix="agmarl-rig-etcd-", dir=base))
            self._created_etcd_data = True
        client, peer = free_port(), free_port()
        child = self._spawn("etcd", [
            self.bins["etcd"], "--name", "rig", "--data-dir", str(self.etcd_data / "member-data"),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"rig=http://127.0.0.1:{peer}", "--initial-cluster-state", "new",
            "--logger", "zap", "--log-level", "warn"])

        def healthy() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", client, timeout=2)
            try:
                conn.request("GET", "/health")
                resp = conn.getresponse()
                return resp.status == 200 and json.loads(resp.read()).get("health") == "true"
            finally:
                conn.close()

        wait_until(healthy, timeout, "etcd healthy", alive=child.dead)
        self.etcd_port = client
        return client

    def start_apiserver(self, etcd_port: int, timeout: float = 120.0) -> None:
        self.api_port = free_port()
        f = self.pki.files
        child = self._spawn("kube-apiserver", [
            self.bins["kube-apiserver"],
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
            f"--tls-cert-file={f['apiserver.crt']}", f"--tls-private-key-file={f['apiserver.key']}",
            f"--client-ca-file={f['ca.crt']}",
            "--anonymous-auth=false", "--authorization-mode=RBAC",
            f"--service-account-key-file={f['sa.pub']}", f"--service-account-signing-key-file={f['sa.key']}",
            f"--service-account-issuer={ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--endpoint-reconciler-type=none",  # no kubelets or peers to reconcile
            "--profiling=false", f"--v={self.verbosity}",
            *apiserver_version_flags(self.versions.get("kube-apiserver", (1, 99)))])
        ctx = self.pki.ssl_context("admin")

        def ready() -> bool:
            conn = http.client.HTTPSConnection("127.0.0.1", self.api_port, context=ctx, timeout=5)
            try:
                conn.request("GET", "/readyz")
                resp = conn.getresponse()
                resp.read()
                return resp.status == 200
            finally:
                conn.close()

        wait_until(ready, timeout, "kube-apiserver /readyz", interval=0.25, alive=child.dead)

    def scheduler_config(self, shipped: str | Path, extender_url: str | None, name: str = "") -> Path:
        """Writes the shipped config with only the kubeconfig (this rig's scheduler identity) and the extender
        URL changed (None: no extender), in the API version this kube-scheduler reads (``scheduler_config_for``),
        and returns its path."""
        config = yaml.safe_load(Path(shipped).read_text())
        out = rewrite_scheduler_config(config, self.scheduler_kubeconfig, extender_url)
        if "kube-scheduler" in self.versions:
            out = scheduler_config_for(out, self.versions["kube-scheduler"])
        path = self.state_dir / f"scheduler-config{('-' + name) if name else ''}.yaml"
        path.write_text(yaml.safe_dump(out, sort_keys=False))
        return path

    def start_scheduler(self, config: str | Path, timeout: float = 60.0, verbosity: int | None = None) -> Child:
        """kube-scheduler with ``config``; returns when its /healthz answers (TLS, this rig's CA)."""
        port = free_port()
        f = self.pki.files
        child = self._spawn(f"kube-scheduler-{port}", [
            self.bins["kube-scheduler"], f"--config={config}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--tls-cert-file={f['scheduler-serving.crt']}", f"--tls-private-key-file={f['scheduler-serving.key']}",
            f"--authentication-kubeconfig={self.scheduler_kubeconfig}",
            f"--authorization-kubeconfig={self.scheduler_kubeconfig}",
            f"--v={self.verbosity if verbosity is None else verbosity}"])
        ctx = ssl.create_default_context(cafile=str(f["ca.crt"]))

        def healthy() -> bool:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
            try:
                conn.request("GET", "/healthz")
                resp = conn.getresponse()
                return resp.status == 200 and resp.read().strip() == b"ok"
            finally:
                conn.close()

        wait_until(healthy, timeout, "kube-scheduler /healthz", interval=0.2, alive=child.dead)
        child.port = port
        return child

    def scheduler_metrics(self, child: Child) -> str:
        """kube-scheduler's /metrics (as the admin: system:masters passes its SubjectAccessReview)."""
        ctx = self.pki.ssl_context("admin")
        conn = http.client.HTTPSConnection("127.0.0.1", child.port, context=ctx, timeout=10)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            return resp.read().decode()
        finally:
            conn.close()

    def stop_child(self, child: Child) -> int | None:
        code = child.stop()
        if child in self.children:
            self.children.remove(child)
        return code

    def stop(self) -> None:
        """Ends every process this rig started, newest first, each by its PID; removes the etcd data."""
        for child in reversed(list(self.children)):
            with contextlib.suppress(Exception):
                child.stop()
        self.children.clear()
        if self._created_etcd_data and self.etcd_data is not None:
            shutil.rmtree(self.etcd_data, ignore_errors=True)
            self._created_etcd_data = False

    # -- API objects ------------------------------------------------------------------------------
    def api_client(self, qps_pool: int = 16) -> Any:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = qps_pool
        return client.ApiClient(cfg)

    def core_api(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def ensure_namespace(self, name: str) -> None:
        """The namespace and its ``default`` ServiceAccount (no kube-controller-manager makes it here, and
        the ServiceAccount admission plugin refuses pods without it)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = self.core_api()
        for make in (lambda: api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name))),
                     lambda: api.create_namespaced_service_account(
                         name, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default")))):
            try:
                make()
            except ApiException as exc:
                if exc.status != 409:
                    raise

    def create_nodes(self, n: int, cpu: str = "32", memory: str = "128Gi", pods: str = "110",
                     prefix: str = "node-", labels: dict[str, str] | None = None) -> list[str]:
        """``n`` Nodes with that capacity = allocatable, made Ready through the status subresource."""
        from kubernetes import client

        api = self.core_api()
        names = [f"{prefix}{i:03d}" for i in range(n)]
        now = dt.datetime.now(dt.timezone.utc)
        resources = {"cpu": cpu, "memory": memory, "pods": pods}
        for name in names:
            meta = client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name,
                                                          "kubernetes.io/os": "linux", **(labels or {})})
            api.create_node(client.V1Node(metadata=meta))
            status = {"status": {
                "capacity": resources, "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "agmarl rig: no kubelet, Ready by the status subresource",
                                "lastHeartbeatTime": now.isoformat(), "lastTransitionTime": now.isoformat()}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
                "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.36.0",
                             "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
                             "machineID": "", "osImage": "", "systemUUID": ""}}}
            api.patch_node_status(name, status, _content_type="application/strategic-merge-patch+json")
            # the TaintNodesByCondition admission plugin gives every new Node node.kubernetes.io/not-ready:NoSchedule;
            # the node lifecycle controller (kube-controller-manager, not run here) removes it once the node is Ready
            api.patch_node(name, {"spec": {"taints": None}}, _content_type="application/merge-patch+json")
        return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-dir", default=None, help="certificates, kubeconfigs, logs (default: a temp dir)")
    p.add_argument("--bin-dir", default=str(DEFAULT_BIN))
    p.add_argument("--etcd", default=None, help="etcd binary (default: bin-dir/etcd, else PATH)")
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--cpu", default="32")
    p.add_argument("--memory", default="128Gi")
    p.add_argument("--scheduler-config", default=None, help="a KubeSchedulerConfiguration to run kube-scheduler with")
    p.add_argument("--extender-url", default=None, help="with --scheduler-config: the extenders' urlPrefix "
                   "(default: extenders removed)")
    p.add_argument("--duration", type=float, default=None, help="stop after S seconds (default: Ctrl-C)")
    args = p.parse_args(argv)
    cp = ControlPlane(args.state_dir, args.bin_dir, args.etcd)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        cp.start()
        cp.create_nodes(args.nodes, cpu=args.cpu, memory=args.memory)
        if args.scheduler_config:
            cp.start_scheduler(cp.scheduler_config(args.scheduler_config, args.extender_url))
        print(f"control plane up: {cp.server}  KUBECONFIG={cp.kubeconfig}  nodes={args.nodes}  "
              f"pids={[c.pid for c in cp.children]}", flush=True)
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            dead = next((c.dead() for c in cp.children if c.dead()), None)
            if dead:
                print(dead, file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except RigError as exc:
        print(f"control_plane: {exc}", file=sys.stderr)
        return 2
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
