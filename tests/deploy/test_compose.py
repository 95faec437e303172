"""docker-compose.yml and the service Dockerfiles, checked as files (no Docker engine here)."""
from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from agmarl_common.settings import CommonSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SERVICES = ["state-collector", "graph-builder", "inference", "adaptive-engine", "reward-calculator", "trainer"]
INFRA = ["nats", "prometheus", "grafana", "jaeger", "otel-collector"]
SUBST = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def module_of(service: str) -> str:
    return "agmarl_" + service.replace("-", "_")


def settings_fields() -> dict[str, set[str]]:
    """service -> the field names of its settings class (what AGMARL_<FIELD> may set)."""
    out = {}
    for service in SERVICES:
        module = importlib.import_module(module_of(service) + ".settings")
        classes = [v for v in vars(module).values()
                   if isinstance(v, type) and issubclass(v, CommonSettings) and v is not CommonSettings]
        assert len(classes) == 1, f"{service}: expected one settings class, found {classes}"
        out[service] = set(classes[0].model_fields)
    return out


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def expand(value: str) -> str:
    """Compose variable substitution with the defaults (``${VAR:-default}`` -> default)."""
    return SUBST.sub(lambda m: m.group(2) or "", str(value))


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: expand(v) for k, v in env.items()}


def dockerfile(service: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = (ROOT / "services" / service / "Dockerfile").read_text(encoding="utf-8")
    text = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_compose_declares_every_service():
    services = compose()["services"]
    assert set(SERVICES + INFRA) <= set(services)


def test_build_contexts_and_dockerfiles_exist():
    built = {name: s["build"] for name, s in compose()["services"].items() if "build" in s}
    assert set(built) == set(SERVICES)
    for name, build in built.items():
        context = (ROOT / build["context"]).resolve()
        assert context.is_dir(), name
        assert (context / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']}"
        assert Path(build["dockerfile"]) == Path("services") / name / "Dockerfile"


def test_mounted_host_paths_exist_and_named_volumes_are_declared():
    data = compose()
    declared = set(data.get("volumes") or {})
    mounts = 0
    for name, service in data["services"].items():
        for volume in service.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name}: {source} does not exist"
                mounts += 1
            else:
                assert source in declared, f"{name}: named volume {source} not declared"
    assert mounts >= 5


def test_depends_on_names_existing_services():
    services = compose()["services"]
    for name, service in services.items():
        deps = service.get("depends_on", [])
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert dep != name


def test_environment_urls_point_at_services():
    services = compose()["services"]
    checked = 0
    for name, service in services.items():
        for key, value in environment(service).items():
            if "://" in value:
                host = urlsplit(value).hostname
                assert host in services, f"{name}: {key}={value} names no compose service"
                checked += 1
    assert checked >= 2 * len(SERVICES)


def test_agmarl_services_share_nats_metrics_and_tracing():
    services = compose()["services"]
    for name in SERVICES:
        env = environment(services[name])
        assert env["NATS_URL"] == "nats://nats:4222", name
        assert env["AGMARL_METRICS_PORT"] == "9100" and env["AGMARL_METRICS_HOST"] == "0.0.0.0", name
        assert env["OTEL_SERVICE_NAME"] == name
        assert urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"]).port == 4317
        assert "nats" in services[name]["depends_on"], name
    assert environment(services["state-collector"])["AGMARL_SOURCE"] == "simulator"


def test_environment_names_are_settings_fields():
    """An AGMARL_* variable nobody reads is a typo or a missing setting."""
    fields = settings_fields()
    every = set().union(*fields.values())
    services = compose()["services"]
    for name in SERVICES:
        for key in environment(services[name]):
            if key.startswith("AGMARL_"):
                assert key[len("AGMARL_"):].lower() in every, f"{name}: {key} matches no settings field"
        for word, args in dockerfile(name):
            if word == "ENV":
                for key in re.findall(r"(AGMARL_[A-Z0-9_]+)=", args):
                    assert key[len("AGMARL_"):].lower() in fields[name], f"{name} Dockerfile: {key}"


def test_nats_runs_jetstream_on_a_volume():
    nats = compose()["services"]["nats"]
    command = nats["command"] if isinstance(nats["command"], list) else shlex.split(nats["command"])
    config = ROOT / "deploy/nats/nats.conf"
    assert "-js" in command or "jetstream" in config.read_text(encoding="utf-8")
    targets = [v.split(":")[1] for v in nats["volumes"]]
    assert "/data" in targets and "/etc/nats/nats.conf" in targets
    assert 'store_dir: "/data"' in config.read_text(encoding="utf-8")
    assert nats.get("healthcheck")


def test_prometheus_scrapes_every_service_metrics_port():
    services = compose()["services"]
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text(encoding="utf-8"))
    targets = {t for job in config["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]}
    for name in SERVICES:
        assert f"{name}:{environment(services[name])['AGMARL_METRICS_PORT']}" in targets, name
    for target in targets:
        host = target.split(":")[0]
        assert host in services or host == "localhost", target


def test_grafana_and_otel_point_at_compose_services():
    services = compose()["services"]
    datasources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/datasources.yaml")
                                 .read_text(encoding="utf-8"))["datasources"]
    for ds in datasources:
        assert urlsplit(ds["url"]).hostname in services, ds
    otel = yaml.safe_load((ROOT / "deploy/otel/otel-collector.yaml").read_text(encoding="utf-8"))
    for exporter in otel["exporters"].values():
        assert exporter["endpoint"].split(":")[0] in services
    pipeline = otel["service"]["pipelines"]["traces"]
    assert set(pipeline["receivers"]) <= set(otel["receivers"])
    assert set(pipeline["processors"]) <= set(otel["processors"])
    assert set(pipeline["exporters"]) <= set(otel["exporters"])
    assert set(otel["service"].get("extensions", [])) <= set(otel.get("extensions", {}))
    assert "otel" in services["otel-collector"].get("profiles", [])


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile(service: str):
    steps = dockerfile(service)
    words = [w for w, _ in steps]
    assert steps[0] == ("FROM", "python:3.11-slim")
    # every COPY source exists (build context = repository root)
    for word, args in steps:
        if word == "COPY":
            sources = [a for a in args.split() if not a.startswith("--")][:-1]
            for source in sources:
                assert (ROOT / source).exists(), f"{service}: COPY {source}"
    runs = " ".join(a for w, a in steps if w == "RUN")
    if service == "trainer":
        assert "-r requirements-train.txt" in runs and "download.pytorch.org/whl/cpu" in runs
    else:
        assert "-r requirements.txt" in runs and "requirements-train" not in runs and "torch" not in runs
    assert "-c constraints.txt" in runs
    assert re.search(r"pip install --no-deps (-e )?\.", runs)
    # runs as a non-root user, set before the command
    users = [a for w, a in steps if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert words.index("USER") < words.index("CMD")
    cmd = [a for w, a in steps if w == "CMD"][-1]
    assert cmd == f'["python", "-m", "{module_of(service)}"]'
    package = ROOT / "services" / service / module_of(service)
    assert (package / "__main__.py").is_file(), f"{package}/__main__.py"
    assert "HEALTHCHECK" in words and "EXPOSE" in words


def test_requirements_split_keeps_torch_out_of_serving_images():
    serving = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    train = (ROOT / "requirements-train.txt").read_text(encoding="utf-8")
    assert not re.search(r"^torch", serving, re.M)
    assert re.search(r"^torch==", train, re.M) and "-r requirements.txt" in train
