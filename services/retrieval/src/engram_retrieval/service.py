"""The gRPC MemoryService: validation, the search pipeline, and the write path.

Every call is scoped to ``request.tenant`` (required); the store filters on it, so
another tenant's ids are reported missing and never returned, listed or counted.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
import numpy as np
from opentelemetry import trace

from engram_core import semconv
from engram_core.logging import get_logger
from engram_core.proto import KIND_NAMES, SCOPE_NAMES, from_timestamp, pb, pb_grpc
from engram_retrieval.embedder import Embedder
from engram_retrieval.expansion import expand_first_person
from engram_retrieval.lexical import LexicalEncoder
from engram_retrieval.payload import (
    DEFAULT_CONVERSATION,
    GLOBAL_CONVERSATION,
    build_payload,
    derive_id,
    format_ts,
    identity_text,
    index_key,
    memory_text,
    normalize_id,
    parse_ts,
    payload_to_memory,
)
from engram_retrieval.ranking import (
    Candidate,
    Outcome,
    RankingParams,
    adjacent_turns,
    lexical_relevance,
    merge_pools,
    pools_complete,
    rank,
)
from engram_retrieval.relevance import PoolSignals, RelevanceScorer
from engram_retrieval.store import (
    ForeignIdError,
    MemoryStore,
    PageCursor,
    PointFilter,
    StoredPoint,
    StoreError,
)
from engram_retrieval.temporal import query_window

log = get_logger("engram.retrieval")

DEFAULT_SEARCH_KINDS = ("turn", "fact", "episode")
DEFAULT_SCOPES = (pb.SCOPE_CONVERSATION, pb.SCOPE_USER, pb.SCOPE_GLOBAL)
MAX_TOP_K = 100
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_UPSERT_BATCH = 2048
MAX_IDS = 1000
MAX_PROFILE_ENTRIES = 200
DEFAULT_SCOPES_LIMIT = 100
MAX_SCOPES_LIMIT = 1000
# hybrid: dense + BM25 candidates; dense / lexical: one source (ablations, benchmarks).
CANDIDATE_SOURCES = ("hybrid", "dense", "lexical")

_OUTCOMES = {
    Outcome.RANKED: pb.SEARCH_OUTCOME_RANKED,
    Outcome.SMALL_STORE: pb.SEARCH_OUTCOME_SMALL_STORE,
    Outcome.NOTHING_RELEVANT: pb.SEARCH_OUTCOME_NOTHING_RELEVANT,
    Outcome.EMPTY: pb.SEARCH_OUTCOME_EMPTY,
}
_SCOPE_VALUES = {name: value for value, name in SCOPE_NAMES.items()}

R = TypeVar("R")


class RequestError(Exception):
    """A request the caller must fix; reported with its status code, never retried."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT):
        super().__init__(message)
        self.message = message
        self.code = code


def _rpc(
    fn: Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]],
) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]:
    """Turn known failures into gRPC statuses; never leak internals to the caller."""

    @functools.wraps(fn)
    async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await fn(self, request, context)
        except RequestError as exc:
            await context.abort(exc.code, exc.message)
        except StoreError as exc:
            log.error("store unavailable", rpc=fn.__name__, error=str(exc))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "memory store unavailable")
        except Exception:
            log.exception("rpc failed", rpc=fn.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{fn.__name__} failed")
        raise AssertionError("unreachable: context.abort raises")

    return handler


def _require_tenant(tenant: str) -> str:
    if not tenant or not tenant.strip():
        raise RequestError("tenant is required")
    return tenant


def _kind_names(kinds: Sequence[int], default: Sequence[str], field: str) -> tuple[str, ...]:
    names = []
    for kind in kinds:
        if kind not in KIND_NAMES:
            raise RequestError(f"{field}: unknown memory kind {kind}")
        names.append(KIND_NAMES[kind])
    return tuple(dict.fromkeys(names)) if names else tuple(default)


def _unit_interval(request: Any, field: str, default: float) -> float:
    if not request.HasField(field):
        return default
    value = float(getattr(request, field))
    if not 0.0 <= value <= 1.0:
        raise RequestError(f"{field} must be within [0, 1] (got {value:g})")
    return value


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


def _filter_from(
    tenant: str, flt: pb.MemoryFilter, *, kinds_default: Sequence[str] = ()
) -> PointFilter:
    return PointFilter(
        tenant=tenant,
        user_id=flt.user_id or None,
        conversation_id=flt.conversation_id or None,
        kinds=_kind_names(flt.kinds, kinds_default, "filter.kinds"),
        tags=tuple(flt.tags),
        source_ids=tuple(flt.source_ids),
        role=flt.role or None,
        include_superseded=flt.include_superseded,
        **_created_bounds(flt),
    )


def _created_bounds(flt: pb.MemoryFilter) -> dict[str, str]:
    """``created_after``/``created_before`` as the payload's timestamps (only those set)."""
    bounds = {}
    for name in ("created_after", "created_before"):
        if flt.HasField(name):
            bounds[name] = format_ts(getattr(flt, name).ToDatetime(tzinfo=UTC))
    return bounds


@dataclass
class _Scope:
    name: str
    flt: PointFilter


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    """engram.memory.v1.MemoryService over a :class:`MemoryStore`."""

    def __init__(
        self,
        store: MemoryStore,
        embedder: Embedder,
        scorer: RelevanceScorer,
        defaults: RankingParams,
        *,
        candidates: str = "hybrid",
        first_person_expansion: bool = False,
        tracer: trace.Tracer | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.scorer = scorer
        self.defaults = defaults
        if candidates not in CANDIDATE_SOURCES:
            raise ValueError(f"candidates must be one of {CANDIDATE_SOURCES} (got {candidates!r})")
        # Documents always get BM25 vectors, so the candidate sources can change later.
        self.lexical = LexicalEncoder()
        self.candidates = candidates
        self.first_person_expansion = first_person_expansion
        # Only a scorer that reads MaxSim gets it; a cross-encoder reads the texts.
        self.late_interaction = getattr(scorer, "late_weight", 0.0) > 0.0
        self.tracer = tracer or trace.get_tracer("engram.retrieval")
        self.clock = clock or (lambda: datetime.now(UTC))

    # -- Search -----------------------------------------------------------------------

    def _ranking_params(self, request: pb.SearchRequest) -> RankingParams:
        d = self.defaults
        top_k = d.top_k
        if request.HasField("top_k"):
            top_k = request.top_k
            if not 1 <= top_k <= MAX_TOP_K:
                raise RequestError(f"top_k must be within [1, {MAX_TOP_K}] (got {top_k})")
        return RankingParams(
            top_k=top_k,
            recency_weight=_unit_interval(request, "recency_weight", d.recency_weight),
            score_threshold=_unit_interval(request, "score_threshold", d.score_threshold),
            mmr_lambda=_unit_interval(request, "mmr_lambda", d.mmr_lambda),
            half_life_days=d.half_life_days,
            small_store_size=d.small_store_size,
            candidate_multiplier=d.candidate_multiplier,
        )

    def _scopes(self, request: pb.SearchRequest, tenant: str) -> list[_Scope]:
        for scope in request.scopes:
            if scope not in SCOPE_NAMES:
                raise RequestError(f"scopes: unknown scope {scope}")
        wanted = tuple(dict.fromkeys(request.scopes)) or DEFAULT_SCOPES
        kinds = _kind_names(request.kinds, DEFAULT_SEARCH_KINDS, "kinds")
        if "summary" in kinds:
            raise RequestError("kinds: summaries are not searched; see SearchResponse.summary")
        conversation = request.conversation_id or DEFAULT_CONVERSATION
        common: dict[str, Any] = {
            "tenant": tenant,
            "kinds": kinds,
            "include_superseded": request.include_superseded,
        }
        scopes = []
        for scope in wanted:
            if scope == pb.SCOPE_CONVERSATION:
                scopes.append(
                    _Scope("conversation", PointFilter(conversation_id=conversation, **common))
                )
            elif scope == pb.SCOPE_USER and request.user_id:
                scopes.append(
                    _Scope(
                        "user",
                        PointFilter(
                            user_id=request.user_id,
                            exclude_conversation_ids=(conversation, GLOBAL_CONVERSATION),
                            **common,
                        ),
                    )
                )
            elif scope == pb.SCOPE_GLOBAL and not (
                conversation == GLOBAL_CONVERSATION and pb.SCOPE_CONVERSATION in wanted
            ):
                scopes.append(
                    _Scope("global", PointFilter(conversation_id=GLOBAL_CONVERSATION, **common))
                )
        return scopes

    @_rpc
    async def Search(
        self, request: pb.SearchRequest, context: grpc.aio.ServicerContext
    ) -> pb.SearchResponse:
        started = time.perf_counter()
        tenant = _require_tenant(request.tenant)
        if not request.query.strip():
            raise RequestError("query is empty")
        params = self._ranking_params(request)
        scopes = self._scopes(request, tenant)
        now = from_timestamp(request.now) if request.HasField("now") else None
        now = now or self.clock()
        conversation = request.conversation_id or DEFAULT_CONVERSATION
        timings = pb.StageTimings()
        base_attrs = {semconv.ENGRAM_TENANT: tenant, semconv.ENGRAM_TOP_K: params.top_k}

        attached = asyncio.ensure_future(
            asyncio.gather(self._summary(tenant, conversation), self._profile(tenant, request))
        )
        try:
            with self.tracer.start_as_current_span("embed", attributes=base_attrs) as span:
                t = time.perf_counter()
                query = (
                    expand_first_person(request.query)
                    if self.first_person_expansion
                    else request.query
                )
                encoded = await asyncio.to_thread(self.embedder.encode_one, query)
                query_vector = encoded.dense
                sparse_query = self.lexical.query(query) if self.candidates != "dense" else None
                timings.embed_ms = _ms(t)
                span.set_attribute(semconv.ENGRAM_EMBEDDING_MODEL, self.embedder.model_id)

            with self.tracer.start_as_current_span("candidates", attributes=base_attrs) as span:
                t = time.perf_counter()
                pools_raw = await self.store.search(
                    query_vector,
                    [s.flt for s in scopes],
                    params.pool_size,
                    sparse=sparse_query,
                    dense=self.candidates != "lexical",
                )
                pools = [
                    [_candidate(p, scope.name) for p in pool]
                    for scope, pool in zip(scopes, pools_raw, strict=True)
                ]
                candidates = merge_pools(pools)
                timings.candidates_ms = _ms(t)
                span.set_attribute(semconv.ENGRAM_SCOPES, [s.name for s in scopes])
                span.set_attribute(semconv.ENGRAM_POOL_SIZE, params.pool_size)
                span.set_attribute(semconv.ENGRAM_LEXICAL, bool(sparse_query))
                span.set_attribute(semconv.ENGRAM_CANDIDATE_SOURCES, self.candidates)
                span.set_attribute(semconv.ENGRAM_CANDIDATES, len(candidates))
        finally:
            summary, profile = await attached

        with self.tracer.start_as_current_span("rerank", attributes=base_attrs) as span:
            t = time.perf_counter()
            relevance = np.zeros(0)
            scorer_name = self.scorer.name
            if candidates and self.candidates == "lexical":
                relevance = lexical_relevance([c.sparse for c in candidates])
                scorer_name = "bm25-relative"
            elif candidates:
                dense = np.array([c.dense for c in candidates], dtype=np.float64)
                texts = [c.text for c in candidates]
                sparse = [c.sparse for c in candidates] if self.candidates == "hybrid" else None
                late = await self._late_scores(tenant, encoded.tokens, candidates)
                adjacency = adjacent_turns([_turn_position(c) for c in candidates])
                window = query_window(request.query, now)
                in_window = (
                    np.array([c.created_at in window for c in candidates]) if window else None
                )
                signals = PoolSignals(dense, sparse, late, adjacency, in_window)
                relevance = await asyncio.to_thread(
                    self.scorer.score, request.query, texts, signals
                )
                span.set_attribute(semconv.ENGRAM_LATE_INTERACTION, signals.late is not None)
            timings.rerank_ms = _ms(t)
            span.set_attribute(semconv.ENGRAM_SCORER, scorer_name)
            span.set_attribute(semconv.ENGRAM_CANDIDATES, len(candidates))

        with self.tracer.start_as_current_span("mmr", attributes=base_attrs) as span:
            t = time.perf_counter()
            result = rank(
                candidates, relevance, params, now, complete=pools_complete(pools, params.pool_size)
            )
            timings.mmr_ms = _ms(t)
            span.set_attribute(semconv.ENGRAM_OUTCOME, result.outcome.value)
            span.set_attribute(semconv.ENGRAM_HITS, len(result.hits))
            span.set_attribute(semconv.ENGRAM_MMR_LAMBDA, params.mmr_lambda)

        response = pb.SearchResponse(
            outcome=_OUTCOMES[result.outcome],
            candidates_considered=result.considered,
        )
        for hit in result.hits:
            point: StoredPoint = hit.candidate.payload
            scores = pb.ScoreBreakdown(
                dense=hit.candidate.dense,
                relevance=hit.relevance,
                recency=hit.recency,
                total=hit.total,
                mmr=hit.mmr,
            )
            if hit.candidate.sparse is not None:
                scores.sparse = hit.candidate.sparse
            response.hits.append(
                pb.SearchHit(
                    memory=payload_to_memory(point.id, point.payload),
                    scores=scores,
                    scope=_SCOPE_VALUES[hit.candidate.scope],
                )
            )
        if summary is not None:
            response.summary.CopyFrom(summary)
        response.profile.extend(profile)
        timings.total_ms = _ms(started)
        response.timings.CopyFrom(timings)
        log.debug(
            "search",
            tenant=tenant,
            outcome=result.outcome.value,
            hits=len(result.hits),
            candidates=result.considered,
            total_ms=round(timings.total_ms, 2),
        )
        return response

    async def _late_scores(
        self, tenant: str, query_tokens: np.ndarray, candidates: Sequence[Candidate]
    ) -> list[float | None] | None:
        """Each candidate's MaxSim per query token (None: it has no token vectors); None
        when the scorer does not use them or the store has none."""
        if not self.late_interaction or not self.store.late_interaction or not len(query_tokens):
            return None
        scores = await self.store.late_scores(tenant, query_tokens, [c.id for c in candidates])
        n = float(len(query_tokens))
        return [scores[c.id] / n if c.id in scores else None for c in candidates]

    async def _summary(self, tenant: str, conversation: str) -> pb.Memory | None:
        page = await self.store.list_page(
            PointFilter(tenant=tenant, conversation_id=conversation, kinds=("summary",)), 1
        )
        return payload_to_memory(page.points[0].id, page.points[0].payload) if page.points else None

    async def _profile(self, tenant: str, request: pb.SearchRequest) -> list[pb.Memory]:
        """Active profile entries: one per (category, key), highest confidence, then newest."""
        page = await self.store.list_page(
            PointFilter(tenant=tenant, user_id=request.user_id, kinds=("profile",)),
            MAX_PROFILE_ENTRIES,
        )
        best: dict[tuple[str, str], StoredPoint] = {}
        for point in page.points:  # newest first
            entry = point.payload.get("profile") or {}
            key = (entry.get("category", ""), entry.get("key", "") or point.id)
            held = best.get(key)
            held_conf = (held.payload.get("profile") or {}).get("confidence", 0.0) if held else -1.0
            if entry.get("confidence", 0.0) > held_conf:
                best[key] = point
        return [payload_to_memory(p.id, p.payload) for p in best.values()]

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
                results.append(pb.UpsertResult(id=point_id, status=pb.UPSERT_STATUS_UNCHANGED))
                continue
            key = index_key(memory, parse_ts(payload["created_at"]))
            point = StoredPoint(id=point_id, payload=payload, sparse=self.lexical.document(key))
            if (
                previous is not None
                and previous.vector is not None
                and (previous.tokens is not None or not self.store.late_interaction)
                and previous.payload.get("embed_hash") == payload["embed_hash"]
            ):
                point.vector, point.tokens = previous.vector, previous.tokens
            else:
                to_embed.append((point_id, key))
            pending[point_id] = point
            status = pb.UPSERT_STATUS_UPDATED if previous else pb.UPSERT_STATUS_CREATED
            results.append(pb.UpsertResult(id=point_id, status=status))

        if to_embed:
            with self.tracer.start_as_current_span(
                "embed",
                attributes={semconv.ENGRAM_TENANT: tenant, semconv.ENGRAM_TEXTS: len(to_embed)},
            ):
                encoded = await asyncio.to_thread(
                    self.embedder.encode, [text for _, text in to_embed]
                )
            for (point_id, _), vectors in zip(to_embed, encoded, strict=True):
                pending[point_id].vector = vectors.dense
                pending[point_id].tokens = vectors.tokens
        try:
            await self.store.upsert(tenant, list(pending.values()))
        except ForeignIdError as exc:
            raise RequestError(
                f"ids already exist: {', '.join(exc.ids)}", grpc.StatusCode.ALREADY_EXISTS
            ) from exc
        counts = {s: sum(r.status == s for r in results) for s in (1, 2, 3)}
        log.debug(
            "upsert",
            tenant=tenant,
            created=counts[1],
            updated=counts[2],
            unchanged=counts[3],
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
        counts = await asyncio.gather(
            *(self.store.count(_with_kinds(flt, (kind,))) for kind in flt.kinds)
        )
        by_kind = dict(zip(flt.kinds, counts, strict=True))
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


def _with_kinds(flt: PointFilter, kinds: tuple[str, ...]) -> PointFilter:
    return replace(flt, kinds=kinds)


def _ids(raw_ids: Sequence[str]) -> list[tuple[str, str | None]]:
    if len(raw_ids) > MAX_IDS:
        raise RequestError(f"at most {MAX_IDS} ids per call")
    return list(dict.fromkeys((raw, normalize_id(raw)) for raw in raw_ids))


def _same(stored: dict[str, Any], fresh: dict[str, Any]) -> bool:
    return (
        stored.get("content_hash") == fresh["content_hash"]
        and stored.get("embedding_model") == fresh["embedding_model"]
    )


def _candidate(point: StoredPoint, scope: str) -> Candidate:
    assert point.vector is not None, "search results carry vectors"
    return Candidate(
        id=point.id,
        scope=scope,
        dense=float(point.score or 0.0),
        sparse=point.sparse_score,
        vector=point.vector,
        created_at=parse_ts(point.created_at),
        text=point.payload.get("text") or memory_text(payload_to_memory(point.id, point.payload)),
        payload=point,
    )


def _turn_position(candidate: Candidate) -> tuple[str, int] | None:
    payload = candidate.payload.payload
    if payload.get("kind") != "turn":
        return None
    return (str(payload.get("conversation_id", "")), int(payload.get("turn_index") or 0))


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
