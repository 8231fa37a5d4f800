"""Fixtures for the worker tests: in-process workers against a fake MemoryService (the
runtime's delivery policy) or the real retrieval service (storage semantics).

The broker is always a real nats-server (the shared ``nats_url`` fixture).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from engram_core.bus import make_broker
from engram_core.codec import pb, pb_grpc
from engram_core.events import DeadLetter
from engram_core.retrieval_client import SERVICE_NAME
from engram_testing.waiting import eventually as shared_eventually
from engram_testing.worker_stack import (
    RealRetrieval,
    RunningWorker,
    WorkerStack,
    consumer_settled,
    dead_letter_count,
    dead_letters,
    running_retrieval,
)
from engram_workers.ingest import INGEST, IngestSettings


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

    async def Get(self, request: pb.GetRequest, context) -> pb.GetResponse:
        # Failures are injected into Upserts only: the tests count those.
        found = [self.stored[i] for i in request.ids if i in self.stored]
        return pb.GetResponse(
            memories=found, missing_ids=[i for i in request.ids if i not in self.stored]
        )


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


@pytest.fixture
def eventually() -> Callable[..., Awaitable[Any]]:
    """The shared polling helper, for tests that take it as a fixture."""
    return shared_eventually


@dataclass
class IngestHarness:
    """Starts ingest workers against the test's NATS and fake retrieval; stops them after."""

    retrieval: FakeRetrieval
    workers: WorkerStack

    def settings(self, **overrides: object) -> IngestSettings:
        values: dict[str, object] = {
            **self.workers.common(),
            # The fake retrieval has no List and there is no LLM here; extraction is
            # tested against the real retrieval service in test_extraction.py.
            "extraction_enabled": False,
            **overrides,
        }
        return IngestSettings(**values)

    async def start(self, **overrides: object) -> RunningWorker:
        return await self.workers.start(INGEST, self.settings(**overrides))

    async def dead_letters(self, count: int, timeout_s: float = 10.0) -> list[DeadLetter]:
        """The first ``count`` dead letters of the ingest worker (fails if fewer arrive)."""

        async def arrived() -> list[DeadLetter] | None:
            letters = await dead_letters(self.workers.nats_url, "ingest")
            return letters[:count] if len(letters) >= count else None

        return await shared_eventually(arrived, timeout_s, what=f"{count} dead letters")

    async def dead_letter_count(self) -> int:
        return await dead_letter_count(self.workers.nats_url, "ingest")

    async def settled(self) -> bool:
        """Every message was answered: nothing left to deliver, nothing awaiting an ack."""
        return await consumer_settled(self.workers.nats_url, "ingest")


@pytest.fixture
async def ingest(nats_url: str, fake_retrieval: FakeRetrieval) -> AsyncIterator[IngestHarness]:
    workers = WorkerStack(nats_url, fake_retrieval.address)
    try:
        yield IngestHarness(fake_retrieval, workers)
    finally:
        await workers.stop_all()


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    """The real retrieval service, in-process, storing under ``tmp_path``."""
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


@pytest.fixture
async def workers(nats_url: str, retrieval: RealRetrieval) -> AsyncIterator[WorkerStack]:
    """Workers against the test's NATS and the real retrieval; stopped after the test."""
    stack = WorkerStack(nats_url, retrieval.address)
    try:
        yield stack
    finally:
        await stack.stop_all()


@pytest.fixture
async def publisher(nats_url: str):
    """A broker built the way the gateway builds its own."""
    broker = make_broker(nats_url, client_name="test-publisher")
    await broker.connect()
    try:
        yield broker
    finally:
        await broker.stop()
