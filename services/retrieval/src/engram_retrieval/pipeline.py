"""The search pipeline: embed → candidates per scope → relevance → recency → MMR.

``SearchPipeline.run(SearchQuery) -> Ranked`` on the domain query; the gRPC servicer
only translates protobuf in and out. The ranking maths is pure (:mod:`ranking`); this
module does the I/O around it (the embedder in a worker thread, the store) and the
stage spans and timings.

Scopes: the user's conversation (a candidate pool of ``top_k * candidate_multiplier``
per source), the user's other conversations and the tenant-wide bucket (no user,
conversation ``global``; by default what the conversation's pool leaves of that
size). A user never sees another user's memories: every pool filters on the exact
``user_id`` (``""`` included).

A question about memory itself ("what do you know about me?", :mod:`overview`) is
answered with the user's current facts and conversation summaries, newest first
(outcome ``overview``), since nothing in it resembles a stored fact.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from engram_core import semconv
from engram_core.kinds import find_kind, kind_names, kind_policy
from engram_core.lifecycle import is_corrected, summary_memory_id
from engram_core.memory import (
    DEFAULT_CONVERSATION,
    GLOBAL_CONVERSATION,
    ScopeName,
    SearchQuery,
    is_tenant_wide,
    profile_display_text,
)
from engram_retrieval.embedder import SentenceEncoder
from engram_retrieval.encode_queue import EncodeQueue
from engram_retrieval.expansion import (
    expand_categories,
    expand_first_person,
    is_about_the_user,
)
from engram_retrieval.lexical import LexicalEncoder, SparseVec
from engram_retrieval.overview import asks_for_overview
from engram_retrieval.payload import parse_ts
from engram_retrieval.ranking import (
    Candidate,
    Outcome,
    RankingParams,
    adjacent_turns,
    lexical_relevance,
    merge_identical,
    merge_pools,
    other_scopes_limit,
    pools_complete,
    rank,
    recency,
    speakers_named,
    total_score,
)
from engram_retrieval.relevance import PoolSignals, RelevanceScorer
from engram_retrieval.store import MemoryStore, PerSearchedPoint, PointFilter, StoredPoint
from engram_retrieval.temporal import query_window

DEFAULT_SEARCH_KINDS = kind_names(lambda k: k.searched_by_default)
DEFAULT_SCOPES: tuple[ScopeName, ...] = ("conversation", "user", "global")
MAX_TOP_K = 100
MAX_PROFILE_ENTRIES = 200
#: Summaries shown in an overview (one per conversation, newest first).
OVERVIEW_SUMMARIES = 5
# hybrid: dense + BM25 candidates; dense / lexical: one source (ablations, benchmarks).
CANDIDATE_SOURCES = ("hybrid", "dense", "lexical")

OutcomeName = Literal["ranked", "small_store", "nothing_relevant", "empty", "overview"]
_OUTCOME_NAMES: dict[Outcome, OutcomeName] = {
    Outcome.RANKED: "ranked",
    Outcome.SMALL_STORE: "small_store",
    Outcome.NOTHING_RELEVANT: "nothing_relevant",
    Outcome.EMPTY: "empty",
    Outcome.OVERVIEW: "overview",
}


class RequestError(Exception):
    """A request the caller must fix (reported as INVALID_ARGUMENT, never retried)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Scope:
    name: ScopeName
    flt: PointFilter


@dataclass(frozen=True)
class RankedHit:
    point: StoredPoint
    scope: ScopeName
    dense: float
    sparse: float | None
    relevance: float
    recency: float
    total: float
    mmr: float


@dataclass
class Timings:
    embed_ms: float = 0.0
    candidates_ms: float = 0.0
    rerank_ms: float = 0.0
    mmr_ms: float = 0.0
    total_ms: float = 0.0


@dataclass
class Ranked:
    outcome: OutcomeName
    hits: list[RankedHit] = field(default_factory=list)
    considered: int = 0
    summary: StoredPoint | None = None
    profile: list[StoredPoint] = field(default_factory=list)
    timings: Timings = field(default_factory=Timings)


def _unit_interval(name: str, value: float | None, default: float) -> float:
    if value is None:
        return default
    if not 0.0 <= value <= 1.0:
        raise RequestError(f"{name} must be within [0, 1] (got {value:g})")
    return float(value)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def candidate(point: StoredPoint, scope: ScopeName, signals: PayloadSignals) -> Candidate:
    """A store hit as the ranking sees it; ``signals``: what its payload says."""
    assert point.vector is not None, "search results carry vectors"
    return Candidate(
        id=point.id,
        scope=scope,
        dense=float(point.score or 0.0),
        sparse=point.sparse_score,
        vector=point.vector,
        created_at=signals.created_at,
        text=signals.text,
        payload=point,
        kind=signals.kind,
        owner=signals.owner,
        source_ids=signals.source_ids,
        corrected=signals.corrected,
        turn=signals.turn,
        session=signals.session,
        speaker=signals.speaker,
    )


@dataclass(frozen=True, slots=True)
class PayloadSignals:
    """What a candidate's ranking reads from its stored payload (the same for every
    search that finds it)."""

    created_at: datetime
    text: str
    kind: str
    owner: tuple[str, str]
    source_ids: tuple[str, ...]
    corrected: bool
    turn: tuple[str, int] | None
    session: tuple[str, str] | None
    speaker: str

    @classmethod
    def of(cls, payload: dict[str, Any], created_at: str) -> PayloadSignals:
        metadata = payload.get("metadata") or {}
        kind = str(payload.get("kind", ""))
        policy = find_kind(kind)
        chat_message = policy is not None and policy.chat_message
        conversation = str(payload.get("conversation_id", ""))
        said, day = _stamp(created_at)
        return cls(
            created_at=said,
            text=payload.get("text") or display_text(payload),
            kind=kind,
            owner=(str(payload.get("user_id", "")), conversation),
            source_ids=tuple(payload.get("source_turn_ids") or ()),
            corrected=chat_message and is_corrected(metadata),
            turn=(conversation, int(payload.get("turn_index") or 0)) if chat_message else None,
            session=(conversation, day) if chat_message else None,
            speaker=str(metadata.get("speaker") or ""),
        )


def _signals_of(point: StoredPoint) -> PayloadSignals:
    return PayloadSignals.of(point.payload, point.created_at)


@functools.lru_cache(maxsize=8192)
def _stamp(created_at: str) -> tuple[datetime, str]:
    """A stored creation time and its UTC day, parsed once: the same points come back
    search after search (a pool is about a hundred of them)."""
    parsed = parse_ts(created_at)
    return parsed, parsed.astimezone(UTC).date().isoformat()


def display_text(payload: dict[str, Any]) -> str:
    """A profile entry without text reads as ``category key: value``."""
    profile = payload.get("profile") or {}
    if profile:
        return profile_display_text(
            profile.get("category", ""), profile.get("key", ""), profile.get("value", "")
        )
    return ""


class SearchPipeline:
    def __init__(
        self,
        store: MemoryStore,
        embedder: SentenceEncoder,
        scorer: RelevanceScorer,
        defaults: RankingParams,
        *,
        candidates: str = "hybrid",
        first_person_expansion: bool = False,
        category_expansion: bool = False,
        personal_score_threshold: float | None = None,
        overview_limit: int = 20,
        other_scopes_pool: Literal["remainder", "full"] = "remainder",
        tracer: trace.Tracer | None = None,
        clock: Callable[[], datetime] | None = None,
        encoder: EncodeQueue | None = None,
    ) -> None:
        if candidates not in CANDIDATE_SOURCES:
            raise ValueError(f"candidates must be one of {CANDIDATE_SOURCES} (got {candidates!r})")
        self.store = store
        self.embedder = embedder
        # Shared with the servicer's writes: one model run serves concurrent requests.
        self.encoder = encoder or EncodeQueue(embedder)
        self.scorer = scorer
        self.defaults = defaults
        # Documents always get BM25 vectors, so the candidate sources can change later.
        self.lexical = LexicalEncoder()
        self.candidates = candidates
        self.first_person_expansion = first_person_expansion
        self.category_expansion = category_expansion
        # the default threshold of a question about the user (None: the one default)
        self.personal_score_threshold = personal_score_threshold
        self.overview_limit = overview_limit
        if other_scopes_pool not in ("remainder", "full"):
            raise ValueError(
                f"other_scopes_pool must be remainder or full (got {other_scopes_pool!r})"
            )
        self.other_scopes_pool = other_scopes_pool
        # Only a scorer that reads MaxSim gets it; a cross-encoder reads the texts.
        self.late_interaction = getattr(scorer, "late_weight", 0.0) > 0.0
        # The query embedded on the loop and the store read inline: nothing would run
        # beside the attachments' reads, so they are read in turn, and a Search runs
        # from its first line to its reply without giving the loop away (a task or a
        # gather would let the workers' calls in between; encode_queue.py).
        self.runs_through = self.encoder.inline_searches and store.reads_inline
        self.signals = PerSearchedPoint(store.kept_search_points, _signals_of)
        self.tracer = tracer or trace.get_tracer("engram.retrieval")
        self.clock = clock or (lambda: datetime.now(UTC))

    # -- the request ---------------------------------------------------------------------

    def params(self, query: SearchQuery) -> RankingParams:
        d = self.defaults
        if self.personal_score_threshold is not None and is_about_the_user(query.text):
            d = replace(d, score_threshold=self.personal_score_threshold)
        top_k = d.top_k
        if query.top_k is not None:
            top_k = query.top_k
            if not 1 <= top_k <= MAX_TOP_K:
                raise RequestError(f"top_k must be within [1, {MAX_TOP_K}] (got {top_k})")
        return replace(
            d,
            top_k=top_k,
            recency_weight=_unit_interval("recency_weight", query.recency_weight, d.recency_weight),
            score_threshold=_unit_interval(
                "score_threshold", query.score_threshold, d.score_threshold
            ),
            mmr_lambda=_unit_interval("mmr_lambda", query.mmr_lambda, d.mmr_lambda),
        )

    def scopes(self, query: SearchQuery) -> list[Scope]:
        wanted = tuple(dict.fromkeys(query.scopes)) or DEFAULT_SCOPES
        kinds = tuple(dict.fromkeys(query.kinds)) or DEFAULT_SEARCH_KINDS
        for kind in kinds:
            if not kind_policy(kind).embedded:
                raise RequestError(
                    f"kinds: {kind} memories are not searched; see SearchResponse.{kind}"
                )
        user = query.user_id
        conversation = query.conversation_id or DEFAULT_CONVERSATION
        common: dict[str, Any] = {
            "tenant": query.tenant,
            "kinds": kinds,
            "include_superseded": query.include_superseded,
        }
        scopes = []
        for name in wanted:
            if name == "conversation":
                flt = PointFilter(user_id=user, conversation_id=conversation, **common)
            elif name == "user":
                # With no user, the tenant-wide bucket belongs to the global scope.
                excluded = (conversation,) if user else (conversation, GLOBAL_CONVERSATION)
                flt = PointFilter(user_id=user, exclude_conversation_ids=excluded, **common)
            elif is_tenant_wide(user, conversation) and "conversation" in wanted:
                continue  # the conversation scope is the global bucket already
            else:
                flt = PointFilter(user_id="", conversation_id=GLOBAL_CONVERSATION, **common)
            scopes.append(Scope(name, flt))
        return scopes

    # -- the pipeline --------------------------------------------------------------------

    async def run(
        self,
        query: SearchQuery,
        *,
        pause: Callable[[], Awaitable[None]] | None = None,
    ) -> Ranked:
        """``pause``: given for a search nobody waits for (a worker's duplicate check),
        which embeds its query in the writes' thread, gives the loop away while it
        waits, and awaits ``pause`` between its stages, so a chat's search that arrives
        meanwhile starts then instead of after the whole of it (docs/retrieval.md,
        "Background searches"). Without it the search is a chat's."""
        started = time.perf_counter()
        through = self.runs_through and pause is None
        if not query.tenant.strip():
            raise RequestError("tenant is required")
        if not query.text.strip():
            raise RequestError("query is empty")
        params = self.params(query)
        scopes = self.scopes(query)
        now = query.now or self.clock()
        attached: asyncio.Future[tuple[StoredPoint | None, list[StoredPoint]]]
        if through:
            attached = asyncio.get_running_loop().create_future()
            attached.set_result(await self._attachments(query, through=True))
        else:
            attached = asyncio.ensure_future(self._attachments(query, through=False))
        try:
            if not query.kinds and asks_for_overview(query.text):
                overview = await self._overview(query, scopes, params, now)
                if overview is not None:
                    overview.summary, overview.profile = await attached
                    overview.timings.total_ms = _ms(started)
                    return overview
            result = await self._ranked(query, scopes, params, now, pause=pause)
        except BaseException:
            # The original failure is the one to report, not the attachment's.
            attached.cancel()
            with suppress(BaseException):
                await attached
            raise
        result.summary, result.profile = await attached
        result.timings.total_ms = _ms(started)
        return result

    async def _ranked(
        self,
        query: SearchQuery,
        scopes: list[Scope],
        params: RankingParams,
        now: datetime,
        *,
        pause: Callable[[], Awaitable[None]] | None = None,
    ) -> Ranked:
        timings = Timings()
        attrs: dict[str, AttributeValue] = {
            semconv.ENGRAM_TENANT: query.tenant,
            semconv.ENGRAM_TOP_K: params.top_k,
        }
        with self.tracer.start_as_current_span("embed", attributes=attrs) as span:
            t = time.perf_counter()
            text = expand_first_person(query.text) if self.first_person_expansion else query.text
            # Only a question about the user: on LoCoMo's third-person questions the
            # members are noise (dev R@10 76.4 -> 75.0; docs/retrieval.md).
            if self.category_expansion and is_about_the_user(query.text):
                text = expand_categories(text)
            encoded = await self.encoder.encode_one(text, urgent=pause is None)
            sparse_query = self.lexical.query(text) if self.candidates != "dense" else None
            timings.embed_ms = _ms(t)
            span.set_attribute(semconv.ENGRAM_EMBEDDING_MODEL, self.embedder.model_id)

        if pause is not None:
            await pause()
        with self.tracer.start_as_current_span("candidates", attributes=attrs) as span:
            t = time.perf_counter()
            raw, limits = await self._candidate_pools(encoded.dense, scopes, params, sparse_query)
            pools = [
                [candidate(p, scope.name, self.signals.of(p)) for p in pool]
                for scope, pool in zip(scopes, raw, strict=True)
            ]
            candidates = merge_identical(merge_pools(pools))
            timings.candidates_ms = _ms(t)
            span.set_attribute(semconv.ENGRAM_SCOPES, [s.name for s in scopes])
            span.set_attribute(semconv.ENGRAM_POOL_SIZE, params.pool_size)
            span.set_attribute(semconv.ENGRAM_LEXICAL, bool(sparse_query))
            span.set_attribute(semconv.ENGRAM_CANDIDATE_SOURCES, self.candidates)
            span.set_attribute(semconv.ENGRAM_CANDIDATES, len(candidates))

        if pause is not None:
            await pause()
        with self.tracer.start_as_current_span("rerank", attributes=attrs) as span:
            t = time.perf_counter()
            relevance, order, scorer_name, late_used = await self._relevance(
                query, encoded.tokens, candidates, now
            )
            timings.rerank_ms = _ms(t)
            span.set_attribute(semconv.ENGRAM_SCORER, scorer_name)
            span.set_attribute(semconv.ENGRAM_CANDIDATES, len(candidates))
            span.set_attribute(semconv.ENGRAM_LATE_INTERACTION, late_used)

        if pause is not None:
            await pause()
        with self.tracer.start_as_current_span("mmr", attributes=attrs) as span:
            t = time.perf_counter()
            result = rank(
                candidates,
                relevance,
                params,
                now,
                complete=pools_complete(pools, limits),
                order=order,
            )
            timings.mmr_ms = _ms(t)
            span.set_attribute(semconv.ENGRAM_OUTCOME, result.outcome.value)
            span.set_attribute(semconv.ENGRAM_HITS, len(result.hits))
            span.set_attribute(semconv.ENGRAM_MMR_LAMBDA, params.mmr_lambda)

        hits = [
            RankedHit(
                point=h.candidate.payload,
                scope=h.candidate.scope,
                dense=h.candidate.dense,
                sparse=h.candidate.sparse,
                relevance=h.relevance,
                recency=h.recency,
                total=h.total,
                mmr=h.mmr,
            )
            for h in result.hits
        ]
        return Ranked(_OUTCOME_NAMES[result.outcome], hits, result.considered, timings=timings)

    async def _candidate_pools(
        self,
        vector: np.ndarray,
        scopes: list[Scope],
        params: RankingParams,
        sparse: SparseVec | None,
    ) -> tuple[list[list[StoredPoint]], list[int]]:
        """Each scope's candidates and the limit it was searched with. Beside the
        conversation, the wider scopes get what its pool leaves (``other_scopes_pool``
        ``remainder``): a search ranks about one pool per source however many scopes it
        spans, the conversation's own memories first."""
        dense = self.candidates != "lexical"
        pool = params.pool_size
        if self.other_scopes_pool == "full" or len(scopes) < 2 or scopes[0].name != "conversation":
            raw = await self.store.search(
                vector, [s.flt for s in scopes], pool, sparse=sparse, dense=dense
            )
            return raw, [pool] * len(scopes)
        (own,) = await self.store.search(vector, [scopes[0].flt], pool, sparse=sparse, dense=dense)
        rest = other_scopes_limit(len(own), pool, params.top_k, params.small_store_size)
        others = await self.store.search(
            vector, [s.flt for s in scopes[1:]], rest, sparse=sparse, dense=dense
        )
        return [own, *others], [pool, *([rest] * len(others))]

    async def _relevance(
        self, query: SearchQuery, tokens: np.ndarray, candidates: Sequence[Candidate], now: datetime
    ) -> tuple[np.ndarray, np.ndarray | None, str, bool]:
        """(relevance per candidate, the order among those that pass the threshold if
        the scorer has its own, scorer name, whether MaxSim was used)."""
        if not candidates:
            return np.zeros(0), None, self.scorer.name, False
        if self.candidates == "lexical":
            relevance = lexical_relevance([c.sparse for c in candidates])
            return relevance, None, "bm25-relative", False
        dense = np.array([c.dense for c in candidates], dtype=np.float64)
        sparse = [c.sparse for c in candidates] if self.candidates == "hybrid" else None
        late = await self._late_scores(query.tenant, tokens, candidates)
        turns = [c.turn for c in candidates]
        adjacency = adjacent_turns(turns)
        window = query_window(query.text, now)
        in_window = np.array([c.created_at in window for c in candidates]) if window else None
        signals = PoolSignals(
            dense,
            sparse,
            late,
            adjacency,
            in_window,
            two_away=adjacent_turns(turns, distance=2),
            sessions=[c.session for c in candidates],
            speaker_named=speakers_named(query.text, [c.speaker for c in candidates]),
        )
        texts = [c.text for c in candidates]
        if self.scorer.runs_model:
            relevance = await asyncio.to_thread(self.scorer.score, query.text, texts, signals)
        else:
            relevance = self.scorer.score(query.text, texts, signals)
        order = self.scorer.order(query.text, texts, signals)
        return relevance, order, self.scorer.name, signals.late is not None

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

    # -- what is attached ----------------------------------------------------------------

    async def _attachments(
        self, query: SearchQuery, *, through: bool
    ) -> tuple[StoredPoint | None, list[StoredPoint]]:
        if not query.attachments:
            return None, []
        if through:
            return await self._summary(query), await self._profile(query)
        summary, profile = await asyncio.gather(self._summary(query), self._profile(query))
        return summary, profile

    async def _summary(self, query: SearchQuery) -> StoredPoint | None:
        """The rolling summary of this user's conversation: the one with the summary id
        of (user, conversation). A user's summary written before conversations belonged
        to users may mix several users' facts; it is not attached (``engram migrate
        scopes`` re-keys or rebuilds it)."""
        conversation = query.conversation_id or DEFAULT_CONVERSATION
        summary_id = summary_memory_id(query.tenant, query.user_id, conversation)
        found = await self.store.retrieve(query.tenant, [summary_id])
        return found[0] if found and found[0].payload.get("kind") == "summary" else None

    async def _profile(self, query: SearchQuery) -> list[StoredPoint]:
        """Active profile entries: one per (category, key), highest confidence, then newest."""
        page = await self.store.list_page(
            PointFilter(tenant=query.tenant, user_id=query.user_id, kinds=("profile",)),
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
        return list(best.values())

    async def _overview(
        self, query: SearchQuery, scopes: list[Scope], params: RankingParams, now: datetime
    ) -> Ranked | None:
        """The user's current facts (newest first) then their conversation summaries; None
        when there are neither (ordinary search then answers)."""
        t = time.perf_counter()
        limit = query.top_k if query.top_k is not None else self.overview_limit
        fact_filters = [replace(s.flt, kinds=("fact",), include_superseded=False) for s in scopes]
        summary_filters = [
            replace(s.flt, kinds=("summary",), include_superseded=False)
            for s in scopes
            if s.name != "global"
        ]
        pages = await asyncio.gather(
            *(self.store.list_page(f, limit) for f in fact_filters),
            *(self.store.list_page(f, OVERVIEW_SUMMARIES) for f in summary_filters),
        )
        facts = [(s.name, p) for s, page in zip(scopes, pages, strict=False) for p in page.points]
        facts.sort(key=lambda item: item[1].created_at, reverse=True)
        summary_scopes = [s for s in scopes if s.name != "global"]
        summaries = [
            (s.name, p)
            for s, page in zip(summary_scopes, pages[len(fact_filters) :], strict=True)
            for p in page.points
        ]
        chosen = _unique(facts)[:limit] + _unique(summaries)[:OVERVIEW_SUMMARIES]
        if not chosen:
            return None
        created = [parse_ts(p.created_at) for _, p in chosen]
        rec = recency(created, now, params.half_life_days)
        tot = total_score(np.ones(len(chosen)), rec, params.recency_weight)
        hits = [
            RankedHit(point, scope, 0.0, None, 1.0, float(r), float(total), 0.0)
            for (scope, point), r, total in zip(chosen, rec, tot, strict=True)
        ]
        return Ranked(
            "overview",
            hits,
            considered=len(facts) + len(summaries),
            timings=Timings(candidates_ms=_ms(t)),
        )


def _unique(items: list[tuple[ScopeName, StoredPoint]]) -> list[tuple[ScopeName, StoredPoint]]:
    seen: set[str] = set()
    out = []
    for scope, point in items:
        if point.id not in seen:
            seen.add(point.id)
            out.append((scope, point))
    return out
