"""tools/kube/build_debian.py's checks, without the network: the InRelease's SHA256 list, the index stanzas, a
download whose hash differs from the signed index (refused), the OpenAPI package list as 1.20's Makefile finds it,
and a present build (of any version) left alone. The build itself runs in tests/e2e/test_real_kube.py's fixture."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agmarl_testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
bd = load_script(ROOT / "tools" / "kube" / "build_debian.py", "kube_build_debian")

RELEASE = """Origin: Debian
Suite: stable
MD5Sum:
 0123456789abcdef0123456789abcdef 123 main/source/Sources.xz
SHA256:
 aaaa 10 main/binary-amd64/Packages.xz
 bbbb 20 main/source/Sources.xz
 cccc 30 main/source/Sources.xz.extra
"""


def test_release_sha256_reads_the_sha256_section_only():
    assert bd.release_sha256(RELEASE, "main/source/Sources.xz") == "bbbb"  # not the MD5Sum line, not a prefix
    assert bd.release_sha256(RELEASE, "main/binary-amd64/Packages.xz") == "aaaa"
    with pytest.raises(bd.BuildError, match="no SHA256 for main/i18n"):
        bd.release_sha256(RELEASE, "main/i18n/Translation-en.xz")


def test_stanzas_join_continuation_lines():
    text = ("Package: kubernetes\nVersion: 1.20\nChecksums-Sha256:\n aa 1 a.dsc\n bb 2 a.orig.tar.gz\n\n"
            "Package: other\nVersion: 2\n")
    first, second = bd.stanzas(text)
    assert first["Package"] == "kubernetes" and first["Checksums-Sha256"].splitlines() == ["", "aa 1 a.dsc",
                                                                                          "bb 2 a.orig.tar.gz"]
    assert second == {"Package": "other", "Version": "2"}


def test_a_download_with_another_hash_is_refused(tmp_path):
    f = tmp_path / "x.tar.gz"
    f.write_bytes(b"payload")
    assert bd.check(f, bd.sha256(f), "x") == f
    with pytest.raises(bd.BuildError, match="is not the"):
        bd.check(f, "0" * 64, "x")


def test_openapi_dirs_as_the_makefile_finds_them(tmp_path):
    def go(rel: str, text: str) -> None:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    tagged = "// +k8s:openapi-gen=true\npackage v1\n"
    go("pkg/apis/a/v1/doc.go", tagged)
    go("pkg/apis/b/v1/types.go", "package v1\n// +k8s:deepcopy-gen=true\n")  # a tag, not openapi-gen's
    go("staging/src/k8s.io/api/core/v1/doc.go", tagged)  # named by its vendor path
    go("staging/src/k8s.io/code-generator/x/doc.go", tagged)  # excluded, as the Makefile excludes it
    go("vendor/github.com/x/y/doc.go", tagged)  # third-party vendor: not looked at
    go("_output/z/doc.go", tagged)
    go("pkg/notes/README.md", tagged)  # not Go
    assert bd.openapi_dirs(tmp_path) == ["pkg/apis/a/v1", "vendor/k8s.io/api/core/v1"]


def test_present_binaries_of_any_version_are_left_alone(tmp_path, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in bd.COMMANDS:
        exe = bin_dir / name
        exe.write_text("#!/bin/sh\necho Kubernetes v1.36.2\n")
        exe.chmod(0o755)
    assert bd.main(["--state-dir", str(tmp_path)]) == 0  # no download, no build
    out = capsys.readouterr().out
    assert "Kubernetes v1.36.2; not replaced" in out and "--force rebuilds" in out
    assert not (tmp_path / "build-times.txt").exists() and sorted(os.listdir(bin_dir)) == sorted(bd.COMMANDS)
