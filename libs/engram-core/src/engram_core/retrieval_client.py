"""Async client of the retrieval service's MemoryService, used by gateway, workers and CLI.

Create it inside a lifespan/startup hook (never at import). Every call is a CLIENT
span carrying the trace context to retrieval (:mod:`engram_core.rpc_tracing`).

The channel reconnects with a short backoff (0.25 s doubling to at most 2 s instead of
gRPC's default 120 s), so callers recover within a few seconds of retrieval serving
again instead of answering "memory unavailable" for minutes; keepalive pings (every
``ENGRAM_GRPC_KEEPALIVE_S``, 20 s by default, also while idle) notice a connection that
died silently (a node gone, a NAT dropping it).

Both sides of that policy come from the one setting, here: :func:`channel_options` (the
clients' ping interval) and :func:`server_keepalive_options` (what the retrieval server
accepts: pings half as far apart as the shorter of the setting and the default, so a
client on either schedule never collects a strike). A server that refuses the clients'
pings answers the third early one with GOAWAY ``too_many_pings`` and every caller
reconnects; gRPC core silently ignores an option name it does not know, which is how
that happened (``min_recv_ping_interval_without_data_ms`` is not one).

:class:`InProcessRetrievalClient` calls a MemoryService servicer living in the same
process (``engram up``'s light layout, where retrieval and the workers share one): the
same requests, replies, status codes, deadlines and CLIENT/SERVER spans as over gRPC,
without the channel, the serialising and the gRPC machinery at both ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engram_core import metrics, semconv
from engram_core.codec import pb, pb_grpc
from engram_core.logging import get_logger
from engram_core.retry import TransientError, retry_transient
from engram_core.rpc_tracing import client_call
from engram_core.search_stream import SearchStream, StreamUnsupported, rpc_error
from engram_core.settings import DEFAULT_GRPC_KEEPALIVE_S

log = get_logger(__name__)

Req = TypeVar("Req")
Rep = TypeVar("Rep")

SERVICE_NAME = "engram.memory.v1.MemoryService"
#: SearchResponse.timings field → the ``engram.search.stage`` attribute value.
SEARCH_STAGES = (
    ("embed", "embed_ms"),
    ("candidates", "candidates_ms"),
    ("rerank", "rerank_ms"),
    ("mmr", "mmr_ms"),
    ("total", "total_ms"),
)


MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: How often an idle client pings retrieval, unless ``ENGRAM_GRPC_KEEPALIVE_S`` says.
DEFAULT_KEEPALIVE_S = DEFAULT_GRPC_KEEPALIVE_S
KEEPALIVE_TIMEOUT_MS = 5_000
#: gRPC core's names (``GRPC_ARG_*`` in grpc/impl/channel_arg_names.h); an unknown name
#: is ignored without a word, so each is spelled once, here.
ARG_KEEPALIVE_TIME_MS = "grpc.keepalive_time_ms"
ARG_KEEPALIVE_TIMEOUT_MS = "grpc.keepalive_timeout_ms"
ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS = "grpc.keepalive_permit_without_calls"
ARG_MAX_PINGS_WITHOUT_DATA = "grpc.http2.max_pings_without_data"
ARG_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS = "grpc.http2.min_ping_interval_without_data_ms"


def _keepalive_ms(keepalive_s: float) -> int:
    return max(1, round(keepalive_s * 1000))


def channel_options(keepalive_s: float = DEFAULT_KEEPALIVE_S) -> list[tuple[str, int]]:
    """What a client channel to retrieval uses (gateway, workers, CLI)."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        (ARG_KEEPALIVE_TIME_MS, _keepalive_ms(keepalive_s)),
        (ARG_KEEPALIVE_TIMEOUT_MS, KEEPALIVE_TIMEOUT_MS),
        (ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1),
        (ARG_MAX_PINGS_WITHOUT_DATA, 0),
    ]


def server_keepalive_options(keepalive_s: float = DEFAULT_KEEPALIVE_S) -> list[tuple[str, int]]:
    """What the retrieval server needs to accept the clients' pings, idle or not: one
    every half of the shorter of ``keepalive_s`` and the default (a CLI built with the
    default beside services set to ping less often is not struck either). gRPC's own
    default is one per 5 minutes without data, and GOAWAY ``too_many_pings`` after the
    third that comes sooner."""
    shortest_ms = min(_keepalive_ms(keepalive_s), _keepalive_ms(DEFAULT_KEEPALIVE_S))
    return [
        (ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1),
        (ARG_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, max(1, shortest_ms // 2)),
    ]


class MemoryStub(Protocol):
    """The generated MemoryService stub's calls, typed (grpcio-tools types messages, not
    stubs)."""

    Search: grpc.aio.UnaryUnaryMultiCallable[pb.SearchRequest, pb.SearchResponse]
    Upsert: grpc.aio.UnaryUnaryMultiCallable[pb.UpsertRequest, pb.UpsertResponse]
    Delete: grpc.aio.UnaryUnaryMultiCallable[pb.DeleteRequest, pb.DeleteResponse]
    Get: grpc.aio.UnaryUnaryMultiCallable[pb.GetRequest, pb.GetResponse]
    List: grpc.aio.UnaryUnaryMultiCallable[pb.ListRequest, pb.ListResponse]
    Count: grpc.aio.UnaryUnaryMultiCallable[pb.CountRequest, pb.CountResponse]
    ListScopes: grpc.aio.UnaryUnaryMultiCallable[pb.ListScopesRequest, pb.ListScopesResponse]
    SearchStream: grpc.aio.StreamStreamMultiCallable[pb.StreamedSearch, pb.StreamedSearchReply]


class HealthStub(Protocol):
    Check: grpc.aio.UnaryUnaryMultiCallable[
        health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
    ]


#: gRPC metadata of a call someone is waiting for (the gateway's): retrieval serves it
#: before the workers' calls (engram_retrieval.priority).
INTERACTIVE_METADATA = ("engram-priority", "interactive")


class RetrievalClient:
    #: whether this client's calls are marked INTERACTIVE_METADATA
    interactive: bool = False
    #: the searches' stream (an interactive client over a channel only)
    _searches: SearchStream | None = None

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = 10.0,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        interactive: bool = False,
        search_stream: bool = True,
    ) -> None:
        """``interactive``: a person waits for this client's calls (the gateway's); its
        searches then go on one open stream unless ``search_stream`` is False."""
        self.address = address
        self.timeout_s = timeout_s
        self.interactive = interactive
        self._channel = grpc.aio.insecure_channel(address, options=channel_options(keepalive_s))
        self.stub: MemoryStub = pb_grpc.MemoryServiceStub(self._channel)
        # A person waits for this client's searches: they go as messages on one open
        # stream, which costs a chat less than a unary call (engram_core.search_stream).
        self._searches: SearchStream | None = None
        if interactive and search_stream:
            self._searches = SearchStream(
                lambda metadata: self.stub.SearchStream(metadata=metadata),
                (INTERACTIVE_METADATA,),
            )
        # types-grpcio-health-checking declares HealthStub without its methods.
        self._health = cast(HealthStub, health_pb2_grpc.HealthStub(self._channel))

    async def _call(
        self,
        method: str,
        call: grpc.aio.UnaryUnaryMultiCallable[Req, Rep],
        request: Req,
        timeout_s: float,
    ) -> Rep:
        with client_call(SERVICE_NAME, method) as metadata:
            if self.interactive:
                metadata = (*metadata, INTERACTIVE_METADATA)
            return await call(request, timeout=timeout_s, metadata=metadata)

    async def search(self, request: pb.SearchRequest) -> pb.SearchResponse:
        searches = self._searches
        if searches is not None and not searches.unsupported:
            try:
                with client_call(SERVICE_NAME, "Search") as trace_context:
                    return await searches.search(request, self.timeout_s, trace_context)
            except StreamUnsupported:
                log.info("retrieval.search_stream_unsupported", address=self.address)
        return await self._call("Search", self.stub.Search, request, self.timeout_s)

    async def upsert(self, request: pb.UpsertRequest) -> pb.UpsertResponse:
        return await self._call("Upsert", self.stub.Upsert, request, self.timeout_s * 6)

    async def delete(self, request: pb.DeleteRequest) -> pb.DeleteResponse:
        return await self._call("Delete", self.stub.Delete, request, self.timeout_s)

    async def get(self, request: pb.GetRequest) -> pb.GetResponse:
        return await self._call("Get", self.stub.Get, request, self.timeout_s)

    async def list(self, request: pb.ListRequest) -> pb.ListResponse:
        return await self._call("List", self.stub.List, request, self.timeout_s)

    async def count(self, request: pb.CountRequest) -> pb.CountResponse:
        return await self._call("Count", self.stub.Count, request, self.timeout_s)

    async def list_scopes(self, request: pb.ListScopesRequest) -> pb.ListScopesResponse:
        return await self._call("ListScopes", self.stub.ListScopes, request, self.timeout_s)

    async def is_serving(self, timeout_s: float = 2.0) -> bool:
        """Standard gRPC health check of the MemoryService."""
        try:
            reply = await self._health.Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def until_serving(self) -> None:
        """Wait, backing off up to 1 s, until the service reports SERVING (the channel
        is then connected). Logs ``retrieval.waiting`` while it does."""

        async def serving() -> None:
            if not await self.is_serving(timeout_s=2.0):
                raise TransientError(f"retrieval at {self.address} is not serving yet")

        def report(exc: BaseException, pause: float) -> None:
            log.info("retrieval.waiting", address=self.address, delay_s=round(pause, 2))

        await retry_transient(serving, budget_s=None, on_retry=report, max_delay_s=1.0)

    def connectivity(self) -> grpc.ChannelConnectivity:
        """The channel's state: READY while its connection holds; a connection the
        server dropped (GOAWAY) shows as IDLE until the next call reconnects."""
        return self._channel.get_state()

    async def close(self) -> None:
        if self._searches is not None:
            await self._searches.close()
        await self._channel.close()


class _InProcessContext:
    """What a servicer reads of its call's context, for a call made in this process."""

    def __init__(self, metadata: Sequence[tuple[str, str]] | None) -> None:
        self._metadata = tuple(metadata or ())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise rpc_error(code, details)


class _InProcessCall:
    """One servicer method, called as a stub's method is: ``(request, timeout=,
    metadata=)``; a deadline that passes fails with DEADLINE_EXCEEDED, as a channel's."""

    def __init__(self, method: Callable[[Any, Any], Awaitable[Any]]) -> None:
        self._method = method

    async def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  # the stub's signature
        metadata: Sequence[tuple[str, str]] | None = None,
    ) -> Any:
        try:
            return await asyncio.wait_for(
                self._method(request, _InProcessContext(metadata)), timeout
            )
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None


class _InProcessStub:
    def __init__(self, servicer: pb_grpc.MemoryServiceServicer) -> None:
        for name in MemoryStub.__annotations__:
            if name != "SearchStream":  # over a channel only: its point is the channel's cost
                setattr(self, name, _InProcessCall(getattr(servicer, name)))


class InProcessRetrievalClient(RetrievalClient):
    """A :class:`RetrievalClient` of the servicer in this process (no channel)."""

    def __init__(
        self,
        servicer: pb_grpc.MemoryServiceServicer,
        *,
        timeout_s: float = 10.0,
        address: str = "in-process",
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.stub = cast(MemoryStub, _InProcessStub(servicer))
        self._searches = None

    async def is_serving(self, timeout_s: float = 2.0) -> bool:
        return True

    def connectivity(self) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.READY

    async def close(self) -> None:
        return None


def record_search_timings(timings: pb.StageTimings) -> None:
    """A Search's stage timings as ``engram.search.stage.duration`` (the service records
    the searches it serves)."""
    if not timings.total_ms:  # a service (or a test fake) that does not report timings
        return
    for stage, field in SEARCH_STAGES:
        metrics.search_stage_duration.record(
            getattr(timings, field) / 1e3, {semconv.ENGRAM_SEARCH_STAGE: stage}
        )
