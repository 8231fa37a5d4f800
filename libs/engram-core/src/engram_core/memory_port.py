"""The retrieval port: the one way every process reads and writes memories.

Typed on the domain (:mod:`engram_core.memory`): callers hand in and get back
``MemoryRecord``, ``MemoryFilter``, ``SearchQuery`` and ``SearchResult``; protobuf stays
here, at the gRPC edge. Every failed call raises :class:`RetrievalError`, classified once:
``retryable`` tells a worker whether to retry (the runtime acts on it) and
``http_status`` tells the gateway what to answer. Nothing connects at import; build the
port on a :class:`~engram_core.retrieval_client.RetrievalClient` inside a lifespan.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from typing import TypeVar

import grpc

from engram_core.memory import (
    KindCounts,
    MemoryFilter,
    MemoryRecord,
    Page,
    ScopeCount,
    ScopeList,
    ScopeName,
    Scores,
    SearchHit,
    SearchOutcome,
    SearchQuery,
    SearchResult,
    Stored,
    UpsertStatus,
)
from engram_core.memory_record import record_from_pb, record_to_pb
from engram_core.proto import KIND_BY_NAME, from_timestamp, pb, to_timestamp
from engram_core.retrieval_client import RetrievalClient

T = TypeVar("T")

#: The service's caps (engram_retrieval.service): the largest page and id batch.
MAX_PAGE_SIZE = 500
MAX_IDS = 1000

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
_OUTCOMES: dict[int, SearchOutcome] = {
    pb.SEARCH_OUTCOME_RANKED: "ranked",
    pb.SEARCH_OUTCOME_SMALL_STORE: "small_store",
    pb.SEARCH_OUTCOME_NOTHING_RELEVANT: "nothing_relevant",
    pb.SEARCH_OUTCOME_EMPTY: "empty",
    pb.SEARCH_OUTCOME_OVERVIEW: "overview",
}
_STATUSES = {
    pb.UPSERT_STATUS_CREATED: UpsertStatus.CREATED,
    pb.UPSERT_STATUS_UPDATED: UpsertStatus.UPDATED,
    pb.UPSERT_STATUS_UNCHANGED: UpsertStatus.UNCHANGED,
}
_SCOPES: dict[pb.Scope, ScopeName] = {
    pb.SCOPE_CONVERSATION: "conversation",
    pb.SCOPE_USER: "user",
    pb.SCOPE_GLOBAL: "global",
}
_SCOPE_VALUES = {name: value for value, name in _SCOPES.items()}


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


def filter_to_pb(flt: MemoryFilter) -> pb.MemoryFilter:
    message = pb.MemoryFilter(
        conversation_id=flt.conversation_id or "",
        kinds=[KIND_BY_NAME[k] for k in flt.kinds],
        tags=list(flt.tags),
        include_superseded=flt.include_superseded,
        source_ids=list(flt.source_ids),
        role=flt.role or "",
    )
    if flt.user_id is not None:
        message.user_id = flt.user_id  # set, even to "": exactly this user
    if flt.created_after is not None:
        message.created_after.CopyFrom(to_timestamp(flt.created_after))
    if flt.created_before is not None:
        message.created_before.CopyFrom(to_timestamp(flt.created_before))
    return message


def query_to_pb(query: SearchQuery) -> pb.SearchRequest:
    """Only the knobs someone set are sent; retrieval applies its defaults to the rest."""
    request = pb.SearchRequest(
        tenant=query.tenant,
        query=query.text,
        user_id=query.user_id,
        conversation_id=query.conversation_id,
        scopes=[_SCOPE_VALUES[s] for s in query.scopes],
        kinds=[KIND_BY_NAME[k] for k in query.kinds],
        include_superseded=query.include_superseded,
        hits_only=not query.attachments,
    )
    for name in ("top_k", "recency_weight", "score_threshold", "mmr_lambda"):
        value = getattr(query, name)
        if value is not None:
            setattr(request, name, value)
    if query.now is not None:
        request.now.CopyFrom(to_timestamp(query.now))
    return request


def _hit(hit: pb.SearchHit) -> SearchHit:
    s = hit.scores
    return SearchHit(
        memory=record_from_pb(hit.memory),
        scores=Scores(
            dense=float(s.dense),
            sparse=float(s.sparse) if s.HasField("sparse") else None,
            relevance=float(s.relevance),
            recency=float(s.recency),
            total=float(s.total),
            mmr=float(s.mmr),
        ),
        scope=_SCOPES.get(hit.scope),
    )


def result_from_pb(reply: pb.SearchResponse) -> SearchResult:
    summary = reply.summary if reply.HasField("summary") and reply.summary.id else None
    return SearchResult(
        outcome=_OUTCOMES.get(reply.outcome, "ranked"),
        hits=[_hit(h) for h in reply.hits],
        summary=record_from_pb(summary) if summary is not None else None,
        profile=[record_from_pb(m) for m in reply.profile],
        candidates_considered=int(reply.candidates_considered),
    )


class MemoryPort:
    """Memories of a retrieval service, in domain types. Every method takes the tenant;
    the service enforces it, so another tenant's ids are simply missing."""

    def __init__(self, client: RetrievalClient) -> None:
        self.client = client

    async def search(self, query: SearchQuery) -> SearchResult:
        return result_from_pb(await _call("Search", self.client.search(query_to_pb(query))))

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
                    _STATUSES.get(result.status, UpsertStatus.UPDATED),
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
