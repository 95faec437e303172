"""Settings precedence: defaults < YAML < environment, with pydantic coercion and nesting."""
import pydantic
import pytest

from agmarl_common.runtime.messages import MAX_MESSAGE_BYTES
from agmarl_common.runtime.settings import CommonSettings, load_settings


class Blend(pydantic.BaseModel):
    weight: float = 0.7
    namespaces: list[str] = []


class InferenceSettings(CommonSettings):
    mode: str = "shadow"
    batch: int = 8
    blend: Blend = Blend()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in ("NATS_URL", "AGMARL_CONFIG", "AGMARL_NATS_URL", "AGMARL_MODE", "AGMARL_BATCH",
                "AGMARL_METRICS_PORT", "AGMARL_BLEND__WEIGHT", "AGMARL_BLEND__NAMESPACES", "AGMARL_TRACE_DIR"):
        monkeypatch.delenv(key, raising=False)


def test_defaults():
    s = load_settings(InferenceSettings)
    assert (s.nats_url, s.cluster, s.metrics_host, s.metrics_port) == ("nats://127.0.0.1:4222", "sim", "127.0.0.1", 0)
    assert s.trace_dir is None and s.max_message_bytes == MAX_MESSAGE_BYTES and s.log_level == "INFO"
    assert s.mode == "shadow" and s.blend.weight == 0.7


def test_yaml_overrides_defaults_and_env_overrides_yaml(tmp_path, monkeypatch):
    cfg = tmp_path / "inference.yaml"
    cfg.write_text("mode: hybrid\nbatch: 16\ncluster: prod\nblend:\n  weight: 0.5\n  namespaces: [a]\n")
    s = load_settings(InferenceSettings, str(cfg))
    assert (s.mode, s.batch, s.cluster, s.blend.weight, s.blend.namespaces) == ("hybrid", 16, "prod", 0.5, ["a"])

    monkeypatch.setenv("AGMARL_MODE", "full")
    monkeypatch.setenv("AGMARL_BATCH", "32")                  # coerced to int
    monkeypatch.setenv("AGMARL_BLEND__WEIGHT", "0.9")         # nested, coerced to float
    monkeypatch.setenv("AGMARL_BLEND__NAMESPACES", '["x", "y"]')  # JSON for a list field
    s = load_settings(InferenceSettings, str(cfg))
    assert (s.mode, s.batch, s.blend.weight, s.blend.namespaces) == ("full", 32, 0.9, ["x", "y"])
    assert s.cluster == "prod"  # untouched by env: the YAML value stays


def test_yaml_path_from_env(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("metrics_port: 9464\n")
    monkeypatch.setenv("AGMARL_CONFIG", str(cfg))
    assert load_settings(CommonSettings).metrics_port == 9464


def test_nats_url_env_below_prefixed(monkeypatch):
    monkeypatch.setenv("NATS_URL", "nats://10.0.0.1:4222")
    assert load_settings(CommonSettings).nats_url == "nats://10.0.0.1:4222"
    monkeypatch.setenv("AGMARL_NATS_URL", "nats://10.0.0.2:4222")
    assert load_settings(CommonSettings).nats_url == "nats://10.0.0.2:4222"


def test_bad_values_fail_loudly(tmp_path, monkeypatch):
    monkeypatch.setenv("AGMARL_METRICS_PORT", "not-a-port")
    with pytest.raises(pydantic.ValidationError):
        load_settings(CommonSettings)
    monkeypatch.delenv("AGMARL_METRICS_PORT")
    cfg = tmp_path / "typo.yaml"
    cfg.write_text("clustr: prod\n")  # a typo in YAML is an error, not silently ignored
    with pytest.raises(pydantic.ValidationError):
        load_settings(CommonSettings, str(cfg))


def test_unrelated_prefixed_env_is_ignored(monkeypatch):
    monkeypatch.setenv("AGMARL_SOMETHING_ELSE", "x")
    assert load_settings(CommonSettings).cluster == "sim"
