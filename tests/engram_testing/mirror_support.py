"""Helpers for the file-mirror, edits and rebuild tests (the rest of the write path's
test support is in :mod:`engram_testing.memory_stack`)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from engram_testing.memory_stack import wait_for
from engram_workers.runtime import Worker, WorkerSettings, WorkerSpec


@asynccontextmanager
async def running_worker(spec: WorkerSpec[Any], settings: WorkerSettings) -> AsyncIterator[Worker]:
    """One worker in-process, consuming until the block ends (then stopped cleanly)."""
    worker: Worker[Any] = Worker(spec, settings)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.serve(stop))
    await wait_for(lambda: worker.consuming or task.done(), what=f"{spec.name} start")
    if task.done():
        task.result()  # re-raise the start-up failure
    try:
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


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
