"""The retrieval port: the one way every process reads and writes memories.

Typed on the domain (:mod:`engram_core.memory`): callers hand in and get back
``MemoryRecord``, ``MemoryFilter``, ``SearchQuery`` and ``SearchResult``; the
translation to and from protobuf, and the service's limits, are :mod:`engram_core.codec`.
Every failed call raises :class:`RetrievalError`, classified once: ``retryable`` tells a
worker whether to retry (the runtime acts on it) and ``http_status`` tells the gateway
what to answer. Nothing connects at import; build the port on a
:class:`~engram_core.retrieval_client.RetrievalClient` inside a lifespan.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from engram_core.codec import (
    MAX_IDS,
    MAX_PAGE_SIZE,
    filter_to_pb,
    from_timestamp,
    pb,
    query_to_pb,
    record_from_pb,
    record_to_pb,
    result_from_pb,
    upsert_status,
)
from engram_core.memory import (
    KindCounts,
    MemoryFilter,
    MemoryRecord,
    Page,
    ScopeCount,
    ScopeList,
    SearchQuery,
    SearchResult,
    Stored,
)
from engram_core.retrieval_client import RetrievalClient

T = TypeVar("T")

#: Codes for which the same call could succeed later: the service or the network is
#: busy, restarting or unreachable. Anything else is a property of the request.
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
}


class RetrievalError(Exception):
    """A retrieval call failed. ``retryable``: the same call may succeed later."""

    def __init__(self, call: str, code: grpc.StatusCode, details: str) -> None:
        suffix = f": {details}" if details else ""
        super().__init__(f"retrieval {call} failed: {code.name}{suffix}")
        self.call = call
        self.code = code
        self.details = details

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES

    @property
    def http_status(self) -> int:
        """400/404/409 for what the caller must change; 503 for everything else."""
        return _HTTP_STATUS.get(self.code, 503)


def classify(call: str, exc: grpc.aio.AioRpcError) -> RetrievalError:
    return RetrievalError(call, exc.code(), exc.details() or "")


async def _call(call: str, awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except grpc.aio.AioRpcError as exc:
        raise classify(call, exc) from exc


@dataclass(frozen=True)
class StageTimings:
    """Where one search spent its time in the service, in ms (``engram bench``)."""

    embed_ms: float
    candidates_ms: float
    rerank_ms: float
    mmr_ms: float
    total_ms: float


class MemoryPort:
    """Memories of a retrieval service, in domain types. Every method takes the tenant;
    the service enforces it, so another tenant's ids are simply missing."""

    def __init__(self, client: RetrievalClient) -> None:
        self.client = client

    async def search(self, query: SearchQuery) -> SearchResult:
        return result_from_pb(await _call("Search", self.client.search(query_to_pb(query))))

    async def search_timed(self, query: SearchQuery) -> tuple[SearchResult, StageTimings]:
        """A search and the service's time per stage."""
        reply = await _call("Search", self.client.search(query_to_pb(query)))
        t = reply.timings
        timings = StageTimings(t.embed_ms, t.candidates_ms, t.rerank_ms, t.mmr_ms, t.total_ms)
        return result_from_pb(reply), timings

    async def get(self, tenant: str, ids: Iterable[str]) -> dict[str, MemoryRecord]:
        """The memories among ``ids`` that exist for ``tenant``, by id."""
        wanted = list(dict.fromkeys(i for i in ids if i))
        found: dict[str, MemoryRecord] = {}
        for start in range(0, len(wanted), MAX_IDS):
            reply = await _call(
                "Get",
                self.client.get(pb.GetRequest(tenant=tenant, ids=wanted[start : start + MAX_IDS])),
            )
            found.update((m.id, record_from_pb(m)) for m in reply.memories)
        return found

    async def get_one(self, tenant: str, memory_id: str) -> MemoryRecord | None:
        return (await self.get(tenant, [memory_id])).get(memory_id)

    async def upsert(self, tenant: str, records: Sequence[MemoryRecord]) -> list[Stored]:
        """Write ``records`` (in one call); each comes back as stored, in order. The
        service sets ``updated_at`` (and ``created_at`` when a record has none)."""
        if not records:
            return []
        request = pb.UpsertRequest(
            tenant=tenant, memories=[record_to_pb(r, tenant=tenant) for r in records]
        )
        reply = await _call("Upsert", self.client.upsert(request))
        stored = []
        for record, result in zip(records, reply.results, strict=True):
            update: dict[str, object] = {"id": result.id}
            if result.HasField("created_at"):
                update["created_at"] = from_timestamp(result.created_at)
            if result.HasField("updated_at"):
                update["updated_at"] = from_timestamp(result.updated_at)
            stored.append(
                Stored(
                    record.model_copy(update=update),
                    upsert_status(result.status),
                )
            )
        return stored

    async def delete(self, tenant: str, ids: Iterable[str]) -> list[str]:
        """Delete the tenant's memories among ``ids``; returns the ids deleted."""
        wanted = list(dict.fromkeys(i for i in ids if i))
        deleted: list[str] = []
        for start in range(0, len(wanted), MAX_IDS):
            reply = await _call(
                "Delete",
                self.client.delete(
                    pb.DeleteRequest(tenant=tenant, ids=wanted[start : start + MAX_IDS])
                ),
            )
            deleted.extend(reply.deleted_ids)
        return deleted

    async def list_page(
        self, tenant: str, flt: MemoryFilter, *, page_size: int = 50, page_token: str = ""
    ) -> Page:
        """One page, newest first."""
        reply = await _call(
            "List",
            self.client.list(
                pb.ListRequest(
                    tenant=tenant,
                    filter=filter_to_pb(flt),
                    page_size=page_size,
                    page_token=page_token,
                )
            ),
        )
        return Page(
            [record_from_pb(m) for m in reply.memories],
            reply.next_page_token,
            {m.id: m.embedding_model for m in reply.memories},
        )

    async def iter_pages(
        self, tenant: str, flt: MemoryFilter, *, page_size: int = MAX_PAGE_SIZE
    ) -> AsyncIterator[Page]:
        """Every page the filter selects, newest first (the one pagination loop)."""
        token = ""
        while True:
            page = await self.list_page(tenant, flt, page_size=page_size, page_token=token)
            yield page
            token = page.next_token
            if not token:
                return

    async def iter_list(
        self, tenant: str, flt: MemoryFilter, *, page_size: int = MAX_PAGE_SIZE
    ) -> AsyncIterator[MemoryRecord]:
        """Every memory the filter selects, newest first, a page at a time."""
        async for page in self.iter_pages(tenant, flt, page_size=page_size):
            for record in page.records:
                yield record

    async def list_all(self, tenant: str, flt: MemoryFilter) -> list[MemoryRecord]:
        return [record async for record in self.iter_list(tenant, flt)]

    async def count(self, tenant: str, flt: MemoryFilter) -> KindCounts:
        reply = await _call(
            "Count", self.client.count(pb.CountRequest(tenant=tenant, filter=filter_to_pb(flt)))
        )
        return KindCounts(total=int(reply.count), by_kind=dict(reply.by_kind))

    async def list_scopes(
        self,
        tenant: str,
        *,
        user_id: str | None = None,
        limit: int = 100,
        include_superseded: bool = False,
    ) -> ScopeList:
        """The tenant's users (``user_id`` None) or that user's conversations, with their
        memory counts, most first."""
        request = pb.ListScopesRequest(
            tenant=tenant, limit=limit, include_superseded=include_superseded
        )
        if user_id is not None:
            request.user_id = user_id
        reply = await _call("ListScopes", self.client.list_scopes(request))
        return ScopeList(
            [ScopeCount(s.user_id, s.conversation_id, int(s.memories)) for s in reply.scopes],
            reply.truncated,
        )

    @property
    def address(self) -> str:
        """Where the memories are served from (for logs)."""
        return self.client.address

    async def is_serving(self, timeout_s: float = 2.0) -> bool:
        return await self.client.is_serving(timeout_s=timeout_s)

    async def until_serving(self) -> None:
        """Wait until retrieval serves (see :meth:`RetrievalClient.until_serving`)."""
        await self.client.until_serving()
