"""Fixtures for the worker tests: in-process workers on the retrieval port in memory (the
runtime's delivery policy) or on the real retrieval service (storage and ranking).

The broker is always a real nats-server (the shared ``nats_url`` fixture).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engram_core.bus import make_broker
from engram_core.events import DeadLetter
from engram_testing.memory_store import InMemoryPort
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
from engram_workers.runtime import Worker


@pytest.fixture
def memory_store() -> InMemoryPort:
    """The memories of workers the test starts with it (:mod:`engram_testing.memory_store`)."""
    return InMemoryPort()


@pytest.fixture
def eventually() -> Callable[..., Awaitable[Any]]:
    """The shared polling helper, for tests that take it as a fixture."""
    return shared_eventually


@dataclass
class IngestHarness:
    """Starts ingest workers against the test's NATS and memories; stops them after."""

    memories: InMemoryPort
    workers: WorkerStack

    def settings(self, **overrides: object) -> IngestSettings:
        values: dict[str, Any] = {
            **self.workers.common(),
            # There is no LLM here; extraction is tested against the real retrieval
            # service in test_extraction.py.
            "extraction_enabled": False,
            **overrides,
        }
        return IngestSettings(**values)

    async def start(self, **overrides: object) -> RunningWorker:
        return await self.workers.start(INGEST, self.settings(**overrides))

    def worker(self, **overrides: object) -> Worker[Any, Any, Any]:
        """An ingest worker on the harness's memories, for a test that serves it itself."""
        return Worker(INGEST, self.settings(**overrides), memory_port=self.memories.as_factory())

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
async def ingest(nats_url: str, memory_store: InMemoryPort) -> AsyncIterator[IngestHarness]:
    workers = WorkerStack(nats_url, memories=memory_store)
    try:
        yield IngestHarness(memory_store, workers)
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
