"""Which extender verbs the shipped kube-scheduler configurations enable, and why (docs/deploy.md,
"Which extender verbs"): prioritize only. kube-scheduler runs the hard filter itself before it calls
an extender, so the extender's filter could only repeat it (one more round trip per pod); the default
binder binds and the decision log learns the node from the watch, so no bindVerb either.
`agmarl bench extender` drives exactly the verbs these files enable."""

from __future__ import annotations

import pytest

from agmarl_cli.extender_bench import SHIPPED_CONFIG, config_verbs
from tests.deploy.kustomize import EXTENDER_OVERLAYS, scheduler_config


@pytest.mark.parametrize("overlay", EXTENDER_OVERLAYS)
def test_the_extender_is_called_to_prioritize_only(overlay: str):
    (ext,) = scheduler_config(overlay)["extenders"]
    assert ext["prioritizeVerb"] == "prioritize"
    assert "filterVerb" not in ext and "bindVerb" not in ext and "preemptVerb" not in ext
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is True


def test_the_bench_drives_the_verbs_of_the_shipped_configuration():
    assert SHIPPED_CONFIG.is_file() and SHIPPED_CONFIG.parent.name == "full"
    assert config_verbs(SHIPPED_CONFIG) == (["prioritize"], True)


def test_config_verbs_in_kube_schedulers_call_order(tmp_path):
    path = tmp_path / "sched.yaml"
    path.write_text("extenders:\n- urlPrefix: http://x\n  bindVerb: bind\n  prioritizeVerb: prioritize\n"
                    "  filterVerb: filter\n")
    assert config_verbs(path) == (["filter", "prioritize", "bind"], False)
