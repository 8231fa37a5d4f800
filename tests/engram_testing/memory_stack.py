"""Pieces of a real write path for tests: the retrieval service in-process, workers
in-process, and readers of what they published on the ENGRAM stream.

The embedder is loaded once per test process and shared by every retrieval server;
each server gets its own store directory, so tests never see each other's memories.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy

from engram_core.events import STREAM_NAME, Event
from engram_core.proto import pb
from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.embedder import Embedder
from engram_retrieval.server import RunningServer, build_server
from engram_retrieval.settings import RetrievalSettings
from engram_workers.runtime import Worker, WorkerSettings, WorkerSpec

E = TypeVar("E", bound=Event)


@functools.cache
def shared_embedder() -> Embedder:
    return Embedder.default(threads=1)


@asynccontextmanager
async def running_retrieval(data_dir: Path) -> AsyncIterator[RunningServer]:
    """The real MemoryService on a free port, storing under ``data_dir``."""
    settings = RetrievalSettings(data_dir=data_dir, retrieval_listen="127.0.0.1:0")
    running = await build_server(settings, embedder=shared_embedder())
    try:
        yield running
    finally:
        await running.stop(grace_s=0)


async def wait_for(
    check: Callable[[], Any | Awaitable[Any]], timeout_s: float = 15.0, what: str = ""
) -> Any:
    """Poll until ``check`` returns something truthy, and return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or check}")
        await asyncio.sleep(0.05)


async def published(nats_url: str, event_type: type[E]) -> list[E]:
    """Every event of this type now in the stream, oldest first."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(STREAM_NAME, subjects_filter=event_type.subject)
        total = sum((info.state.subjects or {}).values())
        if not total:
            return []
        sub = await js.pull_subscribe(
            event_type.subject,
            stream=STREAM_NAME,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, inactive_threshold=5.0),
        )
        events: list[E] = []
        deadline = time.monotonic() + 5.0
        while len(events) < total and time.monotonic() < deadline:
            with suppress(nats.errors.TimeoutError):
                for msg in await sub.fetch(total - len(events), timeout=0.5):
                    events.append(event_type.model_validate_json(msg.data))
                    await msg.ack()
        await sub.unsubscribe()
        return events
    finally:
        await nc.close()


async def consumer_settled(nats_url: str, durable: str) -> bool:
    """Every message of the consumer was answered (acked or terminated)."""
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info(STREAM_NAME, durable)
        return info.num_pending == 0 and info.num_ack_pending == 0
    finally:
        await nc.close()


async def dead_letter_count(nats_url: str, worker: str) -> int:
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().stream_info(STREAM_NAME, subjects_filter=f"engram.dlq.{worker}")
        return sum((info.state.subjects or {}).values())
    finally:
        await nc.close()


@dataclass
class WorkerFleet:
    """In-process workers, stopped together at the end of a test."""

    running: list[tuple[Worker[Any], asyncio.Event, asyncio.Task[None]]] = field(
        default_factory=list
    )

    async def start(self, spec: WorkerSpec[Any], settings: WorkerSettings) -> Worker[Any]:
        worker = Worker(spec, settings)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.serve(stop))
        self.running.append((worker, stop, task))
        await wait_for(lambda: worker.consuming or task.done(), what=f"{spec.name} start")
        if task.done():
            task.result()  # re-raise the start-up failure
        return worker

    async def stop_all(self) -> None:
        for _, stop, _ in self.running:
            stop.set()
        for _, _, task in self.running:
            if not task.done():
                await asyncio.wait_for(task, 15)


async def current_facts(
    client: RetrievalClient, tenant: str, *, include_superseded: bool = False, **flt: Any
) -> list[pb.Memory]:
    """Facts of a tenant (optionally filtered), newest first."""
    reply = await client.list(
        pb.ListRequest(
            tenant=tenant,
            filter=pb.MemoryFilter(
                kinds=[pb.MEMORY_KIND_FACT], include_superseded=include_superseded, **flt
            ),
            page_size=500,
        )
    )
    return list(reply.memories)
