"""Model signatures: Ed25519 over a model's ``manifest.json``, verified against trusted public keys.

A signed model folder holds ``manifest.sig`` next to ``manifest.json``::

    {"alg": "ed25519", "key_id": "<16 hex>", "signature": "<base64 of 64 bytes>"}

The signature is over the exact bytes of ``manifest.json``, which lists the sha256 of every model file,
so it covers every file: a changed byte of an ONNX file fails its digest, a changed manifest fails the
signature. ``key_id`` is the first 16 hex digits of the sha256 of the raw 32-byte public key (a hint
naming the key; the signature itself decides).

Keys are PEM files: the private key PKCS#8 (written 0600, never committed), the public key
SubjectPublicKeyInfo (``<name>.pub``). docs/security.md says who signs and how keys are rotated.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIGNATURE_FILE = "manifest.sig"
ALG = "ed25519"
PUBLIC_SUFFIX = ".pub"


class SignatureError(ValueError):
    """A model signature that does not hold; ``reason``: unsigned, untrusted or signature."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_pem(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def generate_keypair(out_dir: str | Path, name: str = "model-signing") -> tuple[Path, Path]:
    """A new key pair as ``<out_dir>/<name>.key`` (0600) and ``<name>.pub``; an existing file is never
    overwritten (FileExistsError)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key_path, pub_path = out / f"{name}.key", out / f"{name}{PUBLIC_SUFFIX}"
    for p in (key_path, pub_path):
        if p.exists():
            raise FileExistsError(f"{p} exists: not overwriting a key")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    os.chmod(key_path, 0o600)  # whatever the umask
    pub_path.write_bytes(public_pem(private.public_key()))
    return key_path, pub_path


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file (ValueError naming the file otherwise)."""
    p = Path(path)
    try:
        key = serialization.load_pem_private_key(p.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"model signing key {p}: cannot read an unencrypted PEM private key ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"model signing key {p}: not an Ed25519 key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    p = Path(path)
    try:
        key = serialization.load_pem_public_key(p.read_bytes())
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"trusted model key {p}: cannot read a PEM public key ({err})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"trusted model key {p}: not an Ed25519 key")
    return key


def load_public_keys(paths: Iterable[str | Path]) -> dict[str, Ed25519PublicKey]:
    """key id -> public key for every file named, and every ``*.pub`` of every directory named; a named
    file or directory that does not exist is an error (a typo must not silently trust nothing)."""
    keys: dict[str, Ed25519PublicKey] = {}
    for path in paths:
        p = Path(path).expanduser()
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(PUBLIC_SUFFIX))
        elif p.is_file():
            files = [p]
        else:
            raise ValueError(f"trusted model keys: {p} is neither a key file nor a directory")
        for f in files:
            key = load_public_key(f)
            keys[key_id(key)] = key
    return keys


def sign(manifest: bytes, private_key: Ed25519PrivateKey) -> bytes:
    """The ``manifest.sig`` contents for these manifest bytes."""
    body = {"alg": ALG, "key_id": key_id(private_key.public_key()),
            "signature": base64.b64encode(private_key.sign(manifest)).decode()}
    return (json.dumps(body, indent=2) + "\n").encode()


def sign_dir(model_dir: str | Path, private_key: Ed25519PrivateKey) -> Path:
    """Sign ``<model_dir>/manifest.json``: writes ``<model_dir>/manifest.sig``."""
    d = Path(model_dir)
    out = d / SIGNATURE_FILE
    out.write_bytes(sign((d / "manifest.json").read_bytes(), private_key))
    return out


def verify(manifest: bytes, signature: bytes | None, keys: Mapping[str, Ed25519PublicKey], source: str) -> str:
    """The id of the trusted key whose signature over ``manifest`` holds; ``SignatureError`` otherwise."""
    if signature is None:
        raise SignatureError(f"{source}: unsigned ({SIGNATURE_FILE} missing): only models signed by a trusted key "
                             "are loaded", "unsigned")
    try:
        body = json.loads(signature)
        alg, kid, sig = body["alg"], str(body["key_id"]), base64.b64decode(body["signature"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError) as err:
        raise SignatureError(f"{source}: {SIGNATURE_FILE} is not a signature ({type(err).__name__})",
                             "signature") from None
    if alg != ALG:
        raise SignatureError(f"{source}: signature algorithm {str(alg)[:32]!r} is not {ALG}", "signature")
    key = keys.get(kid)
    if key is None:
        known = ", ".join(sorted(keys)) or "none configured"
        raise SignatureError(f"{source}: signed by key {kid[:16]!r}, which is not trusted (trusted keys: {known})",
                             "untrusted")
    try:
        key.verify(sig, manifest)
    except InvalidSignature:
        raise SignatureError(f"{source}: the signature of key {kid} does not verify: manifest.json was changed "
                             "after signing", "signature") from None
    return kid
