"""Model artifacts: a model folder (or its files as bytes) checked against its manifest before use.

A model is the folder the trainer writes (``encoder.onnx``, ``actor.onnx``, ``manifest.json`` and
whatever else ``manifest["files"]`` lists, with the sha256 of each) and ``manifest.sig``, the trainer's
Ed25519 signature over ``manifest.json`` (``signing``). Nothing is served unless the signature verifies
against a trusted public key (``ModelTrust``) and every listed file is present and its digest matches: an
unsigned model, a key that is not trusted, a manifest changed after signing or a digest mismatch is a
``ModelIntegrityError`` (reason unsigned, untrusted, signature, digest) naming what failed, never a
silently different model. A local folder is loaded only from an allowed directory (``ModelTrust.allowed_dirs``,
by default ``<repo>/models`` and the model cache ``<repo>/.state/models``; reason ``not_allowed``).
Versions and manifest file names are single path components (``pathnames``; reason ``invalid``).

References (``model:<ref>`` policies): ``default`` -> ``<repo>/models/default``; a path to a model
folder; a version name -> ``<repo>/.state/models/<version>`` or ``<repo>/models/<version>`` when there,
else the Object Store bucket ``subjects.MODELS_BUCKET`` (files stored as ``<version>/<file>``, what the
trainer's ``publish_model`` writes) through ``fetch_version`` (async, a ``Bus``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from agmarl_common.serving import signing
from agmarl_common.runtime import subjects
from agmarl_common.core.pathnames import is_path_component

REPO_ROOT = Path(__file__).resolve().parents[4]


def _models_dir() -> Path:
    """``<repo>/models`` in a source checkout; from an installed wheel, the same folders, shipped as the
    package data of ``agmarl_models`` (setup.py)."""
    spec = None if (REPO_ROOT / "pyproject.toml").is_file() else importlib.util.find_spec("agmarl_models")
    if spec is None or not spec.submodule_search_locations:
        return REPO_ROOT / "models"
    return Path(next(iter(spec.submodule_search_locations)))


MODELS_DIR = _models_dir()
DEFAULT_MODEL_DIR = MODELS_DIR / "default"
CACHE_DIR = REPO_ROOT / ".state" / "models"  # ignored by git
MANIFEST = "manifest.json"
ENCODER_FILE, ACTOR_FILE = "encoder.onnx", "actor.onnx"
REQUIRED_FILES = (ENCODER_FILE, ACTOR_FILE)
SIGNATURE_FILE = signing.SIGNATURE_FILE
TRUSTED_KEYS_DIR = MODELS_DIR / "trusted"  # the project's release public key(s), shipped
# the settings (inference, adaptive-engine, trainer) and, for ``trust_from_environment``, the variables
TRUSTED_KEYS_ENV, ALLOWED_DIRS_ENV = "AGMARL_TRUSTED_MODEL_KEYS", "AGMARL_ALLOWED_MODEL_DIRS"


class ModelIntegrityError(ValueError):
    """A model that must not be served; ``reason`` is a short metric label (digest, missing, invalid)."""

    def __init__(self, message: str, reason: str = "invalid"):
        super().__init__(message)
        self.reason = reason


class ModelNotFoundError(KeyError):
    """No model under that reference (KeyError: the policy registry's 'unknown name')."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "model not found"


def _paths(value: str | Sequence[str | Path]) -> list[Path]:
    """Paths from a setting: a list, or one string of paths separated by ``os.pathsep`` (``:``)."""
    items = value.split(os.pathsep) if isinstance(value, str) else list(value)
    return [Path(str(p)).expanduser() for p in items if str(p).strip()]


@dataclass(frozen=True)
class ModelTrust:
    """Which models may be loaded: signed by one of ``keys`` (key id -> Ed25519 public key), and, for a
    folder on this machine, inside one of ``allowed_dirs`` (resolved, symlinks followed)."""

    keys: Mapping[str, Ed25519PublicKey]
    allowed_dirs: tuple[Path, ...]

    @classmethod
    def load(cls, trusted_keys: str | Sequence[str | Path] = "", allowed_dirs: str | Sequence[str | Path] = "",
             own_dirs: Sequence[str | Path] = ()) -> "ModelTrust":
        """From the settings: ``trusted_keys`` key files or directories of ``*.pub`` ("" = the shipped
        ``models/trusted``), ``allowed_dirs`` ("" = ``models/`` and the cache ``.state/models``), plus
        ``own_dirs`` (a service's own model cache). A named key path that does not exist is a ValueError."""
        keys = signing.load_public_keys(_paths(trusted_keys) or [TRUSTED_KEYS_DIR])
        dirs = _paths(allowed_dirs) or [MODELS_DIR, CACHE_DIR]
        return cls(keys, tuple(Path(d).resolve() for d in (*dirs, *own_dirs)))

    def allows(self, path: str | Path) -> bool:
        p = Path(path).resolve()
        return any(p == d or p.is_relative_to(d) for d in self.allowed_dirs)

    def check_dir(self, path: str | Path) -> None:
        if not self.allows(path):
            allowed = ", ".join(str(d) for d in self.allowed_dirs) or "none"
            raise ModelIntegrityError(f"{path}: not inside an allowed model directory ({allowed}; setting "
                                      f"{ALLOWED_DIRS_ENV}): refusing to load a model from there", "not_allowed")


def trust_from_environment(environ: Mapping[str, str] | None = None) -> ModelTrust:
    """The trust of a process without a settings object (the policy registry's ``model:`` names, the
    CLI): ``AGMARL_TRUSTED_MODEL_KEYS`` and ``AGMARL_ALLOWED_MODEL_DIRS``, the variables the services'
    settings read, else the defaults."""
    env = os.environ if environ is None else environ
    return ModelTrust.load(env.get(TRUSTED_KEYS_ENV, ""), env.get(ALLOWED_DIRS_ENV, ""))


@dataclass(frozen=True)
class ModelArtifact:
    """A verified model: its version, manifest and the bytes of every file (manifest.json included)."""

    version: str
    manifest: dict[str, Any]
    files: Mapping[str, bytes]
    source: str  # where it came from (folder, object store, bytes)

    @property
    def layers(self) -> int:
        """Encoder layers (hops a node row reaches), from the training config; 2 when absent."""
        net = self.manifest.get("training", {}).get("config", {}).get("net", {})
        return int(net.get("encoder_layers", 2))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_manifest(raw: bytes, source: str) -> dict[str, Any]:
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ModelIntegrityError(f"{source}: manifest.json is not valid JSON ({err})", "invalid") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ModelIntegrityError(f"{source}: manifest.json has no 'files' map of name -> sha256", "invalid")
    bad = [name for name in files if not is_path_component(name) or name in (MANIFEST, SIGNATURE_FILE)]
    if bad:
        raise ModelIntegrityError(f"{source}: manifest.json lists file names that are not plain file names: "
                                  f"{', '.join(repr(b)[:80] for b in bad[:3])}", "invalid")
    version = manifest.get("version")
    if version is not None and not is_path_component(str(version)):
        raise ModelIntegrityError(f"{source}: manifest.json version {str(version)[:80]!r} is not a safe path "
                                  "component (1-128 of A-Z a-z 0-9 . _ -, no '..')", "invalid")
    missing = [f for f in REQUIRED_FILES if f not in files]
    if missing:
        raise ModelIntegrityError(f"{source}: manifest.json lists no {', '.join(missing)}", "invalid")
    return manifest


def verify_files(files: Mapping[str, bytes], manifest: Mapping[str, Any], source: str) -> None:
    """Every file of ``manifest["files"]`` present with that sha256, else ``ModelIntegrityError``."""
    for name, want in sorted(manifest["files"].items()):
        if name not in files:
            raise ModelIntegrityError(f"{source}: file {name} listed in manifest.json is missing", "missing")
        got = sha256(files[name])
        if got != want:
            raise ModelIntegrityError(f"{source}: sha256 of {name} is {got}, manifest.json says {want}: "
                                      "refusing to load this model", "digest")


def verify_signature(files: Mapping[str, bytes], trust: ModelTrust, source: str) -> str:
    """The trusted key id whose signature over ``manifest.json`` holds, else ``ModelIntegrityError``."""
    try:
        return signing.verify(files[MANIFEST], files.get(SIGNATURE_FILE), trust.keys, source)
    except signing.SignatureError as err:
        raise ModelIntegrityError(str(err), err.reason) from None


def load_bytes(files: Mapping[str, bytes], source: str = "bytes", expected_actor_sha256: str = "",
               expected_files: Mapping[str, str] | None = None, *, trust: ModelTrust) -> ModelArtifact:
    """A verified artifact from file bytes (``manifest.json`` and ``manifest.sig`` among them): signed by a
    key of ``trust``, every digest right. ``expected_*`` (from a ModelPublished event) must agree with the
    manifest too."""
    if MANIFEST not in files:
        raise ModelIntegrityError(f"{source}: no manifest.json", "missing")
    manifest = parse_manifest(files[MANIFEST], source)
    verify_signature(files, trust, source)
    if expected_files is not None and dict(expected_files) != dict(manifest["files"]):
        raise ModelIntegrityError(f"{source}: manifest.json digests differ from the published event's", "digest")
    if expected_actor_sha256 and manifest["files"][ACTOR_FILE] != expected_actor_sha256:
        raise ModelIntegrityError(f"{source}: actor.onnx sha256 in manifest.json is {manifest['files'][ACTOR_FILE]}, "
                                  f"the published event says {expected_actor_sha256}", "digest")
    verify_files(files, manifest, source)
    keep = {name: files[name] for name in (*manifest["files"], MANIFEST, SIGNATURE_FILE)}
    version = str(manifest.get("version") or sha256(files[ACTOR_FILE])[:12])
    return ModelArtifact(version, manifest, keep, source)


def load_dir(path: str | Path, *, trust: ModelTrust) -> ModelArtifact:
    """A verified artifact from a model folder inside ``trust.allowed_dirs`` (only the files its manifest
    lists are read)."""
    d = Path(path)
    if not (d / MANIFEST).is_file():
        raise ModelNotFoundError(f"no model in {d}: {MANIFEST} not found")
    trust.check_dir(d)
    raw = (d / MANIFEST).read_bytes()
    manifest = parse_manifest(raw, str(d))
    files = {MANIFEST: raw}
    if (d / SIGNATURE_FILE).is_file():
        files[SIGNATURE_FILE] = (d / SIGNATURE_FILE).read_bytes()
    for name in manifest["files"]:
        f = d / Path(name).name
        if f.is_file():
            files[name] = f.read_bytes()
    return load_bytes(files, str(d), trust=trust)


def local_dir(ref: str) -> Path | None:
    """The folder a reference names on this machine, or None (then it may be an Object Store version)."""
    if ref in ("", "default"):
        return DEFAULT_MODEL_DIR if (DEFAULT_MODEL_DIR / MANIFEST).is_file() else None
    p = Path(ref).expanduser()
    if (p / MANIFEST).is_file():
        return p
    if not is_path_component(ref):
        return None
    for root in (CACHE_DIR, MODELS_DIR):
        if (root / ref / MANIFEST).is_file():
            return root / ref
    return None


def load_local(ref: str, *, trust: ModelTrust) -> ModelArtifact:
    """``default``, a folder (inside ``trust.allowed_dirs``), or a version already on disk, verified;
    ``ModelNotFoundError`` when there is none."""
    d = local_dir(ref)
    if d is None:
        where = DEFAULT_MODEL_DIR if ref in ("", "default") else ref
        raise ModelNotFoundError(f"model {ref!r} not found ({where}: no manifest.json; a version published to the "
                                 f"Object Store is fetched by the inference service)")
    return load_dir(d, trust=trust)


async def in_object_store(bus, version: str, bucket: str = subjects.MODELS_BUCKET) -> bool:
    """``<version>/manifest.json`` exists in the models bucket (False for an empty or path-like version)."""
    if not is_path_component(version):
        return False
    return await bus.object_get(bucket, f"{version}/{MANIFEST}") is not None


async def fetch_files(bus, version: str, bucket: str = subjects.MODELS_BUCKET) -> dict[str, bytes]:
    """The stored files of ``<version>/`` that its manifest lists, manifest.json included (unverified:
    ``load_bytes`` checks them, with ``manifest.sig``); ``ModelNotFoundError`` when the version has no manifest,
    ``ModelIntegrityError`` (invalid) when it is not a single path component."""
    if not is_path_component(version):
        raise ModelIntegrityError(f"model version {version[:80]!r} is not a safe path component "
                                  "(1-128 of A-Z a-z 0-9 . _ -, no '..')", "invalid")
    raw = await bus.object_get(bucket, f"{version}/{MANIFEST}")
    if raw is None:
        raise ModelNotFoundError(f"object store {bucket}/{version}: no {MANIFEST}")
    manifest = parse_manifest(raw, f"object store {bucket}/{version}")
    files = {MANIFEST: raw}
    for name in (*manifest["files"], SIGNATURE_FILE):
        data = await bus.object_get(bucket, f"{version}/{name}")
        if data is not None:
            files[name] = data
    return files


async def fetch_version(bus, version: str, bucket: str = subjects.MODELS_BUCKET, expected_actor_sha256: str = "",
                        expected_files: Mapping[str, str] | None = None, *, trust: ModelTrust) -> ModelArtifact:
    """Fetch ``<version>/*`` from the Object Store and verify it (``ModelNotFoundError`` when absent)."""
    files = await fetch_files(bus, version, bucket)
    return load_bytes(files, f"object store {bucket}/{version}", expected_actor_sha256, expected_files, trust=trust)


def save(artifact: ModelArtifact, root: str | Path = CACHE_DIR) -> Path:
    """Write a verified artifact to ``<root>/<version>/`` (so ``model:<version>`` resolves locally); a
    version that is not one path component is a ``ModelIntegrityError`` and nothing is written."""
    if not is_path_component(artifact.version):
        raise ModelIntegrityError(f"model version {artifact.version[:80]!r} is not a safe path component", "invalid")
    d = Path(root) / artifact.version
    d.mkdir(parents=True, exist_ok=True)
    for name, data in artifact.files.items():
        (d / Path(name).name).write_bytes(data)
    return d
