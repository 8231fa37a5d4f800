"""Fixtures for the worker tests: a fake MemoryService and in-process workers.

The broker is always a real nats-server (the shared ``nats_url`` fixture); only the
retrieval service is faked, because its real implementation lives in another package.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import nats
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from engram_core.bus import make_broker
from engram_core.events import STREAM_NAME, DeadLetter, dlq_subject
from engram_core.proto import pb, pb_grpc
from engram_core.retrieval_client import SERVICE_NAME
from engram_workers.ingest import INGEST, IngestSettings
from engram_workers.runtime import Worker


class FakeMemoryService(pb_grpc.MemoryServiceServicer):
    """Records Upsert calls; can fail the next calls, or every call, with a status code."""

    def __init__(self) -> None:
        self.attempts: list[float] = []  # monotonic time of every Upsert call
        self.upserts: list[pb.UpsertRequest] = []  # the calls that succeeded
        self.stored: dict[str, pb.Memory] = {}
        self.fail_next: list[grpc.StatusCode] = []
        self.fail_always: grpc.StatusCode | None = None
        self.delay_s = 0.0

    async def Upsert(self, request: pb.UpsertRequest, context) -> pb.UpsertResponse:
        self.attempts.append(time.monotonic())
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        code = self.fail_next.pop(0) if self.fail_next else self.fail_always
        if code is not None:
            await context.abort(code, f"injected {code.name}")
        self.upserts.append(request)
        results = []
        for memory in request.memories:
            previous = self.stored.get(memory.id)
            if previous is None:
                status = pb.UPSERT_STATUS_CREATED
            elif previous == memory:
                status = pb.UPSERT_STATUS_UNCHANGED
            else:
                status = pb.UPSERT_STATUS_UPDATED
            self.stored[memory.id] = memory
            results.append(pb.UpsertResult(id=memory.id, status=status))
        return pb.UpsertResponse(results=results)


@dataclass
class FakeRetrieval:
    address: str
    service: FakeMemoryService
    health: health_aio.HealthServicer

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set(SERVICE_NAME, status)


@pytest.fixture
async def fake_retrieval() -> AsyncIterator[FakeRetrieval]:
    server = grpc.aio.server()
    service = FakeMemoryService()
    health = health_aio.HealthServicer()
    pb_grpc.add_MemoryServiceServicer_to_server(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    fake = FakeRetrieval(address=f"127.0.0.1:{port}", service=service, health=health)
    await fake.set_serving(True)
    try:
        yield fake
    finally:
        await server.stop(grace=None)


async def _eventually(
    check: Callable[[], bool | Awaitable[bool]], timeout_s: float = 10.0, what: str = ""
) -> None:
    """Poll until ``check`` holds; the bus is asynchronous, so tests wait for outcomes."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or check}")
        await asyncio.sleep(0.02)


@pytest.fixture
def eventually() -> Callable[..., Awaitable[None]]:
    return _eventually


@dataclass
class RunningWorker:
    worker: Worker
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def shutdown(self, timeout_s: float = 15.0) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout_s)


@dataclass
class IngestHarness:
    """Starts ingest workers against the test's NATS and fake retrieval; stops them after."""

    nats_url: str
    retrieval: FakeRetrieval
    running: list[RunningWorker] = field(default_factory=list)

    def settings(self, **overrides: object) -> IngestSettings:
        values: dict[str, object] = {
            "nats_url": self.nats_url,
            "retrieval_address": self.retrieval.address,
            "health_port": 0,
            "max_deliver": 3,
            "retry_backoff_s": (0.1,),
            "ack_wait_s": 5.0,
            "shutdown_grace_s": 5.0,
            # The fake retrieval has no List and there is no LLM here; extraction is
            # tested against the real retrieval service in test_extraction.py.
            "extraction_enabled": False,
            **overrides,
        }
        return IngestSettings(**values)

    async def start(self, **overrides: object) -> RunningWorker:
        worker = Worker(INGEST, self.settings(**overrides))
        stop = asyncio.Event()
        task = asyncio.create_task(worker.serve(stop))
        running = RunningWorker(worker, stop, task)
        self.running.append(running)
        await _eventually(lambda: worker.consuming or task.done(), what="worker start")
        if task.done():
            task.result()  # re-raise the start-up failure
        return running

    async def stop_all(self) -> None:
        for running in self.running:
            if not running.task.done():
                await running.shutdown()

    async def dead_letters(self, count: int, timeout_s: float = 10.0) -> list[DeadLetter]:
        """The first ``count`` dead letters of the ingest worker (fails if fewer arrive)."""
        nc = await nats.connect(self.nats_url)
        try:
            sub = await nc.jetstream().pull_subscribe(dlq_subject("ingest"), stream=STREAM_NAME)
            letters: list[DeadLetter] = []
            deadline = time.monotonic() + timeout_s
            while len(letters) < count and time.monotonic() < deadline:
                try:
                    msgs = await sub.fetch(count - len(letters), timeout=0.5)
                except nats.errors.TimeoutError:
                    continue
                letters += [DeadLetter.model_validate_json(msg.data) for msg in msgs]
            assert len(letters) == count, f"expected {count} dead letters, got {len(letters)}"
            return letters
        finally:
            await nc.close()

    async def dead_letter_count(self) -> int:
        nc = await nats.connect(self.nats_url)
        try:
            info = await nc.jetstream().stream_info(
                STREAM_NAME, subjects_filter=dlq_subject("ingest")
            )
            return sum((info.state.subjects or {}).values())
        finally:
            await nc.close()

    async def settled(self) -> bool:
        """Every message was answered: nothing left to deliver, nothing awaiting an ack."""
        nc = await nats.connect(self.nats_url)
        try:
            info = await nc.jetstream().consumer_info(STREAM_NAME, "ingest")
            return info.num_pending == 0 and info.num_ack_pending == 0
        finally:
            await nc.close()


@pytest.fixture
async def ingest(nats_url: str, fake_retrieval: FakeRetrieval) -> AsyncIterator[IngestHarness]:
    harness = IngestHarness(nats_url, fake_retrieval)
    try:
        yield harness
    finally:
        await harness.stop_all()


@pytest.fixture
async def publisher(nats_url: str):
    """A broker built the way the gateway builds its own."""
    broker = make_broker(nats_url, client_name="test-publisher")
    await broker.connect()
    try:
        yield broker
    finally:
        await broker.stop()
