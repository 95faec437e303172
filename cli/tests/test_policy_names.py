"""`agmarl policy set`: which names are looked up in the Object Store (a model version not on disk), wrapped in
placement rules or not."""

from agmarl_cli.policy import stored_version, unknown_policy


def test_a_model_version_not_on_disk_is_looked_up_in_the_object_store_wrapped_or_not():
    assert stored_version("model:ft-1") == "ft-1"
    assert stored_version("cpu-first:model:ft-1") == "ft-1"
    assert stored_version("capped:cpu-first:model:ft-1") == "ft-1"
    for on_disk_or_baseline in ("model:default", "cpu-first:model:default", "model:latest", "cpu-first:fgd",
                                "kube-default", "model:../x"):
        assert stored_version(on_disk_or_baseline) is None, on_disk_or_baseline
    assert unknown_policy("cpu-first:model:default") is None
    assert "at most once" in unknown_policy("cpu-first:cpu-first:model:default")
