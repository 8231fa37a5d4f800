"""The gRPC MemoryService: the edge between protobuf and the domain.

Requests are decoded into domain types (:mod:`engram_core.codec`) and answers encoded
from them; the search is :class:`~engram_retrieval.pipeline.SearchPipeline`, the write
path :class:`~engram_retrieval.writes.MemoryWriter`, and stored payloads are read back as
:class:`~engram_core.memory.MemoryRecord` (:mod:`engram_retrieval.payload`). Known
failures become gRPC statuses here; internals never leak to the caller.

Every call is scoped to ``request.tenant`` (required); the store filters on it, so
another tenant's ids are reported missing and never returned, listed or counted.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import errno
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from engram_core import codec
from engram_core.codec import pb, pb_grpc
from engram_core.ids import normalize_id
from engram_core.logging import get_logger
from engram_core.memory import KIND_NAMES, MemoryFilter, Scores
from engram_core.retrieval_client import SERVICE_NAME, record_search_timings
from engram_core.rpc_tracing import served_call
from engram_retrieval.embedder import SentenceEncoder
from engram_retrieval.payload import format_ts, parse_ts, record_from_payload
from engram_retrieval.pipeline import RequestError as InvalidRequest
from engram_retrieval.pipeline import SearchPipeline
from engram_retrieval.priority import InteractiveFirst, is_interactive
from engram_retrieval.remote_embedder import EmbedderRequestError, EmbedderUnavailable
from engram_retrieval.store import (
    ForeignIdError,
    MemoryStore,
    PageCursor,
    PerSearchedPoint,
    PointFilter,
    StoredPoint,
    StoreError,
)
from engram_retrieval.writes import DEFAULT_PREVIOUS_TURN_WEIGHT, MemoryWriter, Written

log = get_logger(__name__)

R = TypeVar("R")


class RequestError(InvalidRequest):
    """A request the caller must fix, with the status code to report; never retried."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT):
        super().__init__(message)
        self.code = code


def _disk_full(exc: BaseException) -> bool:
    """The store's write failed for lack of space (an OSError, or the embedded store's
    own error carrying the OS message)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return "no space left on device" in str(exc).lower()


def _rpc(
    fn: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    """One SERVER span per call (continuing the caller's trace); known failures become
    gRPC statuses; internals never leak to the caller."""

    @functools.wraps(fn)
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        method = fn.__name__
        metadata = context.invocation_metadata()
        return await self.in_turn(
            is_interactive(metadata), lambda: served(self, method, metadata, request, context)
        )

    async def served(
        self: Any, method: str, metadata: Any, request: Any, context: grpc.aio.ServicerContext
    ) -> R:
        with served_call(SERVICE_NAME, method, metadata) as call:
            try:
                return await fn(self, request, context)
            except Exception as exc:
                code, details = failure_status(method, exc)
                call.failed(code, details)
                await context.abort(code, details)
        raise AssertionError("unreachable: context.abort raises")

    return handler


def failure_status(method: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status a call that raised ``exc`` ends with (the failure logged here)."""
    if isinstance(exc, codec.DecodeError):
        return grpc.StatusCode.INVALID_ARGUMENT, exc.message
    if isinstance(exc, InvalidRequest):
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        return (exc.code if isinstance(exc, RequestError) else invalid), exc.message
    if isinstance(exc, StoreError):
        log.error("store.unavailable", rpc=method, error=str(exc))
        return grpc.StatusCode.UNAVAILABLE, "memory store unavailable"
    if isinstance(exc, EmbedderUnavailable | EmbedderRequestError):
        log.error("embedder.unavailable", rpc=method, error=str(exc))
        return grpc.StatusCode.UNAVAILABLE, "embedding model unavailable"
    if _disk_full(exc):
        # Callers retry UNAVAILABLE until space is freed (nothing dead-lettered).
        log.error("store.disk_full", rpc=method, error=str(exc))
        return grpc.StatusCode.UNAVAILABLE, "memory store: disk full"
    log.error("rpc.failed", rpc=method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"{method} failed"


def _require_tenant(tenant: str) -> str:
    if not tenant or not tenant.strip():
        raise RequestError("tenant is required")
    return tenant


def encode_page_token(cursor: PageCursor) -> str:
    raw = json.dumps([cursor.created_at, cursor.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_token(token: str) -> PageCursor:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        created_at, point_id = json.loads(raw)
        parse_ts(created_at)
        if normalize_id(point_id) != point_id:
            raise ValueError("not a point id")
    except (binascii.Error, ValueError, TypeError) as exc:
        raise RequestError("page_token is not one this service issued") from exc
    return PageCursor(created_at=created_at, id=point_id)


def _point_filter(tenant: str, flt: MemoryFilter) -> PointFilter:
    """A domain filter as the store reads it: ``created_at`` bounds in the payload's
    timestamp format."""
    return PointFilter(
        tenant=tenant,
        user_id=flt.user_id,
        conversation_id=flt.conversation_id,
        kinds=flt.kinds,
        tags=flt.tags,
        source_ids=flt.source_ids,
        role=flt.role,
        include_superseded=flt.include_superseded,
        created_after=format_ts(flt.created_after) if flt.created_after is not None else None,
        created_before=format_ts(flt.created_before) if flt.created_before is not None else None,
    )


@functools.lru_cache(maxsize=16384)
def _timestamp(stored: str) -> Timestamp:
    """A payload's timestamp text as its protobuf Timestamp: the same memories, so the
    same texts, come back search after search. Never handed out, only copied from."""
    return codec.to_timestamp(parse_ts(stored))


def _memory(point: StoredPoint) -> pb.Memory:
    """A stored point as the caller receives it (with its tenant and embedding model):
    the message ``codec.record_to_pb(record_from_payload(...))`` makes (a test holds them
    equal), encoded from the payload without the record in between, whose construction
    was a third of the encoding of a Search's hits."""
    payload = point.payload
    tenant, model = payload.get("tenant", ""), payload.get("embedding_model", "")
    if payload.get("profile"):  # the record fills in what an older entry lacks
        record = record_from_payload(point.id, payload)
        return codec.record_to_pb(record, tenant=tenant, embedding_model=model)
    memory = pb.Memory(
        id=point.id,
        tenant=tenant,
        user_id=payload.get("user_id", ""),
        conversation_id=payload.get("conversation_id", ""),
        kind=codec.KIND_BY_NAME.get(payload.get("kind", ""), pb.MEMORY_KIND_UNSPECIFIED),
        text=payload.get("text", ""),
        role=payload.get("role", ""),
        source_id=payload.get("source_id", ""),
        turn_index=int(payload.get("turn_index") or 0),
        source_turn_ids=list(payload.get("source_turn_ids") or []),
        superseded_by=payload.get("superseded_by") or "",
        tags=list(payload.get("tags") or []),
        embedding_model=model,
        metadata=dict(payload.get("metadata") or {}),
    )
    for name in _TIMESTAMP_FIELDS:
        if stored := payload.get(name):
            getattr(memory, name).CopyFrom(_timestamp(stored))
    if turn_range := payload.get("turn_range"):
        memory.turn_range.CopyFrom(
            pb.TurnRange(
                first_turn=int(turn_range["first_turn"]), last_turn=int(turn_range["last_turn"])
            )
        )
    return memory


_TIMESTAMP_FIELDS = ("created_at", "updated_at", "valid_from", "valid_to")


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    """engram.memory.v1.MemoryService over a :class:`MemoryStore`: validation and
    protobuf in and out; the search itself is :class:`SearchPipeline`."""

    def __init__(
        self,
        store: MemoryStore,
        embedder: SentenceEncoder,
        pipeline: SearchPipeline,
        *,
        previous_turn_weight: float = DEFAULT_PREVIOUS_TURN_WEIGHT,
        background_wait_s: float = 0.0,
    ) -> None:
        """``background_wait_s``: how long a call waits for the interactive ones in
        flight before it starts (ENGRAM_RETRIEVAL_BACKGROUND_WAIT_MS; 0: arrival order)."""
        self.store = store
        self.priority = InteractiveFirst(background_wait_s)
        self.embedder = embedder
        self.pipeline = pipeline
        # A hit's message, encoded once per payload the store hands out (pipeline.signals
        # does the same for the ranking)
        self.searched_memory = PerSearchedPoint(store.kept_search_points, _memory)
        self._search_streams: set[asyncio.Task[None]] = set()  # their reading tasks
        self._answering_inline: set[asyncio.Task[None]] = set()  # of those, mid-answer
        self._search_streams_ended = False
        self.writer = MemoryWriter(
            store,
            embedder,
            encoder=pipeline.encoder,
            lexical=pipeline.lexical,
            clock=pipeline.clock,
            tracer=pipeline.tracer,
            previous_turn_weight=previous_turn_weight,
        )

    # -- Search -----------------------------------------------------------------------

    async def in_turn(self, interactive: bool, serve: Callable[[], Awaitable[R]]) -> R:
        """``serve()`` once the priority allows: an interactive call at once (counted in
        flight), any other after the interactive ones in flight (engram_retrieval.priority)."""
        if interactive:
            async with self.priority.interactive():
                return await serve()
        await self.priority.background()
        return await serve()

    @_rpc
    async def Search(
        self, request: pb.SearchRequest, context: grpc.aio.ServicerContext
    ) -> pb.SearchResponse:
        response = pb.SearchResponse()
        await self._search(request, response, is_interactive(context.invocation_metadata()))
        return response

    async def _search(
        self, request: pb.SearchRequest, response: pb.SearchResponse, interactive: bool
    ) -> None:
        """Runs the search and writes its answer into ``response`` (filled in place: a
        message built beside it and copied in costs the copy)."""
        pause = None if interactive else self.priority.between_steps
        ranked = await self.pipeline.run(codec.search_query(request), pause=pause)
        response.outcome = codec.OUTCOME_BY_NAME[ranked.outcome]
        response.candidates_considered = ranked.considered
        response.timings.MergeFrom(pb.StageTimings(**vars(ranked.timings)))
        for hit in ranked.hits:
            # Filled in place: a SearchHit built beside the reply and appended to it was
            # copied twice, its memory with it.
            encoded = response.hits.add()
            encoded.memory.CopyFrom(self.searched_memory.of(hit.point))
            codec.fill_scores(
                encoded.scores,
                Scores(hit.dense, hit.sparse, hit.relevance, hit.recency, hit.total, hit.mmr),
            )
            encoded.scope = codec.SCOPE_BY_NAME[hit.scope]
        if ranked.summary is not None:
            response.summary.CopyFrom(_memory(ranked.summary))
        response.profile.extend(_memory(p) for p in ranked.profile)
        # Recorded here, where the stages ran, and after this returns (while gRPC sends
        # the reply): in the gateway, five histogram records stood between a chat's
        # memory and its model call.
        asyncio.get_running_loop().call_soon(record_search_timings, response.timings)
        log.debug(
            "search.served",
            tenant=request.tenant,
            outcome=ranked.outcome,
            hits=len(ranked.hits),
            candidates=ranked.considered,
            total_ms=round(ranked.timings.total_ms, 2),
        )

    async def SearchStream(
        self,
        requests: AsyncIterator[pb.StreamedSearch],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """A caller's searches as messages on one stream (the gateway's). Each is served
        as a unary Search is (its own SERVER span continuing the trace its message
        carries, the priority the stream was opened with, the same statuses) and
        answered by id when it is done; searches that wait on I/O (a Qdrant server, a
        remote embedder) run side by side, in a task each. The
        stream ends when the caller closes it, or, its searches answered, when the
        service stops (:meth:`end_search_streams`)."""
        if self._search_streams_ended:
            return
        interactive = is_interactive(context.invocation_metadata())
        # A search that runs from its first line to its reply without giving the loop
        # away (pipeline.runs_through) is answered where it is read: a task of its own
        # would run no sooner, and costs a chat a loop turn (0.15 ms after 100 ms idle).
        one_at_a_time = interactive and self.pipeline.runs_through
        writing = asyncio.Lock()  # one message at a time on the call
        answering: set[asyncio.Task[None]] = set()

        async def answer(message: pb.StreamedSearch) -> None:
            reply = pb.StreamedSearchReply(id=message.id)
            code, details = await self.in_turn(
                interactive, lambda: self._streamed_search(message, reply.response, interactive)
            )
            if code != grpc.StatusCode.OK:
                reply.ClearField("response")
                reply.status_code = code.value[0]
                reply.status_details = details
            try:
                async with writing:
                    await context.write(reply)
            except (asyncio.InvalidStateError, grpc.RpcError, grpc.aio.UsageError) as exc:
                # The stream is gone (the caller closed it or the connection broke);
                # the caller fails the searches it was waiting for.
                log.info("search_stream.reply_undelivered", error=f"{type(exc).__name__}: {exc}")

        async def read() -> None:
            async for message in requests:
                if one_at_a_time:
                    self._answering_inline.add(reading)  # not cancelled mid-answer
                    try:
                        await answer(message)
                    finally:
                        self._answering_inline.discard(reading)
                    if self._search_streams_ended:
                        return
                    continue
                task = asyncio.ensure_future(answer(message))
                answering.add(task)
                task.add_done_callback(answering.discard)

        reading = asyncio.ensure_future(read())
        self._search_streams.add(reading)
        try:
            # Not awaited directly: reading cancelled by end_search_streams ends the
            # stream, it does not cancel this handler.
            await asyncio.wait({reading})
            if answering:
                await asyncio.wait(set(answering))
        except asyncio.CancelledError:  # the caller went away
            reading.cancel()
            for task in answering:
                task.cancel()
            raise
        finally:
            self._search_streams.discard(reading)
        failure = None if reading.cancelled() else reading.exception()
        if failure is not None:  # the requests could not be read: the call is broken
            raise failure

    async def _streamed_search(
        self, message: pb.StreamedSearch, response: pb.SearchResponse, interactive: bool
    ) -> tuple[grpc.StatusCode, str]:
        with served_call(SERVICE_NAME, "Search", message.trace_context.items()) as call:
            try:
                await self._search(message.request, response, interactive)
            except Exception as exc:
                code, details = failure_status("Search", exc)
                call.failed(code, details)
                return code, details
        return grpc.StatusCode.OK, ""

    def end_search_streams(self) -> None:
        """The service is stopping: open search streams stop reading, answer what they
        hold and end (their callers fall back to reopening, which a stopping server
        refuses); streams opened from now on end at once."""
        self._search_streams_ended = True
        for reading in self._search_streams - self._answering_inline:
            reading.cancel()  # waiting for its next message

    # -- Writes -----------------------------------------------------------------------

    @_rpc
    async def Upsert(
        self, request: pb.UpsertRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpsertResponse:
        tenant = _require_tenant(request.tenant)
        if len(request.memories) > codec.MAX_UPSERT_BATCH:
            raise RequestError(f"at most {codec.MAX_UPSERT_BATCH} memories per Upsert")
        records = [
            codec.record_to_write(tenant, memory, f"memories[{i}]")
            for i, memory in enumerate(request.memories)
        ]
        try:
            written = await self.writer.upsert(tenant, records)
        except ForeignIdError as exc:
            raise RequestError(
                f"ids already exist: {', '.join(exc.ids)}", grpc.StatusCode.ALREADY_EXISTS
            ) from exc
        return pb.UpsertResponse(results=[_result(w) for w in written])

    @_rpc
    async def Delete(
        self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteResponse:
        tenant = _require_tenant(request.tenant)
        requested = _ids(request.ids)
        valid = [n for _, n in requested if n is not None]
        deleted = set(await self.writer.forget(tenant, valid))
        response = pb.DeleteResponse()
        for raw, point_id in requested:
            if point_id in deleted:
                response.deleted_ids.append(point_id)
            else:
                response.missing_ids.append(raw)
        return response

    # -- Reads ------------------------------------------------------------------------

    @_rpc
    async def Get(
        self, request: pb.GetRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetResponse:
        tenant = _require_tenant(request.tenant)
        requested = _ids(request.ids)
        found = {
            p.id: p
            for p in await self.store.retrieve(tenant, [n for _, n in requested if n is not None])
        }
        response = pb.GetResponse()
        for raw, point_id in requested:
            point = found.get(point_id) if point_id else None
            if point is None:
                response.missing_ids.append(raw)
            else:
                response.memories.append(_memory(point))
        return response

    @_rpc
    async def List(
        self, request: pb.ListRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListResponse:
        tenant = _require_tenant(request.tenant)
        if request.page_size < 0:
            raise RequestError("page_size must not be negative")
        page_size = min(request.page_size or codec.DEFAULT_PAGE_SIZE, codec.MAX_PAGE_SIZE)
        after = decode_page_token(request.page_token) if request.page_token else None
        flt = _point_filter(tenant, codec.filter_from_pb(request.filter))
        page = await self.store.list_page(flt, page_size, after)
        return pb.ListResponse(
            memories=[_memory(p) for p in page.points],
            next_page_token=encode_page_token(page.next) if page.next else "",
        )

    @_rpc
    async def Count(
        self, request: pb.CountRequest, context: grpc.aio.ServicerContext
    ) -> pb.CountResponse:
        tenant = _require_tenant(request.tenant)
        flt = _point_filter(tenant, codec.filter_from_pb(request.filter, kinds_default=KIND_NAMES))
        if len(flt.kinds) == 1:
            by_kind = {flt.kinds[0]: await self.store.count(flt)}
        else:  # one facet over the kind index instead of one count per kind
            found = dict(await self.store.facet(flt, "kind", len(flt.kinds)))
            by_kind = {kind: found.get(kind, 0) for kind in flt.kinds}
        return pb.CountResponse(count=sum(by_kind.values()), by_kind=by_kind)

    @_rpc
    async def ListScopes(
        self, request: pb.ListScopesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListScopesResponse:
        """The tenant's users (``user_id`` unset) or one user's conversations, from the
        store's facet counts of the keyword index: most memories first."""
        tenant = _require_tenant(request.tenant)
        if not 0 <= request.limit <= codec.MAX_SCOPES_LIMIT:
            raise RequestError(f"limit must be within [0, {codec.MAX_SCOPES_LIMIT}]")
        limit = request.limit or codec.DEFAULT_SCOPES_LIMIT
        by_user = request.HasField("user_id")
        flt = PointFilter(
            tenant=tenant,
            user_id=request.user_id if by_user else None,
            include_superseded=request.include_superseded,
        )
        key = "conversation_id" if by_user else "user_id"
        found = await self.store.facet(flt, key, limit + 1)
        response = pb.ListScopesResponse(truncated=len(found) > limit)
        for value, count in found[:limit]:
            response.scopes.append(
                pb.ScopeEntry(
                    user_id=request.user_id if by_user else value,
                    conversation_id=value if by_user else "",
                    memories=count,
                )
            )
        return response


def _ids(raw_ids: Sequence[str]) -> list[tuple[str, str | None]]:
    if len(raw_ids) > codec.MAX_IDS:
        raise RequestError(f"at most {codec.MAX_IDS} ids per call")
    return list(dict.fromkeys((raw, normalize_id(raw)) for raw in raw_ids))


def _result(written: Written) -> pb.UpsertResult:
    """The outcome of one memory, with the stored timestamps."""
    result = pb.UpsertResult(id=written.id, status=codec.STATUS_BY_NAME[written.status])
    result.created_at.CopyFrom(codec.to_timestamp(written.created_at))
    result.updated_at.CopyFrom(codec.to_timestamp(written.updated_at))
    return result
