"""Workers against the real services, in-process: the retrieval service (real embedder,
embedded Qdrant), any number of worker replicas on the test's nats-server, and readers
of what they left on the ENGRAM stream.

The embedder is loaded once per test process and shared by every retrieval server;
each server gets its own store directory, so tests never see each other's memories.
Workers started with ``memories`` (an :class:`~engram_testing.memory_store.InMemoryPort`)
use it instead of a retrieval service: the runtime's delivery policy needs no models;
the real service serves the tests that need its storage and ranking.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import BaseModel

from engram_core.codec import pb, record_from_pb
from engram_core.events import (
    STREAM_NAME,
    DeadLetter,
    Event,
    MemoryChanged,
    MemoryChangeOp,
    dlq_subject,
)
from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.embedder import Embedder
from engram_retrieval.server import RunningServer, build_server
from engram_retrieval.settings import RetrievalSettings
from engram_testing.memory_store import InMemoryPort
from engram_testing.upstream import UpstreamError
from engram_testing.waiting import eventually
from engram_workers.llm import TASK_PREFIX
from engram_workers.runtime import Worker, WorkerSettings, WorkerSpec

E = TypeVar("E", bound=Event)
M = TypeVar("M", bound=BaseModel)

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


# --- the retrieval service ------------------------------------------------------------------


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
async def running_retrieval(data_dir: Path, **settings_: Any) -> AsyncIterator[RealRetrieval]:
    """The retrieval service on a free port with an embedded store under ``data_dir``
    (``settings_``: other :class:`RetrievalSettings` fields), and a client of it (closed
    with the server)."""
    settings = RetrievalSettings(data_dir=data_dir, retrieval_listen="127.0.0.1:0", **settings_)
    server = await build_server(settings, embedder=shared_embedder())
    client = RetrievalClient(server.address, timeout_s=30)
    try:
        yield RealRetrieval(server, client)
    finally:
        await client.close()
        await server.stop(grace_s=0)


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


# --- workers --------------------------------------------------------------------------------


#: Retry settings under which a message that keeps failing transiently is delivered
#: exactly twice: the first delivery (age < 0.25 s) is retried after 0.5 s; the second
#: (age >= 0.5 s) would be retried after the 0.75 s horizon, so it is the last.
HORIZON_AFTER_TWO_DELIVERIES: dict[str, Any] = {"retry_backoff_s": (0.5,), "retry_horizon_s": 0.75}


def quick_settings(nats_url: str, retrieval_address: str = "") -> dict[str, Any]:
    """Settings every test worker shares: no health port, quick retries and shutdown."""
    values: dict[str, Any] = {
        "nats_url": nats_url,
        "health_port": 0,
        "max_deliver": 3,
        "retry_backoff_s": (0.1,),
        "ack_wait_s": 5.0,
        "shutdown_grace_s": 5.0,
    }
    if retrieval_address:
        values["retrieval_address"] = retrieval_address
    return values


@dataclass
class RunningWorker:
    """One worker serving in a task of the test's event loop until ``stop`` is set."""

    worker: Worker[Any, Any, Any]
    stop: asyncio.Event
    task: asyncio.Task[None]

    @classmethod
    async def start(
        cls,
        spec: WorkerSpec[Any, Any, Any],
        settings: WorkerSettings,
        memories: InMemoryPort | None = None,
    ) -> RunningWorker:
        """Start serving and return once the worker consumes (or raise why it could not).
        ``memories``: the port it uses instead of the retrieval service."""
        if memories is None:
            worker = Worker(spec, settings)
        else:
            worker = Worker(spec, settings, memory_port=memories.as_factory())
        stop = asyncio.Event()
        task = asyncio.create_task(worker.serve(stop))
        await eventually(lambda: worker.consuming or task.done(), what=f"{spec.name} start")
        if task.done():
            task.result()  # re-raise the start-up failure
        return cls(worker, stop, task)

    async def shutdown(self, timeout_s: float = 15.0) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout_s)


@asynccontextmanager
async def running_worker(
    spec: WorkerSpec[Any, Any, Any], settings: WorkerSettings
) -> AsyncIterator[Worker[Any, Any, Any]]:
    """One worker in-process, consuming until the block ends (then stopped cleanly)."""
    running = await RunningWorker.start(spec, settings)
    try:
        yield running.worker
    finally:
        await running.shutdown(20)


@dataclass
class WorkerStack:
    """Starts worker replicas against one NATS and one retrieval (or ``memories``);
    stops them together."""

    nats_url: str
    retrieval_address: str = ""
    memories: InMemoryPort | None = None
    running: list[RunningWorker] = field(default_factory=list)

    def common(self) -> dict[str, Any]:
        """:func:`quick_settings` for this NATS and retrieval."""
        return quick_settings(self.nats_url, self.retrieval_address)

    async def start(
        self, spec: WorkerSpec[Any, Any, Any], settings: WorkerSettings
    ) -> RunningWorker:
        running = await RunningWorker.start(spec, settings, self.memories)
        self.running.append(running)
        return running

    async def stop_all(self, timeout_s: float = 15.0) -> None:
        for running in self.running:
            running.stop.set()
        for running in self.running:
            if not running.task.done():
                await asyncio.wait_for(running.task, timeout_s)


# --- the stream -----------------------------------------------------------------------------


@asynccontextmanager
async def _jetstream(nats_url: str) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(nats_url)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


async def _stored(js: JetStreamContext, subject: str) -> int:
    info = await js.stream_info(STREAM_NAME, subjects_filter=subject)
    return sum((info.state.subjects or {}).values())


async def _read(nats_url: str, subject: str, model: type[M]) -> list[M]:
    """Every message on ``subject`` now in the stream, oldest first."""
    async with _jetstream(nats_url) as js:
        total = await _stored(js, subject)
        if not total:
            return []
        sub = await js.pull_subscribe(
            subject,
            stream=STREAM_NAME,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, inactive_threshold=5.0),
        )
        found: list[M] = []
        deadline = time.monotonic() + 5.0
        while len(found) < total and time.monotonic() < deadline:
            with suppress(nats.errors.TimeoutError):
                for msg in await sub.fetch(total - len(found), timeout=0.5):
                    found.append(model.model_validate_json(msg.data))
                    await msg.ack()
        await sub.unsubscribe()
        return found


async def published(nats_url: str, event_type: type[E]) -> list[E]:
    """Every event of this type now in the stream, oldest first."""
    return await _read(nats_url, event_type.subjects_wildcard(), event_type)


async def dead_letters(nats_url: str, worker: str) -> list[DeadLetter]:
    """Every dead letter of this worker now in the stream, oldest first."""
    return await _read(nats_url, dlq_subject(worker), DeadLetter)


async def dead_letter_count(nats_url: str, worker: str) -> int:
    async with _jetstream(nats_url) as js:
        return await _stored(js, dlq_subject(worker))


async def consumer_settled(nats_url: str, durable: str) -> bool:
    """Every message of the consumer was answered (acked or terminated)."""
    async with _jetstream(nats_url) as js:
        info = await js.consumer_info(STREAM_NAME, durable)
        return info.num_pending == 0 and info.num_ack_pending == 0


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
