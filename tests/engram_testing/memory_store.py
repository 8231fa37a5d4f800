"""The retrieval port in memory: a :class:`~engram_core.memory_port.MemoryPort` whose
memories live in a dict, for tests of the gateway and the workers that need memories but
not the retrieval service's models (the memory API, recall, edits, evict, summarize, the
runtime's delivery policy).

The same public methods as the gRPC port, typed on the same domain types, with the
service's semantics: every call is scoped to its tenant (another tenant's ids are
missing; writing one is ``ALREADY_EXISTS``); ids are UUIDs; an upsert reports created /
updated / unchanged (unchanged: everything but ``updated_at`` as stored), keeps
``created_at`` when a rewrite sends none and stamps ``updated_at``; List is newest first
(``created_at`` desc, then id) in pages; Count reports every kind asked for; ListScopes
counts current memories by user or by conversation, most first; bad requests are
``INVALID_ARGUMENT``. ``tests/unit/test_memory_port_contract.py`` runs the same
assertions against this port and the real service, so the two cannot drift.

Search is deterministic and simple, not the service's ranking: relevance is the share of
the query's words (lower-cased, alphanumeric) found in the memory's display text;
``total = (1 - w)·relevance + w·recency`` with ``recency = exp(-age_days / 30)`` and
``w = recency_weight`` (0.2); hits need relevance above ``score_threshold`` (default 0),
ordered by total, then id; ``mmr`` is the total. Scopes, the kinds searched by default
(a kind without vectors refused), superseded memories left out, the small-store answer
(at most five candidates: all of them up to ``top_k``, in the kinds' small-store order,
each newest first) and the attachments (the rolling summary by its id, the user's active
profile entries) are the service's; the kind rules come from :mod:`engram_core.kinds`.
There is no overview outcome.

Test controls: ``searches`` records every query; ``scripted_search`` answers every
search with a given result (a test about how a caller handles one outcome);
``set_serving(False)`` makes every call fail ``UNAVAILABLE`` and ``is_serving`` false, like
a service that is down; ``fail_upserts_next`` / ``fail_upserts_always`` fail Upserts with a
status code, ``upsert_delay_s`` slows them, ``upsert_attempts`` and ``upserts`` record them.
:meth:`InMemoryPort.as_factory` hands the port to the gateway or a worker the way
production hands them the gRPC one (their ``memory_port`` argument).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import grpc

from engram_core.codec import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_SCOPES_LIMIT,
    MAX_IDS,
    MAX_PAGE_SIZE,
    MAX_SCOPES_LIMIT,
    MAX_UPSERT_BATCH,
)
from engram_core.ids import summary_memory_id
from engram_core.kinds import kind_names, kind_policy
from engram_core.memory import (
    DEFAULT_CONVERSATION,
    GLOBAL_CONVERSATION,
    KIND_NAMES,
    KindCounts,
    MemoryFilter,
    MemoryRecord,
    Page,
    ScopeCount,
    ScopeList,
    ScopeName,
    Scores,
    SearchHit,
    SearchQuery,
    SearchResult,
    Stored,
    UpsertStatus,
    is_tenant_wide,
)
from engram_core.memory_port import MemoryPort, RetrievalError

ADDRESS = "in-memory"
MAX_TOP_K = 100
DEFAULT_TOP_K = 5
DEFAULT_RECENCY_WEIGHT = 0.2
RECENCY_HALF_LIFE_DAYS = 30.0
SMALL_STORE_SIZE = 5
DEFAULT_SEARCH_KINDS = kind_names(lambda k: k.searched_by_default)
DEFAULT_SEARCH_SCOPES: tuple[ScopeName, ...] = ("conversation", "user", "global")
_WORD = re.compile(r"[a-z0-9]+")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


def relevance(query: str, text: str) -> float:
    """The share of the query's words found in ``text`` (0 when the query has none)."""
    wanted = _words(query)
    return len(wanted & _words(text)) / len(wanted) if wanted else 0.0


@dataclass
class UpsertCall:
    tenant: str
    records: list[MemoryRecord]


@dataclass
class _Held:
    tenant: str
    record: MemoryRecord


@dataclass
class _Scope:
    name: ScopeName
    matches: Callable[[MemoryRecord], bool]


def _invalid(call: str, details: str) -> RetrievalError:
    return RetrievalError(call, grpc.StatusCode.INVALID_ARGUMENT, details)


def _require_tenant(call: str, tenant: str) -> None:
    if not tenant.strip():
        raise _invalid(call, "tenant is required")


def _normal_id(raw: str) -> str | None:
    try:
        return str(uuid.UUID(raw))
    except (ValueError, AttributeError, TypeError):
        return None


def _newest_first(record: MemoryRecord) -> tuple[float, str]:
    created = record.created_at or _EPOCH
    return (-created.timestamp(), record.id)


def _content(record: MemoryRecord) -> dict[str, object]:
    """What makes a rewrite a change: everything but when it was written."""
    return record.model_dump(exclude={"updated_at"})


@dataclass
class InMemoryPort(MemoryPort):
    """Memories of every tenant in a dict, behind the port's methods (see the module)."""

    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    address: str = ADDRESS
    searches: list[SearchQuery] = field(default_factory=list)
    scripted_search: SearchResult | None = None
    upserts: list[UpsertCall] = field(default_factory=list)
    upsert_attempts: list[float] = field(default_factory=list)  # time.monotonic() of each
    fail_upserts_next: list[grpc.StatusCode] = field(default_factory=list)
    fail_upserts_always: grpc.StatusCode | None = None
    upsert_delay_s: float = 0.0
    _held: dict[str, _Held] = field(default_factory=dict)
    _serving: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._serving.set()

    # -- what tests read ---------------------------------------------------------------

    def records(self, tenant: str) -> list[MemoryRecord]:
        """The tenant's memories, newest first (superseded ones included)."""
        return sorted(
            (h.record for h in self._held.values() if h.tenant == tenant), key=_newest_first
        )

    # -- the port ----------------------------------------------------------------------

    def set_serving(self, serving: bool) -> None:
        """Down (every call fails UNAVAILABLE) or back up."""
        if serving:
            self._serving.set()
        else:
            self._serving.clear()

    async def is_serving(self, timeout_s: float = 2.0) -> bool:
        return self._serving.is_set()

    async def until_serving(self) -> None:
        await self._serving.wait()

    def as_factory(self) -> Callable[[object], AbstractAsyncContextManager[InMemoryPort]]:
        """What the gateway's ``create_app`` and a ``Worker`` take as ``memory_port``:
        this port, for as long as they run (it outlives them: tests read it after)."""
        return lambda _settings: contextlib.nullcontext(self)

    def _reachable(self, call: str) -> None:
        if not self._serving.is_set():
            raise RetrievalError(call, grpc.StatusCode.UNAVAILABLE, "retrieval is not serving")

    async def upsert(self, tenant: str, records: Sequence[MemoryRecord]) -> list[Stored]:
        if not records:
            return []
        self._reachable("Upsert")
        self.upsert_attempts.append(time.monotonic())
        if self.upsert_delay_s:
            await asyncio.sleep(self.upsert_delay_s)
        code = self.fail_upserts_next.pop(0) if self.fail_upserts_next else None
        code = code or self.fail_upserts_always
        if code is not None:
            raise RetrievalError("Upsert", code, f"injected {code.name}")
        _require_tenant("Upsert", tenant)
        if len(records) > MAX_UPSERT_BATCH:
            raise _invalid("Upsert", f"at most {MAX_UPSERT_BATCH} memories per Upsert")
        ids = []
        for i, record in enumerate(records):
            point_id = _normal_id(record.id)
            if point_id is None:
                raise _invalid("Upsert", f"memories[{i}].id is not a UUID: {record.id!r}")
            if not record.display_text.strip():
                raise _invalid("Upsert", f"memories[{i}]: text is empty")
            ids.append(point_id)
        foreign = [i for i in ids if i in self._held and self._held[i].tenant != tenant]
        if foreign:
            raise RetrievalError(
                "Upsert", grpc.StatusCode.ALREADY_EXISTS, f"ids already exist: {', '.join(foreign)}"
            )
        now = self.clock()
        stored = []
        for point_id, record in zip(ids, records, strict=True):
            held = self._held.get(point_id)
            previous = held.record if held is not None else None
            created_at = record.created_at
            if created_at is None and previous is not None:
                created_at = previous.created_at
            fresh = record.model_copy(
                update={"id": point_id, "created_at": created_at or now, "updated_at": now}
            )
            if previous is not None and _content(previous) == _content(fresh):
                status, fresh = UpsertStatus.UNCHANGED, previous
            else:
                status = UpsertStatus.UPDATED if previous is not None else UpsertStatus.CREATED
                self._held[point_id] = _Held(tenant, fresh)
            stamps = {
                "id": point_id,
                "created_at": fresh.created_at,
                "updated_at": fresh.updated_at,
            }
            stored.append(Stored(record.model_copy(update=stamps), status))
        self.upserts.append(UpsertCall(tenant, [r.model_copy() for r in records]))
        return stored

    async def get(self, tenant: str, ids: Iterable[str]) -> dict[str, MemoryRecord]:
        self._reachable("Get")
        _require_tenant("Get", tenant)
        found = {}
        for raw in self._ids("Get", ids):
            held = self._held.get(_normal_id(raw) or "")
            if held is not None and held.tenant == tenant:
                found[held.record.id] = held.record.model_copy(deep=True)
        return found

    async def delete(self, tenant: str, ids: Iterable[str]) -> list[str]:
        self._reachable("Delete")
        _require_tenant("Delete", tenant)
        deleted = []
        for raw in self._ids("Delete", ids):
            point_id = _normal_id(raw) or ""
            held = self._held.get(point_id)
            if held is not None and held.tenant == tenant:
                del self._held[point_id]
                deleted.append(point_id)
        return deleted

    @staticmethod
    def _ids(call: str, ids: Iterable[str]) -> list[str]:
        wanted = list(dict.fromkeys(i for i in ids if i))
        if len(wanted) > MAX_IDS:
            raise _invalid(call, f"at most {MAX_IDS} ids per call")
        return wanted

    async def list_page(
        self, tenant: str, flt: MemoryFilter, *, page_size: int = 50, page_token: str = ""
    ) -> Page:
        self._reachable("List")
        _require_tenant("List", tenant)
        if page_size < 0:
            raise _invalid("List", "page_size must not be negative")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        selected = [r for r in self.records(tenant) if _matches(r, flt)]
        if page_token:
            after = _decode_token(page_token)
            selected = [r for r in selected if _newest_first(r) > after]
        page = [r.model_copy(deep=True) for r in selected[:size]]
        more = len(selected) > size
        return Page(page, _encode_token(page[-1]) if more else "", {r.id: "" for r in page})

    async def count(self, tenant: str, flt: MemoryFilter) -> KindCounts:
        self._reachable("Count")
        _require_tenant("Count", tenant)
        kinds = tuple(dict.fromkeys(flt.kinds)) or KIND_NAMES
        found = Counter(r.kind for r in self.records(tenant) if _matches(r, flt))
        by_kind: dict[str, int] = {kind: found.get(kind, 0) for kind in kinds}
        return KindCounts(total=sum(by_kind.values()), by_kind=by_kind)

    async def list_scopes(
        self,
        tenant: str,
        *,
        user_id: str | None = None,
        limit: int = 100,
        include_superseded: bool = False,
    ) -> ScopeList:
        self._reachable("ListScopes")
        _require_tenant("ListScopes", tenant)
        if not 0 <= limit <= MAX_SCOPES_LIMIT:
            raise _invalid("ListScopes", f"limit must be within [0, {MAX_SCOPES_LIMIT}]")
        limit = limit or DEFAULT_SCOPES_LIMIT
        flt = MemoryFilter(user_id=user_id, include_superseded=include_superseded)
        selected = [r for r in self.records(tenant) if _matches(r, flt)]
        if user_id is None:
            counts = Counter(r.user_id for r in selected)
        else:
            counts = Counter(r.conversation_id for r in selected)
        ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        scopes = [
            ScopeCount(value, "", n) if user_id is None else ScopeCount(user_id, value, n)
            for value, n in ordered[:limit]
        ]
        return ScopeList(scopes, len(ordered) > limit)

    async def search(self, query: SearchQuery) -> SearchResult:
        self._reachable("Search")
        self.searches.append(query)
        top_k = _validated(query)
        if self.scripted_search is not None:
            return copy.deepcopy(self.scripted_search)
        kinds = tuple(dict.fromkeys(query.kinds)) or DEFAULT_SEARCH_KINDS
        now = query.now or self.clock()
        candidates: dict[str, tuple[ScopeName, MemoryRecord]] = {}
        for scope in _scopes(query):
            for record in self.records(query.tenant):
                current = record.is_current or query.include_superseded
                if record.kind in kinds and current and scope.matches(record):
                    candidates.setdefault(record.id, (scope.name, record))
        result = SearchResult(outcome="empty", candidates_considered=len(candidates))
        if candidates:
            hits = [self._hit(query, scope, record, now) for scope, record in candidates.values()]
            if len(hits) <= SMALL_STORE_SIZE:
                hits.sort(key=lambda h: _newest_first(h.memory))
                hits.sort(key=lambda h: -kind_policy(h.memory.kind).small_store_rank)
                result.outcome, result.hits = "small_store", hits[:top_k]
            else:
                threshold = query.score_threshold or 0.0
                kept = [h for h in hits if h.scores.relevance > threshold]
                kept.sort(key=lambda h: (-h.scores.total, h.memory.id))
                result.outcome = "ranked" if kept else "nothing_relevant"
                result.hits = kept[:top_k]
        if query.attachments:
            result.summary = self._summary(query)
            result.profile = self._profile(query)
        return result

    def _hit(
        self, query: SearchQuery, scope: ScopeName, record: MemoryRecord, now: datetime
    ) -> SearchHit:
        rel = relevance(query.text, record.display_text)
        created = record.created_at or now
        age_days = max((now - created).total_seconds(), 0.0) / 86_400
        recency = math.exp(-age_days / RECENCY_HALF_LIFE_DAYS)
        weight = (
            query.recency_weight if query.recency_weight is not None else DEFAULT_RECENCY_WEIGHT
        )
        total = (1 - weight) * rel + weight * recency
        scores = Scores(
            dense=rel, sparse=None, relevance=rel, recency=recency, total=total, mmr=total
        )
        return SearchHit(memory=record.model_copy(deep=True), scores=scores, scope=scope)

    def _summary(self, query: SearchQuery) -> MemoryRecord | None:
        conversation = query.conversation_id or DEFAULT_CONVERSATION
        held = self._held.get(summary_memory_id(query.tenant, query.user_id, conversation))
        if held is None or held.tenant != query.tenant or held.record.kind != "summary":
            return None
        return held.record.model_copy(deep=True)

    def _profile(self, query: SearchQuery) -> list[MemoryRecord]:
        """Active entries: one per (category, key), highest confidence, then newest."""
        best: dict[tuple[str, str], MemoryRecord] = {}
        flt = MemoryFilter(user_id=query.user_id, kinds=("profile",))
        for record in self.records(query.tenant):  # newest first
            if not _matches(record, flt):
                continue
            entry = record.profile
            key = (entry.category, entry.key) if entry is not None else ("", record.id)
            confidence = entry.confidence if entry is not None else 0.0
            held = best.get(key)
            held_confidence = -1.0
            if held is not None:
                held_confidence = held.profile.confidence if held.profile is not None else 0.0
            if confidence > held_confidence:
                best[key] = record
        return [r.model_copy(deep=True) for r in best.values()]


def _validated(query: SearchQuery) -> int:
    """The query's top_k, after the checks the service makes."""
    if not query.tenant.strip():
        raise _invalid("Search", "tenant is required")
    if not query.text.strip():
        raise _invalid("Search", "query is empty")
    for kind in query.kinds:
        if not kind_policy(kind).embedded:
            raise _invalid("Search", f"kinds: {kind} memories are not searched")
    top_k = query.top_k if query.top_k is not None else DEFAULT_TOP_K
    if not 1 <= top_k <= MAX_TOP_K:
        raise _invalid("Search", f"top_k must be within [1, {MAX_TOP_K}] (got {top_k})")
    for name in ("recency_weight", "score_threshold", "mmr_lambda"):
        value = getattr(query, name)
        if value is not None and not 0.0 <= value <= 1.0:
            raise _invalid("Search", f"{name} must be within [0, 1] (got {value})")
    return top_k


def _scopes(query: SearchQuery) -> list[_Scope]:
    """The service's scopes: this conversation, the user's others, the tenant-wide bucket."""
    user = query.user_id
    conversation = query.conversation_id or DEFAULT_CONVERSATION
    wanted = tuple(dict.fromkeys(query.scopes)) or DEFAULT_SEARCH_SCOPES
    excluded = (conversation,) if user else (conversation, GLOBAL_CONVERSATION)
    scopes = []
    for name in wanted:
        if name == "conversation":
            scopes.append(
                _Scope(name, lambda r: r.user_id == user and r.conversation_id == conversation)
            )
        elif name == "user":
            scopes.append(
                _Scope(name, lambda r: r.user_id == user and r.conversation_id not in excluded)
            )
        elif not (is_tenant_wide(user, conversation) and "conversation" in wanted):
            scopes.append(_Scope(name, lambda r: r.is_tenant_wide))
    return scopes


def _matches(record: MemoryRecord, flt: MemoryFilter) -> bool:
    created = record.created_at
    checks = (
        flt.user_id is None or record.user_id == flt.user_id,
        not flt.conversation_id or record.conversation_id == flt.conversation_id,
        not flt.kinds or record.kind in flt.kinds,
        not flt.tags or bool(set(flt.tags) & set(record.tags)),
        not flt.source_ids or record.source_id in flt.source_ids,
        not flt.role or record.role == flt.role,
        flt.include_superseded or record.is_current,
        flt.created_after is None or (created is not None and created >= flt.created_after),
        flt.created_before is None or (created is not None and created < flt.created_before),
    )
    return all(checks)


def _encode_token(last: MemoryRecord) -> str:
    created = last.created_at or _EPOCH
    return f"{created.timestamp()!r}|{last.id}"


def _decode_token(token: str) -> tuple[float, str]:
    try:
        stamp, point_id = token.split("|", 1)
        return (-float(stamp), point_id)
    except ValueError as exc:
        raise _invalid("List", "page_token is not one this service issued") from exc
