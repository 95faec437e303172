"""Only signed models serve (docs/security.md): inference's ModelRegistry on a real nats-server Object Store,
real model files (the shipped model, renamed and signed with a throwaway key) and real ONNX Runtime.

A model with one ONNX byte changed, a manifest edited after signing, an unsigned model and one signed by a
key that is not trusted are refused, on ``model_published`` and on a selection naming them, while the model
that serves keeps serving; a selected local folder outside the allowed directories is refused; versions
that are not one path component never reach the Object Store or the disk.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from pathlib import Path

import pytest

from agmarl_common.runtime import messages as m
from agmarl_common.core.policies.rules import CpuFirstPolicy
from agmarl_common.serving import modelstore, signing
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus
from agmarl_common.runtime.service import ServiceRuntime
from agmarl_inference.models import ModelRegistry
from agmarl_inference.settings import InferenceSettings


def model_files(version: str, keys=None, key_path: Path | None = None) -> dict[str, bytes]:
    """The shipped model's files as version ``version``, signed with ``key_path`` (else ``keys.key``) unless
    both are None."""
    src = modelstore.DEFAULT_MODEL_DIR
    manifest = json.loads((src / modelstore.MANIFEST).read_text())
    manifest["version"] = version
    files = {name: (src / name).read_bytes() for name in manifest["files"]}
    files[modelstore.MANIFEST] = json.dumps(manifest, indent=2).encode()
    key = key_path or (keys.key if keys is not None else None)
    if key is not None:
        files[modelstore.SIGNATURE_FILE] = signing.sign(files[modelstore.MANIFEST], signing.load_private_key(key))
    return files


def flip_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


class Rig:
    """A ModelRegistry in a ServiceRuntime on a real nats-server; what it installs and the SelectionRefused
    events it sends are recorded."""

    def __init__(self, nats_url: str, **settings):
        self.settings = InferenceSettings(nats_url=nats_url, cluster=f"sig-{uuid.uuid4().hex[:6]}", **settings)
        self.rt = ServiceRuntime("inference", self.settings)
        self.installed: list[str] = []
        self.policies: list[object] = []  # the policy objects installed, in order
        self.refusals: list[m.SelectionRefused] = []
        self.models = ModelRegistry(self.rt, self.install)

    def install(self, policy, version: str, sel) -> None:
        self.installed.append(version)
        self.policies.append(policy)

    async def __aenter__(self) -> "Rig":
        await self.rt.start()
        self.bus = await Bus.connect(self.settings.nats_url, name="test-model-signatures")

        async def on_refused(msg):
            self.refusals.append(m.decode(m.SelectionRefused, msg.data))
        await self.bus.subscribe(subjects.selection_refused(), on_refused)
        await self.bus.flush()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.bus.close()
        await self.rt.shutdown()

    async def store(self, version: str, files: dict[str, bytes]) -> m.ModelPublished:
        for name, data in files.items():
            await self.bus.object_put(subjects.MODELS_BUCKET, f"{version}/{name}", data)
        manifest = json.loads(files[modelstore.MANIFEST])
        return m.ModelPublished(version=version, sha256=manifest["files"][modelstore.ACTOR_FILE],
                                object_name=f"{version}/{modelstore.ACTOR_FILE}", manifest=manifest, time=time.time())

    def failures(self, reason: str) -> float:
        return self.rt.registry.get_sample_value("agmarl_model_load_failures_total", {"reason": reason}) or 0.0

    async def select(self, policy: str) -> None:
        """Claim a selection and wait until the registry has installed it or refused it."""
        installed, refused = len(self.installed), len(self.refusals)
        assert self.models.claim(m.PolicySelection(policy=policy, reason="test", time=time.time()))
        deadline = time.monotonic() + 30
        while len(self.installed) == installed and len(self.refusals) == refused and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


async def test_tampered_unsigned_and_untrusted_models_are_refused_while_the_old_one_serves(
        nats_url, model_keys, tmp_path):
    tag = uuid.uuid4().hex[:8]
    stranger_key, _ = signing.generate_keypair(tmp_path / "stranger", "stranger")  # a key nobody trusts
    async with Rig(nats_url, trusted_model_keys=model_keys.trusted) as rig:
        good = f"good-{tag}"
        assert await rig.models.on_published(await rig.store(good, model_files(good, model_keys))) is not None
        await rig.select(f"model:{good}")
        assert rig.installed == [good]

        byte = model_files(f"byte-{tag}", model_keys)
        byte[modelstore.ACTOR_FILE] = flip_last_byte(byte[modelstore.ACTOR_FILE])
        edited = model_files(f"edited-{tag}", model_keys)  # the actor changed AND its digest in the manifest
        edited[modelstore.ACTOR_FILE] = flip_last_byte(edited[modelstore.ACTOR_FILE])
        manifest = json.loads(edited[modelstore.MANIFEST])
        manifest["files"][modelstore.ACTOR_FILE] = modelstore.sha256(edited[modelstore.ACTOR_FILE])
        edited[modelstore.MANIFEST] = json.dumps(manifest, indent=2).encode()
        cases = {"digest": byte, "signature": edited, "unsigned": model_files(f"unsigned-{tag}"),
                 "untrusted": model_files(f"stranger-{tag}", key_path=stranger_key)}
        for reason, files in cases.items():
            version = json.loads(files[modelstore.MANIFEST])["version"]
            published = await rig.store(version, files)
            assert await rig.models.on_published(published) is None, reason
            assert rig.failures(reason) == 1.0, (reason, rig.models.last_error)
            assert version not in rig.models.models and rig.models.latest.version == good
            await rig.select(f"model:{version}")  # the selection path: fetched again, refused again
            assert rig.installed == [good], reason
            assert rig.refusals[-1].policy == f"model:{version}" and rig.refusals[-1].reason == reason
            assert rig.failures(reason) == 2.0


async def test_a_selection_wrapping_a_stored_model_serves_that_model_inside_its_rules(nats_url, model_keys):
    # cpu-first:model:<version>: the version is fetched from the Object Store and verified like model:<version>,
    # and what serves is the placement rule around it; a wrapped unsigned model is refused like a bare one
    tag = uuid.uuid4().hex[:8]
    async with Rig(nats_url, trusted_model_keys=model_keys.trusted) as rig:
        good, unsigned = f"good-{tag}", f"unsigned-{tag}"
        await rig.store(good, model_files(good, model_keys))
        await rig.store(unsigned, model_files(unsigned))
        await rig.select(f"cpu-first:model:{good}")
        assert rig.installed == [good]
        served = rig.policies[-1]
        assert isinstance(served, CpuFirstPolicy) and served.name == f"cpu-first:model:{good}"
        assert served.policy.version == good
        await rig.select(f"cpu-first:model:{unsigned}")
        assert rig.installed == [good] and rig.refusals[-1].policy == f"cpu-first:model:{unsigned}"
        assert rig.refusals[-1].reason == "unsigned"


async def test_at_start_the_default_model_serves_inside_the_initial_selections_rules(nats_url):
    async with Rig(nats_url) as rig:
        await rig.models.start("cpu-first:model:default")
        served = rig.policies[-1]
        assert isinstance(served, CpuFirstPolicy) and served.policy is rig.models.default
        assert served.name == f"cpu-first:model:{rig.models.default.version}"
    async with Rig(nats_url) as rig:  # a baseline as the initial selection: the bare model until it arrives
        await rig.models.start("kube-resources")
        assert rig.policies[-1] is rig.models.default


async def test_local_model_folders_only_from_allowed_directories(nats_url, model_keys, tmp_path):
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    for root in (allowed, outside):
        d = root / "m1"
        d.mkdir(parents=True)
        for name, data in model_files(f"{root.name}-m1", model_keys).items():
            (d / name).write_bytes(data)
    (allowed / "escape").symlink_to(outside / "m1")  # a link out of the allowed directory does not count
    async with Rig(nats_url, trusted_model_keys=model_keys.trusted, allowed_model_dirs=str(allowed)) as rig:
        await rig.select(f"model:{allowed / 'm1'}")
        assert rig.installed == ["allowed-m1"]
        for ref in (outside / "m1", allowed / "escape", allowed / ".." / "outside" / "m1"):
            await rig.select(f"model:{ref}")
            assert rig.installed == ["allowed-m1"], ref
            assert rig.refusals[-1].reason == "not_allowed" and "allowed model director" in rig.refusals[-1].detail
        assert rig.failures("not_allowed") == 3.0
        # the shipped model is outside this allow-list too (the setting replaces the default)
        await rig.select("model:default")
        assert rig.installed == ["allowed-m1"] and rig.refusals[-1].reason == "not_allowed"


async def test_the_shipped_models_verify_against_the_shipped_release_key():
    trust = modelstore.ModelTrust.load()  # the defaults: models/trusted, models/ and .state/models
    for d in sorted(p for p in modelstore.MODELS_DIR.iterdir() if (p / modelstore.MANIFEST).is_file()):
        artifact = modelstore.load_dir(d, trust=trust)
        assert modelstore.SIGNATURE_FILE in artifact.files, d


@pytest.mark.parametrize("version", ["../escape", "a/b", "..", ".hidden", "x" * 129, "a\nb"])
async def test_versions_that_are_not_one_path_component_are_refused(nats_url, model_keys, tmp_path, version):
    async with Rig(nats_url, trusted_model_keys=model_keys.trusted) as rig:
        published = m.ModelPublished(version=version, sha256="0" * 64, object_name="x", manifest={}, time=time.time())
        assert await rig.models.on_published(published) is None
        assert rig.failures("invalid") == 1.0
    artifact = modelstore.ModelArtifact(version, {}, {}, "test")
    with pytest.raises(modelstore.ModelIntegrityError) as err:
        modelstore.save(artifact, tmp_path / "cache")
    assert err.value.reason == "invalid" and not (tmp_path / "cache").exists() and not (tmp_path / "escape").exists()
    files = model_files("ok", model_keys)
    manifest = json.loads(files[modelstore.MANIFEST])
    manifest["version"] = version
    files[modelstore.MANIFEST] = json.dumps(manifest).encode()
    files[modelstore.SIGNATURE_FILE] = signing.sign(files[modelstore.MANIFEST], signing.load_private_key(model_keys.key))
    with pytest.raises(modelstore.ModelIntegrityError, match="not a safe path component"):
        modelstore.load_bytes(files, "test", trust=model_keys.trust())


def test_a_signed_folder_copied_elsewhere_keeps_verifying_and_a_renamed_one_does_not(model_keys, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(modelstore.DEFAULT_MODEL_DIR, d)
    trust = model_keys.trust(allowed_dirs=str(tmp_path))
    assert modelstore.load_dir(d, trust=trust).version == json.loads((d / "manifest.json").read_text())["version"]
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["version"] = "renamed"
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(modelstore.ModelIntegrityError) as err:
        modelstore.load_dir(d, trust=trust)
    assert err.value.reason == "signature"
    model_keys.sign(d)
    assert modelstore.load_dir(d, trust=trust).version == "renamed"
