"""The gRPC MemoryService: validation, the search pipeline, and the write path.

Every call is scoped to ``request.tenant`` (required); the store filters on it, so
another tenant's ids are reported missing and never returned, listed or counted.
"""

from __future__ import annotations

import base64
import binascii
import errno
import functools
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC
from typing import Any, Literal, TypeVar

import grpc
import numpy as np

from engram_core import semconv
from engram_core.logging import get_logger
from engram_core.memory import DEFAULT_CONVERSATION, MemoryKindName, ScopeName, SearchQuery
from engram_core.proto import KIND_NAMES, from_timestamp, kind_name, pb, pb_grpc, to_timestamp
from engram_core.retrieval_client import SERVICE_NAME
from engram_core.rpc_tracing import served_call
from engram_retrieval.embedder import SentenceEncoder
from engram_retrieval.payload import (
    build_payload,
    derive_id,
    format_ts,
    identity_text,
    index_key,
    normalize_id,
    parse_ts,
    payload_to_memory,
)
from engram_retrieval.pipeline import OutcomeName, SearchPipeline
from engram_retrieval.pipeline import RequestError as InvalidRequest
from engram_retrieval.remote_embedder import EmbedderRequestError, EmbedderUnavailable
from engram_retrieval.store import (
    ForeignIdError,
    MemoryStore,
    PageCursor,
    PointFilter,
    StoredPoint,
    StoreError,
)

log = get_logger(__name__)

_KINDS: dict[int, MemoryKindName] = {
    pb.MEMORY_KIND_TURN: "turn",
    pb.MEMORY_KIND_FACT: "fact",
    pb.MEMORY_KIND_PROFILE: "profile",
    pb.MEMORY_KIND_SUMMARY: "summary",
    pb.MEMORY_KIND_EPISODE: "episode",
}
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_UPSERT_BATCH = 2048
MAX_IDS = 1000
DEFAULT_SCOPES_LIMIT = 100
MAX_SCOPES_LIMIT = 1000

_OUTCOMES: dict[OutcomeName, pb.SearchOutcome] = {
    "ranked": pb.SEARCH_OUTCOME_RANKED,
    "small_store": pb.SEARCH_OUTCOME_SMALL_STORE,
    "nothing_relevant": pb.SEARCH_OUTCOME_NOTHING_RELEVANT,
    "empty": pb.SEARCH_OUTCOME_EMPTY,
    "overview": pb.SEARCH_OUTCOME_OVERVIEW,
}
_SCOPES: dict[pb.Scope, ScopeName] = {
    pb.SCOPE_CONVERSATION: "conversation",
    pb.SCOPE_USER: "user",
    pb.SCOPE_GLOBAL: "global",
}
_SCOPE_VALUES = {name: value for value, name in _SCOPES.items()}

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
        with served_call(SERVICE_NAME, method, context.invocation_metadata()) as call:

            async def abort(code: grpc.StatusCode, details: str) -> None:
                call.failed(code, details)
                await context.abort(code, details)

            try:
                return await fn(self, request, context)
            except InvalidRequest as exc:
                invalid = grpc.StatusCode.INVALID_ARGUMENT
                await abort(exc.code if isinstance(exc, RequestError) else invalid, exc.message)
            except StoreError as exc:
                log.error("store.unavailable", rpc=method, error=str(exc))
                await abort(grpc.StatusCode.UNAVAILABLE, "memory store unavailable")
            except (EmbedderUnavailable, EmbedderRequestError) as exc:
                log.error("embedder.unavailable", rpc=method, error=str(exc))
                await abort(grpc.StatusCode.UNAVAILABLE, "embedding model unavailable")
            except Exception as exc:
                if _disk_full(exc):
                    # Callers retry UNAVAILABLE until space is freed (nothing dead-lettered).
                    log.error("store.disk_full", rpc=method, error=str(exc))
                    await abort(grpc.StatusCode.UNAVAILABLE, "memory store: disk full")
                log.exception("rpc.failed", rpc=method)
                await abort(grpc.StatusCode.INTERNAL, f"{method} failed")
        raise AssertionError("unreachable: context.abort raises")

    return handler


def _require_tenant(tenant: str) -> str:
    if not tenant or not tenant.strip():
        raise RequestError("tenant is required")
    return tenant


def _kind_names(kinds: Sequence[int], default: Sequence[str], field: str) -> tuple[str, ...]:
    names = []
    for kind in kinds:
        name = kind_name(kind)
        if name == "unspecified":
            raise RequestError(f"{field}: unknown memory kind {kind}")
        names.append(name)
    return tuple(dict.fromkeys(names)) if names else tuple(default)


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


def _kind_tuple(kinds: Sequence[int], field: str) -> tuple[MemoryKindName, ...]:
    names: list[MemoryKindName] = []
    for kind in kinds:
        name = _KINDS.get(kind)
        if name is None:
            raise RequestError(f"{field}: unknown memory kind {kind}")
        names.append(name)
    return tuple(dict.fromkeys(names))


def search_query(request: pb.SearchRequest) -> SearchQuery:
    """The domain query of a SearchRequest; unknown enum values are the caller's error."""
    scopes: list[ScopeName] = []
    for scope in request.scopes:
        if scope not in _SCOPES:
            raise RequestError(f"scopes: unknown scope {scope}")
        scopes.append(_SCOPES[scope])
    return SearchQuery(
        tenant=request.tenant,
        text=request.query,
        user_id=request.user_id,
        conversation_id=request.conversation_id or DEFAULT_CONVERSATION,
        top_k=request.top_k if request.HasField("top_k") else None,
        recency_weight=request.recency_weight if request.HasField("recency_weight") else None,
        score_threshold=request.score_threshold if request.HasField("score_threshold") else None,
        mmr_lambda=request.mmr_lambda if request.HasField("mmr_lambda") else None,
        scopes=tuple(scopes),
        kinds=_kind_tuple(request.kinds, "kinds"),
        now=from_timestamp(request.now) if request.HasField("now") else None,
        include_superseded=request.include_superseded,
        attachments=not request.hits_only,
    )


def _filter_from(
    tenant: str, flt: pb.MemoryFilter, *, kinds_default: Sequence[str] = ()
) -> PointFilter:
    return PointFilter(
        tenant=tenant,
        user_id=flt.user_id if flt.HasField("user_id") else None,
        conversation_id=flt.conversation_id or None,
        kinds=_kind_names(flt.kinds, kinds_default, "filter.kinds"),
        tags=tuple(flt.tags),
        source_ids=tuple(flt.source_ids),
        role=flt.role or None,
        include_superseded=flt.include_superseded,
        created_after=_created_bound(flt, "created_after"),
        created_before=_created_bound(flt, "created_before"),
    )


def _created_bound(
    flt: pb.MemoryFilter, name: Literal["created_after", "created_before"]
) -> str | None:
    """A ``created_at`` bound as the payload's timestamps, or None when not set."""
    if not flt.HasField(name):
        return None
    return format_ts(getattr(flt, name).ToDatetime(tzinfo=UTC))


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    """engram.memory.v1.MemoryService over a :class:`MemoryStore`: validation and
    protobuf in and out; the search itself is :class:`SearchPipeline`."""

    def __init__(
        self, store: MemoryStore, embedder: SentenceEncoder, pipeline: SearchPipeline
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.pipeline = pipeline
        self.lexical = pipeline.lexical
        self.clock = pipeline.clock
        self.tracer = pipeline.tracer
        # Summaries are attached by id and never searched by similarity (Search refuses
        # the kind), so they are not run through the model: a 2,000-character summary
        # costs eight times a turn, and it is rewritten on every fact. They get a fixed
        # unit vector instead.
        self.unsearched_vector = np.eye(1, embedder.dim, dtype=np.float32)[0]

    # -- Search -----------------------------------------------------------------------

    @_rpc
    async def Search(
        self, request: pb.SearchRequest, context: grpc.aio.ServicerContext
    ) -> pb.SearchResponse:
        ranked = await self.pipeline.run(search_query(request))
        response = pb.SearchResponse(
            outcome=_OUTCOMES[ranked.outcome],
            candidates_considered=ranked.considered,
            timings=pb.StageTimings(**vars(ranked.timings)),
        )
        for hit in ranked.hits:
            scores = pb.ScoreBreakdown(
                dense=hit.dense,
                relevance=hit.relevance,
                recency=hit.recency,
                total=hit.total,
                mmr=hit.mmr,
            )
            if hit.sparse is not None:
                scores.sparse = hit.sparse
            response.hits.append(
                pb.SearchHit(
                    memory=payload_to_memory(hit.point.id, hit.point.payload),
                    scores=scores,
                    scope=_SCOPE_VALUES[hit.scope],
                )
            )
        if ranked.summary is not None:
            response.summary.CopyFrom(payload_to_memory(ranked.summary.id, ranked.summary.payload))
        response.profile.extend(payload_to_memory(p.id, p.payload) for p in ranked.profile)
        log.debug(
            "search.served",
            tenant=request.tenant,
            outcome=ranked.outcome,
            hits=len(ranked.hits),
            candidates=ranked.considered,
            total_ms=round(ranked.timings.total_ms, 2),
        )
        return response

    # -- Writes -----------------------------------------------------------------------

    @_rpc
    async def Upsert(
        self, request: pb.UpsertRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpsertResponse:
        tenant = _require_tenant(request.tenant)
        if len(request.memories) > MAX_UPSERT_BATCH:
            raise RequestError(f"at most {MAX_UPSERT_BATCH} memories per Upsert")
        ids: list[str] = []
        for i, memory in enumerate(request.memories):
            where = f"memories[{i}]"
            if memory.tenant and memory.tenant != tenant:
                raise RequestError(f"{where}.tenant differs from the request's tenant")
            if memory.kind not in KIND_NAMES:
                raise RequestError(f"{where}.kind: unknown memory kind {memory.kind}")
            if not identity_text(memory).strip():
                raise RequestError(f"{where}: text is empty (profile entries may use profile)")
            if memory.id:
                point_id = normalize_id(memory.id)
                if point_id is None:
                    raise RequestError(f"{where}.id is not a UUID: {memory.id!r}")
            else:
                point_id = derive_id(tenant, memory)
            ids.append(point_id)

        existing = {p.id: p for p in await self.store.retrieve(tenant, ids, with_vectors=True)}
        now = self.clock()
        pending: dict[str, StoredPoint] = {}
        to_embed: list[tuple[str, str]] = []
        results: list[pb.UpsertResult] = []
        for point_id, memory in zip(ids, request.memories, strict=True):
            previous = pending.get(point_id) or existing.get(point_id)
            created_at = from_timestamp(memory.created_at)
            if created_at is None and previous is not None:
                created_at = parse_ts(previous.created_at)
            payload = build_payload(
                tenant,
                memory,
                created_at=created_at or now,
                updated_at=now,
                embedding_model=self.embedder.model_id,
            )
            if previous is not None and _same(previous.payload, payload):
                results.append(_result(point_id, pb.UPSERT_STATUS_UNCHANGED, previous.payload))
                continue
            key = index_key(memory, parse_ts(payload["created_at"]))
            point = StoredPoint(id=point_id, payload=payload, sparse=self.lexical.document(key))
            if memory.kind == pb.MEMORY_KIND_SUMMARY:
                point.vector = self.unsearched_vector
            elif previous is not None and _reusable(
                previous, payload, late_interaction=self.store.late_interaction
            ):
                point.vector, point.tokens = previous.vector, previous.tokens
            else:
                to_embed.append((point_id, key))
            pending[point_id] = point
            status = pb.UPSERT_STATUS_UPDATED if previous else pb.UPSERT_STATUS_CREATED
            results.append(_result(point_id, status, payload))

        if to_embed:
            with self.tracer.start_as_current_span(
                "embed",
                attributes={semconv.ENGRAM_TENANT: tenant, semconv.ENGRAM_TEXTS: len(to_embed)},
            ):
                encoded = await self.pipeline.encoder.encode([text for _, text in to_embed])
            for (point_id, _), vectors in zip(to_embed, encoded, strict=True):
                pending[point_id].vector = vectors.dense
                pending[point_id].tokens = vectors.tokens
        try:
            await self.store.upsert(tenant, list(pending.values()))
        except ForeignIdError as exc:
            raise RequestError(
                f"ids already exist: {', '.join(exc.ids)}", grpc.StatusCode.ALREADY_EXISTS
            ) from exc
        log.debug(
            "upsert.applied",
            tenant=tenant,
            created=sum(r.status == pb.UPSERT_STATUS_CREATED for r in results),
            updated=sum(r.status == pb.UPSERT_STATUS_UPDATED for r in results),
            unchanged=sum(r.status == pb.UPSERT_STATUS_UNCHANGED for r in results),
            embedded=len(to_embed),
        )
        return pb.UpsertResponse(results=results)

    @_rpc
    async def Delete(
        self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteResponse:
        tenant = _require_tenant(request.tenant)
        requested = _ids(request.ids)
        valid = [n for _, n in requested if n is not None]
        deleted = set(await self.store.delete(tenant, valid))
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
                response.memories.append(payload_to_memory(point.id, point.payload))
        return response

    @_rpc
    async def List(
        self, request: pb.ListRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListResponse:
        tenant = _require_tenant(request.tenant)
        if request.page_size < 0:
            raise RequestError("page_size must not be negative")
        page_size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        after = decode_page_token(request.page_token) if request.page_token else None
        page = await self.store.list_page(_filter_from(tenant, request.filter), page_size, after)
        return pb.ListResponse(
            memories=[payload_to_memory(p.id, p.payload) for p in page.points],
            next_page_token=encode_page_token(page.next) if page.next else "",
        )

    @_rpc
    async def Count(
        self, request: pb.CountRequest, context: grpc.aio.ServicerContext
    ) -> pb.CountResponse:
        tenant = _require_tenant(request.tenant)
        flt = _filter_from(tenant, request.filter, kinds_default=tuple(KIND_NAMES.values()))
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
        if not 0 <= request.limit <= MAX_SCOPES_LIMIT:
            raise RequestError(f"limit must be within [0, {MAX_SCOPES_LIMIT}]")
        limit = request.limit or DEFAULT_SCOPES_LIMIT
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
    if len(raw_ids) > MAX_IDS:
        raise RequestError(f"at most {MAX_IDS} ids per call")
    return list(dict.fromkeys((raw, normalize_id(raw)) for raw in raw_ids))


def _result(point_id: str, status: pb.UpsertStatus, payload: dict[str, Any]) -> pb.UpsertResult:
    """The outcome of one memory, with the stored timestamps."""
    result = pb.UpsertResult(id=point_id, status=status)
    result.created_at.CopyFrom(to_timestamp(parse_ts(payload["created_at"])))
    result.updated_at.CopyFrom(to_timestamp(parse_ts(payload["updated_at"])))
    return result


def _reusable(previous: StoredPoint, payload: dict[str, Any], *, late_interaction: bool) -> bool:
    """Whether the stored vectors still fit: same model and index text, token vectors
    present where the store keeps them."""
    return (
        previous.vector is not None
        and (previous.tokens is not None or not late_interaction)
        and previous.payload.get("embed_hash") == payload["embed_hash"]
    )


def _same(stored: dict[str, Any], fresh: dict[str, Any]) -> bool:
    return (
        stored.get("content_hash") == fresh["content_hash"]
        and stored.get("embedding_model") == fresh["embedding_model"]
    )
