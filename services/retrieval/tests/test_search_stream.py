"""The gateway's searches as messages on one open SearchStream (engram_core.search_stream):
each is answered as a unary Search would be (the reply, the status, the trace, the
deadline), a failed one fails alone, a broken stream is replaced, a service without the
stream is searched unary, and a stopping service ends its streams instead of holding
its stop for the whole grace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from engram_core import rpc_tracing
from engram_core.codec import pb, pb_grpc
from engram_core.memory import SearchQuery
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.retrieval_client import RetrievalClient
from engram_core.search_stream import SearchStream
from engram_retrieval.server import build_server
from engram_retrieval.settings import RetrievalSettings
from engram_testing.worker_stack import running_retrieval, shared_embedder

from .test_service import FACTS, fact

QUERIES = ["my dog", "what do I eat?", "where do I live?", "my sister", "which car?"]


def search(query: str, tenant: str = "acme") -> pb.SearchRequest:
    return pb.SearchRequest(tenant=tenant, query=query, user_id="u1", score_threshold=0.0)


async def test_searches_on_one_stream_are_answered_as_unary_searches_are(tmp_path: Path) -> None:
    async with running_retrieval(tmp_path / "data") as ret:
        await ret.client.upsert(pb.UpsertRequest(tenant="acme", memories=[fact(t) for t in FACTS]))
        gateway = RetrievalClient(ret.server.address, timeout_s=30, interactive=True)
        try:
            streamed = await asyncio.gather(*(gateway.search(search(q)) for q in QUERIES))
            assert len(ret.server.servicer._search_streams) == 1  # all on one stream
            for query, reply in zip(QUERIES, streamed, strict=True):
                unary = await ret.client.search(search(query))
                assert [h.memory.id for h in reply.hits] == [h.memory.id for h in unary.hits]
                assert reply.hits and reply.outcome == unary.outcome
        finally:
            await gateway.close()


async def test_a_failed_search_fails_alone_and_the_stream_goes_on(tmp_path: Path) -> None:
    async with running_retrieval(tmp_path / "data") as ret:
        await ret.client.upsert(pb.UpsertRequest(tenant="acme", memories=[fact(t) for t in FACTS]))
        gateway = RetrievalClient(ret.server.address, timeout_s=30, interactive=True)
        try:
            await gateway.search(search("my dog"))
            with pytest.raises(RetrievalError) as failed:
                await MemoryPort(gateway).search(_query(tenant=" "))
            # what a unary Search answers: the caller's to fix, a 400, not retried
            assert failed.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert failed.value.http_status == 400 and not failed.value.retryable
            assert "tenant" in failed.value.details
            reply = await gateway.search(search("my dog"))
            assert "dog" in reply.hits[0].memory.text
            assert len(ret.server.servicer._search_streams) == 1  # the same stream
        finally:
            await gateway.close()


async def test_a_streamed_search_is_a_client_span_continued_by_a_server_span(
    tmp_path: Path,
    span_exporter: InMemorySpanExporter,
    tracer_provider: TracerProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rpc_tracing, "_tracer", tracer_provider.get_tracer("engram.rpc"))
    async with running_retrieval(tmp_path / "data") as ret:
        gateway = RetrievalClient(ret.server.address, timeout_s=30, interactive=True)
        try:
            await gateway.search(search("my dog"))
            with pytest.raises(grpc.aio.AioRpcError):
                await gateway.search(search("my dog", tenant=""))
        finally:
            await gateway.close()
    spans = [
        s
        for s in span_exporter.get_finished_spans()
        if s.name == "/engram.memory.v1.MemoryService/Search"
    ]
    clients = [s for s in spans if s.kind == SpanKind.CLIENT]
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    assert len(clients) == len(servers) == 2
    for client_span, server_span in zip(clients, servers, strict=True):
        assert server_span.parent is not None and client_span.context is not None
        assert server_span.parent.span_id == client_span.context.span_id  # one trace
    codes = [
        [(s.attributes or {}).get("rpc.grpc.status_code") for s in side]
        for side in (clients, servers)
    ]
    assert codes == [[0, 3], [0, 3]]  # OK, then INVALID_ARGUMENT on both sides


async def test_a_stopping_service_ends_its_streams_instead_of_waiting_out_the_grace(
    tmp_path: Path,
) -> None:
    settings = RetrievalSettings(data_dir=tmp_path / "data", retrieval_listen="127.0.0.1:0")
    server = await build_server(settings, embedder=shared_embedder())
    gateway = RetrievalClient(server.address, timeout_s=5, interactive=True)
    try:
        await gateway.search(search("my dog"))
        # the stream is open; the stop must not wait the 60 s grace for it
        await asyncio.wait_for(server.stop(grace_s=60), 10)
        with pytest.raises(grpc.aio.AioRpcError) as after:
            await gateway.search(search("my dog"))
        assert after.value.code() == grpc.StatusCode.UNAVAILABLE  # retryable, not a hang
    finally:
        await gateway.close()


async def test_a_stopping_service_answers_the_search_it_is_serving(tmp_path: Path) -> None:
    settings = RetrievalSettings(data_dir=tmp_path / "data", retrieval_listen="127.0.0.1:0")
    server = await build_server(settings, embedder=shared_embedder())
    pipeline = server.servicer.pipeline
    real_run, serving, release = pipeline.run, asyncio.Event(), asyncio.Event()

    async def held_run(query: SearchQuery, **how: Any) -> Any:
        serving.set()
        await release.wait()
        return await real_run(query, **how)

    pipeline.run = held_run  # type: ignore[method-assign]
    gateway = RetrievalClient(server.address, timeout_s=30, interactive=True)
    try:
        searching = asyncio.create_task(gateway.search(search("my dog")))
        await asyncio.wait_for(serving.wait(), 10)
        stopping = asyncio.create_task(server.stop(grace_s=60))
        await asyncio.sleep(0.2)
        release.set()
        reply = await asyncio.wait_for(searching, 10)  # answered, not cut off
        assert reply.outcome == pb.SEARCH_OUTCOME_EMPTY
        await asyncio.wait_for(stopping, 10)  # and the stream ended after it
    finally:
        await gateway.close()


# -- against services of our own making ------------------------------------------------


class _Scripted(pb_grpc.MemoryServiceServicer):
    """Search answers one hit naming the path it came by; SearchStream as scripted."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream
        self.streams_opened = 0

    async def Search(self, request: pb.SearchRequest, context: Any) -> pb.SearchResponse:
        return _reply("unary")

    async def SearchStream(self, requests: Any, context: Any) -> None:
        self.streams_opened += 1
        if self.stream is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        await self.stream(self, requests, context)


def _reply(text: str) -> pb.SearchResponse:
    reply = pb.SearchResponse(outcome=pb.SEARCH_OUTCOME_RANKED)
    reply.hits.add().memory.text = text
    return reply


@asynccontextmanager
async def _serving(
    servicer: _Scripted, timeout_s: float = 5, **how: Any
) -> AsyncIterator[RetrievalClient]:
    server = grpc.aio.server()
    pb_grpc.add_MemoryServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = RetrievalClient(f"127.0.0.1:{port}", timeout_s=timeout_s, interactive=True, **how)
    try:
        yield client
    finally:
        await client.close()
        await server.stop(0)


async def test_a_service_without_the_stream_is_searched_unary() -> None:
    servicer = _Scripted(stream=None)  # an older retrieval: UNIMPLEMENTED
    async with _serving(servicer) as client:
        for _ in range(3):
            reply = await client.search(search("my dog"))
            assert reply.hits[0].memory.text == "unary"
    assert servicer.streams_opened == 1  # asked once, then unary for good


async def test_the_stream_can_be_turned_off() -> None:
    # ENGRAM_GATEWAY_SEARCH_STREAM=false: for a proxy that does not carry long streams
    servicer = _Scripted(stream=None)
    async with _serving(servicer, search_stream=False) as client:
        assert (await client.search(search("my dog"))).hits[0].memory.text == "unary"
    assert servicer.streams_opened == 0


async def test_a_search_past_its_deadline_fails_deadline_exceeded() -> None:
    async def never_answers(servicer: _Scripted, requests: Any, context: Any) -> None:
        async for _ in requests:
            pass

    async with _serving(_Scripted(never_answers), timeout_s=0.2) as client:
        with pytest.raises(RetrievalError) as late:
            await MemoryPort(client).search(_query())
    assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and late.value.retryable


async def test_a_broken_stream_fails_its_search_and_the_next_search_opens_another() -> None:
    async def breaks_then_answers(servicer: _Scripted, requests: Any, context: Any) -> None:
        async for message in requests:
            if servicer.streams_opened == 1:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
            reply = pb.StreamedSearchReply(id=message.id)
            reply.response.CopyFrom(_reply(f"stream {servicer.streams_opened}"))
            await context.write(reply)

    servicer = _Scripted(breaks_then_answers)
    async with _serving(servicer) as client:
        with pytest.raises(RetrievalError) as broken:
            await MemoryPort(client).search(_query())
        assert broken.value.code == grpc.StatusCode.UNAVAILABLE and broken.value.retryable
        reply = await client.search(search("my dog"))
        assert reply.hits[0].memory.text == "stream 2"
    assert servicer.streams_opened == 2


def _query(tenant: str = "acme") -> SearchQuery:
    return SearchQuery(tenant=tenant, text="my dog", user_id="u1")


async def test_a_reader_that_fails_unexpectedly_fails_the_search_instead_of_hanging() -> None:
    class GarbledCall:
        async def write(self, request: pb.StreamedSearch) -> None:
            return None

        async def read(self) -> Any:
            raise ValueError("garbled reply")

        async def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.OK

        async def details(self) -> str:
            return ""

        def cancel(self) -> bool:
            return True

    searches = SearchStream(lambda metadata: GarbledCall(), ())
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await asyncio.wait_for(searches.search(search("my dog"), 30, ()), 5)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "garbled reply" in (failed.value.details() or "")
    await searches.close()
