"""The one Kubernetes client loader: which credentials win, and a client built from a kubeconfig
that really talks to the API it names (a STAND-IN API server: real HTTP, the official client)."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client
from kubernetes.config import ConfigException

from agmarl_common.kube.client import load_api_client, resolve
from agmarl_testing.k8s_api import StandInApiServer, node_json


@pytest.mark.parametrize("setting,environ,home_config,expected", [
    ("/etc/k", {"KUBECONFIG": "/env/k", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, True, ("setting", "/etc/k")),
    ("", {"KUBECONFIG": "/env/k", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, True, ("env", "/env/k")),
    ("", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, True, ("in-cluster", "")),
    ("", {}, True, ("default", "{home}/.kube/config")),
    ("", {}, False, ("none", "")),
])
def test_resolve_order(tmp_path, setting, environ, home_config, expected):
    if home_config:
        (tmp_path / ".kube").mkdir()
        (tmp_path / ".kube" / "config").write_text("{}")
    origin, path = resolve(setting, {**environ, "HOME": str(tmp_path)})
    assert (origin, path) == (expected[0], expected[1].format(home=tmp_path))


def two_context_kubeconfig(path, good_url: str) -> str:
    """current-context points nowhere useful; context "real" points at ``good_url``."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "elsewhere",
        "clusters": [{"name": "real", "cluster": {"server": good_url}},
                     {"name": "elsewhere", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": "u"}},
                     {"name": "elsewhere", "context": {"cluster": "elsewhere", "user": "u"}}]}))
    return str(path)


def test_client_from_the_setting_and_context_reaches_the_api(tmp_path):
    with StandInApiServer() as standin:
        standin.add_node(node_json("n1"))
        env = {"KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)}
        # the setting wins over $KUBECONFIG (which names a file that does not exist)
        path = two_context_kubeconfig(tmp_path / "kubeconfig", standin.url)
        api_client = load_api_client(path, "real", env)
        try:
            assert api_client.configuration.host == standin.url
            names = [n.metadata.name for n in client.CoreV1Api(api_client).list_node(_request_timeout=5).items]
            assert names == ["n1"]
        finally:
            api_client.close()
        # without the context the kubeconfig's current one is used
        other = load_api_client(path, "", env)
        assert other.configuration.host == "http://127.0.0.1:9"
        other.close()
        # $KUBECONFIG when there is no setting
        env["KUBECONFIG"] = str(standin.write_kubeconfig(tmp_path / "env-kubeconfig"))
        from_env = load_api_client("", "", env)
        assert from_env.configuration.host == standin.url
        from_env.close()


def test_no_credentials_anywhere_is_an_error(tmp_path):
    with pytest.raises(ConfigException):
        load_api_client("", "", {"HOME": str(tmp_path)})
