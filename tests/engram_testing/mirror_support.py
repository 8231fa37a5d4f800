"""Readers of the file mirror's git repository, for the mirror and edits tests
(the workers and the stream are in :mod:`engram_testing.worker_stack`)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_log(root: Path) -> list[str]:
    """Commit subjects of the mirror's repository, newest first."""
    out = subprocess.run(
        ["git", "-C", str(root), "log", "--format=%s"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.splitlines()


def git_status(root: Path) -> str:
    """``git status --porcelain``: empty when everything is committed."""
    return subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
