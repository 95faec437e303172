"""`agmarl keys` and the model keys of a local run, on real files: generate, sign, verify."""

from __future__ import annotations

import json
import os
import shutil

from agmarl_cli.keys import local_model_keys
from agmarl_cli.main import main
from agmarl_common.serving import modelstore


def test_generate_sign_and_verify_a_model_folder(tmp_path, capsys, monkeypatch):
    assert main(["keys", "generate", "--out", str(tmp_path / "keys"), "--name", "ops"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["private_key"].endswith("ops.key") and made["public_key"].endswith("ops.pub")
    assert main(["keys", "generate", "--out", str(tmp_path / "keys"), "--name", "ops"]) == 1  # never overwrites

    d = tmp_path / "models" / "m"
    shutil.copytree(modelstore.DEFAULT_MODEL_DIR, d)
    (d / modelstore.SIGNATURE_FILE).unlink()
    monkeypatch.setenv(modelstore.ALLOWED_DIRS_ENV, str(tmp_path / "models"))
    capsys.readouterr()
    assert main(["keys", "verify", str(d), "--trusted", made["public_key"]]) == 1
    assert json.loads(capsys.readouterr().out)["reason"] == "unsigned"
    assert main(["keys", "sign", str(d), "--key", made["private_key"]]) == 0
    assert json.loads(capsys.readouterr().out)["key_id"] == made["key_id"]
    assert main(["keys", "verify", str(d), "--trusted", made["public_key"]]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["keys", "verify", str(d)]) == 1  # the release key did not sign it
    assert json.loads(capsys.readouterr().out)["reason"] == "untrusted"

    # a folder whose files do not match its manifest is never signed
    (d / modelstore.ACTOR_FILE).write_bytes(b"tampered")
    before = (d / modelstore.SIGNATURE_FILE).read_bytes()
    (d / modelstore.MANIFEST).write_text((d / modelstore.MANIFEST).read_text() + "\n")  # a new manifest to sign
    assert main(["keys", "sign", str(d), "--key", made["private_key"]]) == 1
    assert "sha256 of actor.onnx" in capsys.readouterr().err
    assert (d / modelstore.SIGNATURE_FILE).read_bytes() == before


def test_a_local_run_signs_with_its_own_key_and_trusts_it_next_to_the_release_key(tmp_path):
    env = local_model_keys(tmp_path, environ={})
    key = tmp_path / "keys" / "model-signing.key"
    assert env["AGMARL_MODEL_SIGNING_KEY"] == str(key) and oct(key.stat().st_mode & 0o777) == "0o600"
    trusted = env[modelstore.TRUSTED_KEYS_ENV].split(os.pathsep)
    assert trusted == [str(modelstore.TRUSTED_KEYS_DIR), str(tmp_path / "keys" / "model-signing.pub")]
    assert local_model_keys(tmp_path, environ={}) == env  # made once, reused
    assert local_model_keys(tmp_path, environ={"AGMARL_MODEL_SIGNING_KEY": "/k", modelstore.TRUSTED_KEYS_ENV: "/p"}) == {}
