"""Helpers for the file-mirror, edits and rebuild tests: real retrieval in-process,
workers in-process, reading events back from the stream, the mirror's git log."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import nats

from engram_core.events import STREAM_NAME, Event
from engram_retrieval.embedder import Embedder
from engram_retrieval.server import build_server
from engram_retrieval.settings import RetrievalSettings
from engram_workers.runtime import Worker, WorkerSettings, WorkerSpec

E = TypeVar("E", bound=Event)


async def eventually(
    check: Callable[[], Any], timeout_s: float = 10.0, what: str = "", interval_s: float = 0.05
) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or check}")
        await asyncio.sleep(interval_s)


@asynccontextmanager
async def retrieval_server(data_dir: Path, embedder: Embedder) -> AsyncIterator[str]:
    """The real retrieval service on a free port; yields its address."""
    settings = RetrievalSettings(data_dir=data_dir, retrieval_listen="127.0.0.1:0")
    running = await build_server(settings, embedder=embedder)
    try:
        yield running.address
    finally:
        await running.stop(grace_s=0)


@asynccontextmanager
async def running_worker(spec: WorkerSpec[Any], settings: WorkerSettings) -> AsyncIterator[Worker]:
    """One worker in-process, consuming until the block ends."""
    worker: Worker[Any] = Worker(spec, settings)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.serve(stop))
    await eventually(lambda: worker.consuming or task.done(), what=f"{spec.name} start")
    if task.done():
        task.result()  # re-raise the start-up failure
    try:
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


async def stream_events(nats_url: str, model: type[E]) -> list[E]:
    """Every event of this type on the stream so far (read without a consumer)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(STREAM_NAME, subjects_filter=model.subject)
        total = sum((info.state.subjects or {}).values())
        if not total:
            return []
        sub = await js.subscribe(model.subject, stream=STREAM_NAME, ordered_consumer=True)
        events = []
        try:
            for _ in range(total):
                message = await sub.next_msg(timeout=5)
                events.append(model.model_validate_json(message.data))
        finally:
            await sub.unsubscribe()
        return events
    finally:
        await nc.close()


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
    return subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
