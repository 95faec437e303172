"""Model signatures (``signing``) and path components (``pathnames``) on real keys and files."""

from __future__ import annotations

import json
import os
import stat

import pytest

from agmarl_common.serving import signing
from agmarl_common.core.pathnames import check_path_component, is_path_component

MANIFEST = json.dumps({"version": "v1", "files": {"actor.onnx": "ab" * 32}}).encode()


@pytest.fixture
def pair(tmp_path):
    return signing.generate_keypair(tmp_path / "keys", "k")


def test_a_generated_key_is_private_to_its_owner_and_never_overwritten(pair, tmp_path):
    key, pub = pair
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert pub.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    with pytest.raises(FileExistsError):
        signing.generate_keypair(tmp_path / "keys", "k")


@pytest.mark.parametrize("change, reason", [
    (lambda manifest, sig: (manifest, sig), None),
    (lambda manifest, sig: (manifest.replace(b"v1", b"v2"), sig), "signature"),  # manifest edited after signing
    (lambda manifest, sig: (manifest, None), "unsigned"),
    (lambda manifest, sig: (manifest, b"not json"), "signature"),
    (lambda manifest, sig: (manifest, sig.replace(b"ed25519", b"rsa")), "signature"),
    (lambda manifest, sig: (manifest, json.dumps({**json.loads(sig), "key_id": "0" * 16}).encode()), "untrusted"),
])
def test_verify(pair, change, reason):
    key, pub = pair
    keys = signing.load_public_keys([pub])
    manifest, sig = change(MANIFEST, signing.sign(MANIFEST, signing.load_private_key(key)))
    if reason is None:
        assert signing.verify(manifest, sig, keys, "m") == signing.key_id(signing.load_public_key(pub))
        return
    with pytest.raises(signing.SignatureError) as err:
        signing.verify(manifest, sig, keys, "m")
    assert err.value.reason == reason


def test_a_signature_by_another_key_is_untrusted(pair, tmp_path):
    _, pub = pair
    other, _ = signing.generate_keypair(tmp_path / "other", "o")
    with pytest.raises(signing.SignatureError, match="not trusted") as err:
        signing.verify(MANIFEST, signing.sign(MANIFEST, signing.load_private_key(other)),
                       signing.load_public_keys([pub]), "m")
    assert err.value.reason == "untrusted"


def test_trusted_keys_from_files_and_directories(pair, tmp_path):
    _, pub = pair
    _, pub2 = signing.generate_keypair(tmp_path / "more", "two")
    (tmp_path / "more" / "README").write_text("not a key")  # only *.pub of a directory are read
    keys = signing.load_public_keys([pub, tmp_path / "more"])
    assert len(keys) == 2
    with pytest.raises(ValueError, match="neither a key file nor a directory"):
        signing.load_public_keys([tmp_path / "typo.pub"])
    with pytest.raises(ValueError, match="not an Ed25519|cannot read"):
        signing.load_private_key(pub)


@pytest.mark.parametrize("name, ok", [
    ("default-51c56c260d52", True), ("ft-1.2_a", True), ("a" * 128, True), ("0abc", True),
    ("a" * 129, False), ("", False), ("..", False), ("../x", False), ("a/b", False), ("/abs", False),
    (".hidden", False), ("-dash", False), ("a..b", False), ("a\nb", False), ("a b", False), ("é", False),
    (None, False), (3, False),
])
def test_path_components(name, ok):
    assert is_path_component(name) is ok
    if ok:
        assert check_path_component(name, "x") == name
    else:
        with pytest.raises(ValueError, match="not a safe path component"):
            check_path_component(name, "x")
