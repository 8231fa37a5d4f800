"""Fixtures of the retrieval service's tests: the real embedder (loaded once) and an
in-process gRPC server on a free port over an embedded store under tmp_path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.embedder import Embedder
from engram_retrieval.server import RunningServer, build_server
from engram_retrieval.settings import RetrievalSettings

FIXED_NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return Embedder.default(threads=1)


@pytest.fixture
def span_exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


@pytest.fixture
def tracer_provider(span_exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
def settings(tmp_path: Path) -> RetrievalSettings:
    return RetrievalSettings(data_dir=tmp_path / "data", retrieval_listen="127.0.0.1:0")


@pytest.fixture
async def server(
    settings: RetrievalSettings, embedder: Embedder, tracer_provider: TracerProvider
) -> AsyncIterator[RunningServer]:
    running = await build_server(
        settings,
        embedder=embedder,
        tracer=tracer_provider.get_tracer("test"),
        clock=lambda: FIXED_NOW,
    )
    try:
        yield running
    finally:
        await running.stop(grace_s=0)


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[RetrievalClient]:
    retrieval = RetrievalClient(server.address, timeout_s=30)
    try:
        yield retrieval
    finally:
        await retrieval.close()
