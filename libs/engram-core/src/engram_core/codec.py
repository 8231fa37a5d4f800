"""The gRPC edge's one vocabulary: every protobuf <-> domain translation and every limit
of ``engram.memory.v1.MemoryService``.

Both sides use it: the client (:mod:`engram_core.memory_port`) encodes
:class:`~engram_core.memory.MemoryRecord`, ``MemoryFilter`` and ``SearchQuery`` and
decodes replies; the retrieval servicer decodes requests into the same domain types and
encodes its answers. The enum tables (kinds, scopes, outcomes, upsert statuses) are
built from the domain's names, so a kind added to the domain and the proto needs no
edit here. Apart from the client's channel and the servicer's registration, nothing
else imports the generated code (tests/unit/test_grpc_edge.py enforces it).

Decoding a request raises :class:`DecodeError` (the caller's mistake: INVALID_ARGUMENT)
with the field at fault in its message.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import cast, get_args

from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import ValidationError

from engram_core import ids
from engram_core.grpc_gen.engram.memory.v1 import memory_pb2 as pb
from engram_core.grpc_gen.engram.memory.v1 import memory_pb2_grpc as pb_grpc
from engram_core.lru import LruCache
from engram_core.memory import (
    DEFAULT_CONVERSATION,
    MemoryFilter,
    MemoryKindName,
    MemoryRecord,
    ProposedProfileFact,
    ScopeName,
    Scores,
    SearchHit,
    SearchOutcome,
    SearchQuery,
    SearchResult,
    UpsertStatus,
)
from engram_core.memory import (
    KIND_NAMES as DOMAIN_KINDS,
)
from engram_core.timestamps import storable_utc

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_SCOPES_LIMIT",
    "KIND_BY_NAME",
    "KIND_NAMES",
    "MAX_IDS",
    "MAX_PAGE_SIZE",
    "MAX_SCOPES_LIMIT",
    "MAX_UPSERT_BATCH",
    "OUTCOME_BY_NAME",
    "SCOPE_BY_NAME",
    "SCOPE_NAMES",
    "STATUS_BY_NAME",
    "DecodeError",
    "filter_from_pb",
    "filter_to_pb",
    "from_timestamp",
    "kind_name",
    "kinds_from_pb",
    "pb",
    "pb_grpc",
    "query_to_pb",
    "record_from_pb",
    "record_to_pb",
    "record_to_write",
    "result_from_pb",
    "search_query",
    "to_timestamp",
    "upsert_status",
]

# --- limits (the service enforces them; the client pages and batches within them) -----

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_IDS = 1000  # per Get or Delete
MAX_UPSERT_BATCH = 2048  # memories per Upsert
DEFAULT_SCOPES_LIMIT = 100
MAX_SCOPES_LIMIT = 1000

# --- enum tables ------------------------------------------------------------------------

# Built from the domain's names: the proto's value of each must exist (fails at import).
KIND_BY_NAME: dict[str, pb.MemoryKind] = {
    name: cast(pb.MemoryKind, pb.MemoryKind.Value(f"MEMORY_KIND_{name.upper()}"))
    for name in DOMAIN_KINDS
}
KIND_NAMES: dict[int, MemoryKindName] = {int(KIND_BY_NAME[name]): name for name in DOMAIN_KINDS}

SCOPE_BY_NAME: dict[str, pb.Scope] = {
    name: cast(pb.Scope, pb.Scope.Value(f"SCOPE_{name.upper()}")) for name in get_args(ScopeName)
}
SCOPE_NAMES: dict[int, ScopeName] = {int(SCOPE_BY_NAME[name]): name for name in get_args(ScopeName)}

OUTCOME_BY_NAME: dict[str, pb.SearchOutcome] = {
    name: cast(pb.SearchOutcome, pb.SearchOutcome.Value(f"SEARCH_OUTCOME_{name.upper()}"))
    for name in get_args(SearchOutcome)
}
_OUTCOME_NAMES: dict[int, SearchOutcome] = {
    int(OUTCOME_BY_NAME[name]): name for name in get_args(SearchOutcome)
}

STATUS_BY_NAME: dict[UpsertStatus, pb.UpsertStatus] = {
    status: cast(pb.UpsertStatus, pb.UpsertStatus.Value(f"UPSERT_STATUS_{status.name}"))
    for status in UpsertStatus
}
_STATUS_NAMES: dict[int, UpsertStatus] = {int(v): s for s, v in STATUS_BY_NAME.items()}


#: The placeholder id of a memory written without one, until its id is derived.
_UNASSIGNED = "unassigned"


class DecodeError(ValueError):
    """A request the caller must fix; the message names the field."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def kind_name(kind: int) -> str:
    """The name of a kind number; "unspecified" for one this version does not know."""
    return KIND_NAMES.get(kind, "unspecified")


def kinds_from_pb(kinds: Iterable[int], field: str) -> tuple[MemoryKindName, ...]:
    """Kind numbers as names, first occurrence order, duplicates dropped."""
    names: list[MemoryKindName] = []
    for kind in kinds:
        name = KIND_NAMES.get(kind)
        if name is None:
            raise DecodeError(f"{field}: unknown memory kind {kind}")
        names.append(name)
    return tuple(dict.fromkeys(names))


def upsert_status(status: int) -> UpsertStatus:
    return _STATUS_NAMES.get(status, UpsertStatus.UPDATED)


# --- timestamps -------------------------------------------------------------------------


def to_timestamp(value: datetime) -> Timestamp:
    """``ValueError`` for a time outside what a Timestamp holds (see
    :mod:`engram_core.timestamps`; entry points check it before)."""
    ts = Timestamp()
    ts.FromDatetime(storable_utc(value))
    return ts


def from_timestamp(ts: Timestamp) -> datetime | None:
    """None for an unset timestamp (seconds and nanos both zero)."""
    seconds, nanos = ts.seconds, ts.nanos
    if seconds == 0 and nanos == 0:
        return None
    return _datetime_at(seconds, nanos)


@functools.lru_cache(maxsize=16384)
def _datetime_at(seconds: int, nanos: int) -> datetime:
    # A Search's reply carries two or four timestamps a hit, mostly of memories that
    # recent replies carried too: converting each anew was half of decoding a reply.
    return Timestamp(seconds=seconds, nanos=nanos).ToDatetime(tzinfo=UTC)


# --- memories ---------------------------------------------------------------------------


def record_from_pb(memory: pb.Memory, *, memory_id: str | None = None) -> MemoryRecord:
    """``memory_id`` replaces the message's id (a write names it after decoding)."""
    profile = None
    if memory.HasField("profile") and memory.profile.key:
        profile = ProposedProfileFact(
            category=memory.profile.category,
            key=memory.profile.key,
            value=memory.profile.value,
            confidence=round(float(memory.profile.confidence), 6),
            importance=round(float(memory.profile.importance), 6),
        )
    turn_range = None
    if memory.HasField("turn_range"):
        turn_range = (int(memory.turn_range.first_turn), int(memory.turn_range.last_turn))
    return MemoryRecord(
        id=memory.id if memory_id is None else memory_id,
        kind=kind_name(memory.kind),
        text=memory.text,
        role=memory.role,
        user_id=memory.user_id,
        conversation_id=memory.conversation_id or DEFAULT_CONVERSATION,
        created_at=from_timestamp(memory.created_at),
        updated_at=from_timestamp(memory.updated_at),
        source_id=memory.source_id,
        turn_index=int(memory.turn_index),
        source_turn_ids=list(memory.source_turn_ids),
        valid_from=from_timestamp(memory.valid_from),
        valid_to=from_timestamp(memory.valid_to),
        superseded_by=memory.superseded_by,
        tags=list(memory.tags),
        profile=profile,
        turn_range=turn_range,
        metadata=dict(memory.metadata),
    )


def record_to_pb(record: MemoryRecord, tenant: str = "", embedding_model: str = "") -> pb.Memory:
    memory = pb.Memory(
        id=record.id,
        tenant=tenant,
        user_id=record.user_id,
        conversation_id=record.conversation_id,
        kind=KIND_BY_NAME.get(record.kind, pb.MEMORY_KIND_UNSPECIFIED),
        text=record.text,
        role=record.role,
        source_id=record.source_id,
        turn_index=record.turn_index,
        source_turn_ids=record.source_turn_ids,
        superseded_by=record.superseded_by,
        tags=record.tags,
        embedding_model=embedding_model,
        metadata=record.metadata,
    )
    for name in ("created_at", "updated_at", "valid_from", "valid_to"):
        value = getattr(record, name)
        if value is not None:
            getattr(memory, name).CopyFrom(to_timestamp(value))
    if (p := record.profile) is not None:
        memory.profile.CopyFrom(
            pb.ProfileEntry(
                category=p.category,
                key=p.key,
                value=p.value,
                confidence=p.confidence,
                importance=p.importance,
            )
        )
    if record.turn_range is not None:
        memory.turn_range.CopyFrom(
            pb.TurnRange(first_turn=record.turn_range[0], last_turn=record.turn_range[1])
        )
    return memory


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def record_to_write(tenant: str, memory: pb.Memory, where: str) -> MemoryRecord:
    """One memory of an Upsert, checked and decoded; written without an id, it gets the
    id derived from its content (:func:`engram_core.ids.memory_id`)."""
    if memory.tenant and memory.tenant != tenant:
        raise DecodeError(f"{where}.tenant differs from the request's tenant")
    if memory.kind not in KIND_NAMES:
        raise DecodeError(f"{where}.kind: unknown memory kind {memory.kind}")
    if memory.id and ids.normalize_id(memory.id) is None:
        raise DecodeError(f"{where}.id is not a UUID: {memory.id!r}")
    try:
        record = record_from_pb(memory, memory_id=ids.normalize_id(memory.id) or _UNASSIGNED)
    except ValidationError as exc:
        raise DecodeError(f"{where}.{_first_error(exc)}") from exc
    if not ids.identity_text(record.text, record.profile).strip():
        raise DecodeError(f"{where}: text is empty (profile entries may use profile)")
    if not memory.id:
        record = record.model_copy(update={"id": ids.memory_id(tenant, record)})
    return record


# --- filters and search -----------------------------------------------------------------


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


def filter_from_pb(
    flt: pb.MemoryFilter, *, kinds_default: Sequence[MemoryKindName] = ()
) -> MemoryFilter:
    """A set bound is a bound, even the epoch (``from_timestamp`` would read it as unset)."""
    return MemoryFilter(
        user_id=flt.user_id if flt.HasField("user_id") else None,
        conversation_id=flt.conversation_id or None,
        kinds=kinds_from_pb(flt.kinds, "filter.kinds") or tuple(kinds_default),
        tags=tuple(flt.tags),
        source_ids=tuple(flt.source_ids),
        role=flt.role or None,
        include_superseded=flt.include_superseded,
        created_after=(
            flt.created_after.ToDatetime(tzinfo=UTC) if flt.HasField("created_after") else None
        ),
        created_before=(
            flt.created_before.ToDatetime(tzinfo=UTC) if flt.HasField("created_before") else None
        ),
    )


def query_to_pb(query: SearchQuery) -> pb.SearchRequest:
    """Only the knobs someone set are sent; retrieval applies its defaults to the rest."""
    request = pb.SearchRequest(
        tenant=query.tenant,
        query=query.text,
        user_id=query.user_id,
        conversation_id=query.conversation_id,
        scopes=[SCOPE_BY_NAME[s] for s in query.scopes],
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


def search_query(request: pb.SearchRequest) -> SearchQuery:
    """The domain query of a SearchRequest; unknown enum values are the caller's error."""
    scopes: list[ScopeName] = []
    for scope in request.scopes:
        if scope not in SCOPE_NAMES:
            raise DecodeError(f"scopes: unknown scope {scope}")
        scopes.append(SCOPE_NAMES[scope])
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
        kinds=kinds_from_pb(request.kinds, "kinds"),
        now=from_timestamp(request.now) if request.HasField("now") else None,
        include_superseded=request.include_superseded,
        attachments=not request.hits_only,
    )


def fill_scores(message: pb.ScoreBreakdown, scores: Scores) -> None:
    """Set ``message`` (a reply's field, filled in place) to ``scores``."""
    message.dense = scores.dense
    message.relevance = scores.relevance
    message.recency = scores.recency
    message.total = scores.total
    message.mmr = scores.mmr
    if scores.sparse is not None:
        message.sparse = scores.sparse


#: Memories of search replies, decoded, by their encoded bytes: the same memories come
#: back search after search (a chat's reply carries about 27), and equal bytes decode to
#: an equal record. Records are frozen, and nothing changes one's lists or metadata in
#: place, so one decoded record can be handed to every reply that carries it.
_SEARCHED: LruCache[bytes, MemoryRecord] = LruCache(4096)


def searched_record(memory: pb.Memory) -> MemoryRecord:
    """``record_from_pb`` of a search hit's memory, decoded once per distinct content."""
    key = memory.SerializeToString(deterministic=True)
    record = _SEARCHED.get(key)
    if record is None:
        record = record_from_pb(memory)
        _SEARCHED.put(key, record)
    return record


def _hit(hit: pb.SearchHit) -> SearchHit:
    s = hit.scores
    return SearchHit(
        memory=searched_record(hit.memory),
        scores=Scores(
            dense=float(s.dense),
            sparse=float(s.sparse) if s.HasField("sparse") else None,
            relevance=float(s.relevance),
            recency=float(s.recency),
            total=float(s.total),
            mmr=float(s.mmr),
        ),
        scope=SCOPE_NAMES.get(hit.scope),
    )


def result_from_pb(reply: pb.SearchResponse) -> SearchResult:
    summary = reply.summary if reply.HasField("summary") and reply.summary.id else None
    return SearchResult(
        outcome=_OUTCOME_NAMES.get(reply.outcome, "ranked"),
        hits=[_hit(h) for h in reply.hits],
        summary=record_from_pb(summary) if summary is not None else None,
        profile=[record_from_pb(m) for m in reply.profile],
        candidates_considered=int(reply.candidates_considered),
        search_ms=reply.timings.total_ms,
    )
