"""Regenerate the gRPC code into a temporary copy and fail if it differs from the commit."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GEN = Path("libs/engram-core/src/engram_core/grpc_gen")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "repo"
        for part in ("proto", "scripts", "libs/engram-core/src"):
            shutil.copytree(ROOT / part, copy / part)
        subprocess.run([sys.executable, str(copy / "scripts/gen_proto.py")], check=True)
        fresh, committed = copy / GEN, ROOT / GEN
        diffs = _diff(filecmp.dircmp(committed, fresh, ignore=["__pycache__"]))
    if diffs:
        print("generated gRPC code is stale; run `make proto` and commit:", *diffs, sep="\n  ")
        return 1
    print("generated gRPC code matches proto/")
    return 0


def _diff(cmp: filecmp.dircmp[str]) -> list[str]:
    out = [f"{cmp.left}/{n} (only committed)" for n in cmp.left_only]
    out += [f"{cmp.right}/{n} (missing)" for n in cmp.right_only]
    out += [f"{cmp.left}/{n} (differs)" for n in cmp.diff_files]
    # dircmp compares shallowly by stat; compare contents explicitly
    out += [
        f"{cmp.left}/{n} (differs)"
        for n in cmp.same_files
        if Path(cmp.left, n).read_bytes() != Path(cmp.right, n).read_bytes()
    ]
    for sub in cmp.subdirs.values():
        out += _diff(sub)
    return out


if __name__ == "__main__":
    sys.exit(main())
