"""`agmarl keys`: model signing keys (docs/security.md).

- ``generate --out DIR [--name NAME]``: a new Ed25519 key pair, ``NAME.key`` (0600) and ``NAME.pub``;
- ``sign DIR... --key KEY``: check each model folder's digests against its manifest, then write its
  ``manifest.sig`` (the release key signs the shipped models, the trainer's key what it publishes);
- ``verify DIR... [--trusted PATHS]``: load each folder as the services do (signature, digests, allowed
  directory) and say why one is refused.

``local_model_keys`` is what `agmarl up` uses: a signing key for the trainer in its state directory, made
once, and the settings that make the services trust it next to the shipped release key.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from agmarl_common.serving import modelstore, signing

LOCAL_KEY_NAME = "model-signing"


def generate(out: str, name: str) -> int:
    try:
        key, pub = signing.generate_keypair(out, name)
    except FileExistsError as err:
        print(f"agmarl keys: {err}", file=sys.stderr)
        return 1
    kid = signing.key_id(signing.load_public_key(pub))
    print(json.dumps({"private_key": str(key), "public_key": str(pub), "key_id": kid}))
    return 0


def sign(dirs: list[str], key_path: str) -> int:
    key = signing.load_private_key(key_path)
    for d in dirs:
        try:
            raw = (Path(d) / modelstore.MANIFEST).read_bytes()
            manifest = modelstore.parse_manifest(raw, d)
            files = {name: (Path(d) / name).read_bytes() for name in manifest["files"] if (Path(d) / name).is_file()}
            modelstore.verify_files(files, manifest, d)  # never sign a folder whose files do not match
        except (OSError, modelstore.ModelIntegrityError) as err:
            print(f"agmarl keys sign: {d} not signed: {err}", file=sys.stderr)
            return 1
        out = signing.sign_dir(d, key)
        print(json.dumps({"model_dir": d, "version": manifest.get("version"), "signature": str(out),
                          "key_id": signing.key_id(key.public_key())}))
    return 0


def verify(dirs: list[str], trusted: str) -> int:
    trust = modelstore.ModelTrust.load(trusted, os.environ.get(modelstore.ALLOWED_DIRS_ENV, "")) if trusted \
        else modelstore.trust_from_environment()
    rc = 0
    for d in dirs:
        try:
            artifact = modelstore.load_dir(d, trust=trust)
        except (modelstore.ModelIntegrityError, modelstore.ModelNotFoundError) as err:
            print(json.dumps({"model_dir": d, "ok": False, "reason": getattr(err, "reason", "not_found"),
                              "detail": str(err)}))
            rc = 1
            continue
        print(json.dumps({"model_dir": d, "ok": True, "version": artifact.version}))
    return rc


def local_model_keys(root: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The model-key settings of a local run (`agmarl up`): the trainer signs with
    ``<root>/keys/model-signing.key`` (made on the first run), the services trust the shipped keys and its
    public key. Settings already in the environment are left as they are."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    keys = root / "keys"
    key, pub = keys / f"{LOCAL_KEY_NAME}.key", keys / f"{LOCAL_KEY_NAME}{signing.PUBLIC_SUFFIX}"
    if "AGMARL_MODEL_SIGNING_KEY" not in env:
        if not key.is_file():
            signing.generate_keypair(keys, LOCAL_KEY_NAME)
        out["AGMARL_MODEL_SIGNING_KEY"] = str(key)
    if modelstore.TRUSTED_KEYS_ENV not in env:
        out[modelstore.TRUSTED_KEYS_ENV] = os.pathsep.join(str(p) for p in (modelstore.TRUSTED_KEYS_DIR, pub)
                                                           if p.exists())
    return out
