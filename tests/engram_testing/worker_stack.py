"""Workers against the real services, in-process: the retrieval service (real embedder,
embedded Qdrant) and any number of worker replicas on the test's nats-server.

Used by the worker tests that need real storage semantics (List order, Count,
supersession, Search); the fake MemoryService in ``services/workers/tests`` covers
the runtime's delivery policy.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats

from engram_core.events import STREAM_NAME, Event, MemoryChanged, MemoryChangeOp, dlq_subject
from engram_core.memory_record import record_from_pb
from engram_core.proto import pb
from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.embedder import Embedder
from engram_retrieval.server import RunningServer, build_server
from engram_retrieval.settings import RetrievalSettings
from engram_testing.upstream import UpstreamError
from engram_workers.llm import TASK_PREFIX
from engram_workers.runtime import Worker, WorkerSettings, WorkerSpec

E = TypeVar("E", bound=Event)

Answer = Callable[[dict[str, Any]], "str | UpstreamError"]


class ScriptedModel:
    """An LLM keyed on the prompt: the ``engram-task:`` line picks the answer, which
    sees the task's JSON input. Records (task, input) of every call."""

    def __init__(self, **answers: Answer) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, body: dict[str, Any]) -> str | UpstreamError:
        first_line = body["messages"][0]["content"].split("\n", 1)[0]
        assert first_line.startswith(TASK_PREFIX), first_line
        task = first_line[len(TASK_PREFIX) :].strip()
        payload = json.loads(body["messages"][1]["content"])
        self.calls.append((task, payload))
        return self.answers[task](payload)

    def inputs(self, task: str) -> list[dict[str, Any]]:
        return [payload for name, payload in self.calls if name == task]


@functools.cache
def shared_embedder() -> Embedder:
    """The real MiniLM embedder, loaded once per test session."""
    return Embedder.default(threads=1)


@dataclass
class RealRetrieval:
    server: RunningServer
    client: RetrievalClient

    @property
    def address(self) -> str:
        return self.server.address


@asynccontextmanager
async def running_retrieval(data_dir: Path) -> AsyncIterator[RealRetrieval]:
    """The retrieval service on a free port with an embedded store under ``data_dir``."""
    settings = RetrievalSettings(data_dir=data_dir, retrieval_listen="127.0.0.1:0")
    server = await build_server(settings, embedder=shared_embedder())
    client = RetrievalClient(server.address, timeout_s=30)
    try:
        yield RealRetrieval(server, client)
    finally:
        await client.close()
        await server.stop(grace_s=0)


async def eventually(
    check: Callable[[], Any], timeout_s: float = 15.0, what: str = "", interval_s: float = 0.05
) -> Any:
    """Poll until ``check`` (sync or async) returns something truthy, and return it."""
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


@dataclass
class RunningWorker:
    worker: Worker[Any]
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def shutdown(self, timeout_s: float = 15.0) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout_s)


@dataclass
class WorkerStack:
    """Starts worker replicas against one NATS and one retrieval; stops them after."""

    nats_url: str
    retrieval: RealRetrieval
    running: list[RunningWorker] = field(default_factory=list)

    def common(self) -> dict[str, Any]:
        """Settings every test worker shares: no health port, quick retries."""
        return {
            "nats_url": self.nats_url,
            "retrieval_address": self.retrieval.address,
            "health_port": 0,
            "max_deliver": 3,
            "retry_backoff_s": (0.1,),
            "ack_wait_s": 5.0,
            "shutdown_grace_s": 5.0,
        }

    async def start(self, spec: WorkerSpec[Any], settings: WorkerSettings) -> RunningWorker:
        worker = Worker(spec, settings)
        stop = asyncio.Event()
        task = asyncio.create_task(worker.serve(stop))
        running = RunningWorker(worker, stop, task)
        self.running.append(running)
        await eventually(lambda: worker.consuming or task.done(), what=f"{spec.name} start")
        if task.done():
            task.result()  # re-raise the start-up failure
        return running

    async def stop_all(self) -> None:
        for running in self.running:
            if not running.task.done():
                await running.shutdown()

    async def settled(self, consumer: str) -> bool:
        """Every message of ``consumer`` answered: none pending, none awaiting an ack."""
        nc = await nats.connect(self.nats_url)
        try:
            info = await nc.jetstream().consumer_info(STREAM_NAME, consumer)
            return info.num_pending == 0 and info.num_ack_pending == 0
        finally:
            await nc.close()

    async def dead_letter_count(self, worker: str) -> int:
        nc = await nats.connect(self.nats_url)
        try:
            info = await nc.jetstream().stream_info(
                STREAM_NAME, subjects_filter=dlq_subject(worker)
            )
            return sum((info.state.subjects or {}).values())
        finally:
            await nc.close()

    async def events(self, event_type: type[E]) -> list[E]:
        """Every event of this type in the stream so far, in stream order."""
        nc = await nats.connect(self.nats_url)
        try:
            sub = await nc.jetstream().pull_subscribe(event_type.subject, stream=STREAM_NAME)
            found: list[E] = []
            while True:
                try:
                    batch = await sub.fetch(100, timeout=0.3)
                except nats.errors.TimeoutError:
                    return found
                found += [event_type.model_validate_json(msg.data) for msg in batch]
        finally:
            await nc.close()


def changed(
    tenant: str, memory: pb.Memory, op: MemoryChangeOp = "created", **fields: Any
) -> MemoryChanged:
    """The ``memory.changed`` event a writer (ingest, reconcile) publishes for ``memory``."""
    return MemoryChanged(
        tenant=tenant,
        user_id=memory.user_id,
        conversation_id=memory.conversation_id,
        op=op,
        memory=record_from_pb(memory),
        cause=fields.pop("cause", "test"),
        **fields,
    )
