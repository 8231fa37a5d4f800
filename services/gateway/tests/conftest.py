"""Gateway test rig: the real nats-server, the scripted OpenAI-compatible upstream, the
retrieval port in memory (:mod:`engram_testing.memory_store`; the real retrieval service
for tests that name its address), and the gateway itself served by uvicorn in-process on
a free port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx2
import nats
import pytest
from fastapi import FastAPI
from nats.js.errors import NotFoundError
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engram_cli.stack.nats_server import free_port
from engram_core.events import STREAM_NAME
from engram_core.memory import MemoryKindName, MemoryRecord, Scores, SearchHit
from engram_gateway.app import create_app, retrieval_port
from engram_gateway.settings import GatewaySettings
from engram_testing.asgi import serving
from engram_testing.memory_store import InMemoryPort
from engram_testing.upstream import ScriptedUpstream

# --- memories ------------------------------------------------------------------------


def make_hit(
    text: str,
    *,
    kind: MemoryKindName = "fact",
    id: str = "11111111-1111-1111-1111-111111111111",
    created_at: datetime = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC),
    total: float = 0.75,
    role: str = "",
    turn_index: int = 0,
    metadata: dict[str, str] | None = None,
) -> SearchHit:
    """A search hit as retrieval returns it, for a scripted search result."""
    return SearchHit(
        memory=MemoryRecord(
            id=id,
            conversation_id="conv-1",
            kind=kind,
            text=text,
            role=role,
            created_at=created_at,
            turn_index=turn_index,
            metadata=metadata or {},
        ),
        scores=Scores(dense=0.5, sparse=1.25, relevance=0.8, recency=0.6, total=total, mmr=0.5),
        scope="conversation",
    )


@pytest.fixture
def hit() -> Callable[..., SearchHit]:
    return make_hit


@pytest.fixture
def memory_store() -> InMemoryPort:
    """The memories a gateway started by ``start_gateway`` serves from, unless the test
    names a ``retrieval_address`` (then the gateway talks to that service over gRPC)."""
    return InMemoryPort()


# --- the gateway ---------------------------------------------------------------------


@dataclass
class RunningGateway:
    url: str
    app: FastAPI
    settings: GatewaySettings
    spans: InMemorySpanExporter
    clients: list[httpx2.AsyncClient] = field(default_factory=list)

    def client(self) -> httpx2.AsyncClient:
        client = httpx2.AsyncClient(base_url=self.url, timeout=30)
        self.clients.append(client)
        return client


StartGateway = Callable[..., Awaitable[RunningGateway]]


@pytest.fixture
async def start_gateway(
    nats_url: str, scripted_upstream: ScriptedUpstream, memory_store: InMemoryPort
) -> AsyncIterator[StartGateway]:
    """``await start_gateway(**settings_overrides)`` → a gateway served on a free port,
    on ``memory_store`` or, given ``retrieval_address``, on that retrieval service."""
    running: list[RunningGateway] = []
    stack = AsyncExitStack()

    async def start(**overrides: Any) -> RunningGateway:
        values: dict[str, Any] = {
            "nats_url": nats_url,
            "llm_base_url": scripted_upstream.base_url,
            "gateway_port": free_port(),
            # A NATS stopped by a test fails chats after a second, not the 15 s default.
            "publish_retry_s": 1.0,
            **overrides,
        }
        settings = GatewaySettings(**values)
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        named = "retrieval_address" in overrides
        memories = retrieval_port if named else memory_store.as_factory()
        app = create_app(settings, tracer_provider=provider, memory_port=memories)
        url = await stack.enter_async_context(serving(app, settings.gateway_port))
        gateway = RunningGateway(url, app, settings, spans)
        running.append(gateway)
        return gateway

    try:
        yield start
    finally:
        for gateway in running:
            for client in gateway.clients:
                await client.aclose()
        await stack.aclose()


@pytest.fixture
async def gateway(start_gateway: StartGateway) -> RunningGateway:
    return await start_gateway()


@pytest.fixture
async def client(gateway: RunningGateway) -> httpx2.AsyncClient:
    return gateway.client()


# --- reading the stream --------------------------------------------------------------


@dataclass
class StoredEvent:
    subject: str
    headers: dict[str, str]
    data: dict[str, Any]
    seq: int


class JetStreamReader:
    """Reads what the gateway published, through a subscription to the real stream."""

    def __init__(self, nats_url: str) -> None:
        self.nats_url = nats_url

    async def count(self) -> int:
        nc = await nats.connect(self.nats_url)
        try:
            try:
                info = await nc.jetstream().stream_info(STREAM_NAME)
            except NotFoundError:
                return 0
            return int(info.state.messages)
        finally:
            await nc.close()

    async def events(self, expected: int, timeout_s: float = 10.0) -> list[StoredEvent]:
        """The first ``expected`` events, in stream order (waits for them to arrive)."""
        nc = await nats.connect(self.nats_url)
        try:
            sub = await nc.jetstream().subscribe("engram.>", ordered_consumer=True)
            events = []
            for _ in range(expected):
                msg = await sub.next_msg(timeout=timeout_s)
                events.append(
                    StoredEvent(
                        msg.subject,
                        dict(msg.headers or {}),
                        json.loads(msg.data),
                        msg.metadata.sequence.stream,
                    )
                )
            await sub.unsubscribe()
            return events
        finally:
            await nc.close()


@pytest.fixture
def jetstream(nats_url: str) -> JetStreamReader:
    return JetStreamReader(nats_url)


# --- upstream variants ---------------------------------------------------------------


class GatedUpstream(ScriptedUpstream):
    """Streams the first chunk, then waits for ``gate`` before sending the rest."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.gate = threading.Event()
        self.abandoned = threading.Event()  # the gateway dropped the stream mid-way

    async def _stream(self, completion_id: str, created: int, text: str):
        first = True
        try:
            async for piece in super()._stream(completion_id, created, text):
                yield piece
                if first:
                    first = False
                    await asyncio.to_thread(self.gate.wait)
        except (asyncio.CancelledError, GeneratorExit):
            self.abandoned.set()
            raise


@pytest.fixture
def gated_upstream() -> Iterator[GatedUpstream]:
    upstream = GatedUpstream().start()
    assert isinstance(upstream, GatedUpstream)
    try:
        yield upstream
    finally:
        upstream.gate.set()
        with contextlib.suppress(Exception):
            upstream.stop()
