import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemoryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_KIND_UNSPECIFIED: _ClassVar[MemoryKind]
    MEMORY_KIND_TURN: _ClassVar[MemoryKind]
    MEMORY_KIND_FACT: _ClassVar[MemoryKind]
    MEMORY_KIND_PROFILE: _ClassVar[MemoryKind]
    MEMORY_KIND_SUMMARY: _ClassVar[MemoryKind]
    MEMORY_KIND_EPISODE: _ClassVar[MemoryKind]

class Scope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCOPE_UNSPECIFIED: _ClassVar[Scope]
    SCOPE_CONVERSATION: _ClassVar[Scope]
    SCOPE_USER: _ClassVar[Scope]
    SCOPE_GLOBAL: _ClassVar[Scope]

class SearchOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_OUTCOME_UNSPECIFIED: _ClassVar[SearchOutcome]
    SEARCH_OUTCOME_RANKED: _ClassVar[SearchOutcome]
    SEARCH_OUTCOME_SMALL_STORE: _ClassVar[SearchOutcome]
    SEARCH_OUTCOME_NOTHING_RELEVANT: _ClassVar[SearchOutcome]
    SEARCH_OUTCOME_EMPTY: _ClassVar[SearchOutcome]
    SEARCH_OUTCOME_OVERVIEW: _ClassVar[SearchOutcome]

class UpsertStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPSERT_STATUS_UNSPECIFIED: _ClassVar[UpsertStatus]
    UPSERT_STATUS_CREATED: _ClassVar[UpsertStatus]
    UPSERT_STATUS_UPDATED: _ClassVar[UpsertStatus]
    UPSERT_STATUS_UNCHANGED: _ClassVar[UpsertStatus]
MEMORY_KIND_UNSPECIFIED: MemoryKind
MEMORY_KIND_TURN: MemoryKind
MEMORY_KIND_FACT: MemoryKind
MEMORY_KIND_PROFILE: MemoryKind
MEMORY_KIND_SUMMARY: MemoryKind
MEMORY_KIND_EPISODE: MemoryKind
SCOPE_UNSPECIFIED: Scope
SCOPE_CONVERSATION: Scope
SCOPE_USER: Scope
SCOPE_GLOBAL: Scope
SEARCH_OUTCOME_UNSPECIFIED: SearchOutcome
SEARCH_OUTCOME_RANKED: SearchOutcome
SEARCH_OUTCOME_SMALL_STORE: SearchOutcome
SEARCH_OUTCOME_NOTHING_RELEVANT: SearchOutcome
SEARCH_OUTCOME_EMPTY: SearchOutcome
SEARCH_OUTCOME_OVERVIEW: SearchOutcome
UPSERT_STATUS_UNSPECIFIED: UpsertStatus
UPSERT_STATUS_CREATED: UpsertStatus
UPSERT_STATUS_UPDATED: UpsertStatus
UPSERT_STATUS_UNCHANGED: UpsertStatus

class ProfileEntry(_message.Message):
    __slots__ = ("category", "key", "value", "confidence", "importance")
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    category: str
    key: str
    value: str
    confidence: float
    importance: float
    def __init__(self, category: _Optional[str] = ..., key: _Optional[str] = ..., value: _Optional[str] = ..., confidence: _Optional[float] = ..., importance: _Optional[float] = ...) -> None: ...

class TurnRange(_message.Message):
    __slots__ = ("first_turn", "last_turn")
    FIRST_TURN_FIELD_NUMBER: _ClassVar[int]
    LAST_TURN_FIELD_NUMBER: _ClassVar[int]
    first_turn: int
    last_turn: int
    def __init__(self, first_turn: _Optional[int] = ..., last_turn: _Optional[int] = ...) -> None: ...

class Memory(_message.Message):
    __slots__ = ("id", "tenant", "user_id", "conversation_id", "kind", "text", "role", "created_at", "source_id", "turn_index", "source_turn_ids", "valid_from", "valid_to", "superseded_by", "tags", "embedding_model", "profile", "turn_range", "metadata", "updated_at")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_INDEX_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TURN_IDS_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_FIELD_NUMBER: _ClassVar[int]
    VALID_TO_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_BY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_MODEL_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    TURN_RANGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    user_id: str
    conversation_id: str
    kind: MemoryKind
    text: str
    role: str
    created_at: _timestamp_pb2.Timestamp
    source_id: str
    turn_index: int
    source_turn_ids: _containers.RepeatedScalarFieldContainer[str]
    valid_from: _timestamp_pb2.Timestamp
    valid_to: _timestamp_pb2.Timestamp
    superseded_by: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    embedding_model: str
    profile: ProfileEntry
    turn_range: TurnRange
    metadata: _containers.ScalarMap[str, str]
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., kind: _Optional[_Union[MemoryKind, str]] = ..., text: _Optional[str] = ..., role: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source_id: _Optional[str] = ..., turn_index: _Optional[int] = ..., source_turn_ids: _Optional[_Iterable[str]] = ..., valid_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., valid_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., superseded_by: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., embedding_model: _Optional[str] = ..., profile: _Optional[_Union[ProfileEntry, _Mapping]] = ..., turn_range: _Optional[_Union[TurnRange, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ScoreBreakdown(_message.Message):
    __slots__ = ("dense", "sparse", "relevance", "recency", "total", "mmr")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_FIELD_NUMBER: _ClassVar[int]
    RECENCY_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    MMR_FIELD_NUMBER: _ClassVar[int]
    dense: float
    sparse: float
    relevance: float
    recency: float
    total: float
    mmr: float
    def __init__(self, dense: _Optional[float] = ..., sparse: _Optional[float] = ..., relevance: _Optional[float] = ..., recency: _Optional[float] = ..., total: _Optional[float] = ..., mmr: _Optional[float] = ...) -> None: ...

class SearchHit(_message.Message):
    __slots__ = ("memory", "scores", "scope")
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    memory: Memory
    scores: ScoreBreakdown
    scope: Scope
    def __init__(self, memory: _Optional[_Union[Memory, _Mapping]] = ..., scores: _Optional[_Union[ScoreBreakdown, _Mapping]] = ..., scope: _Optional[_Union[Scope, str]] = ...) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("tenant", "query", "user_id", "conversation_id", "top_k", "recency_weight", "score_threshold", "mmr_lambda", "scopes", "kinds", "now", "include_superseded", "hits_only")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    RECENCY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SCORE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    MMR_LAMBDA_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    HITS_ONLY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    query: str
    user_id: str
    conversation_id: str
    top_k: int
    recency_weight: float
    score_threshold: float
    mmr_lambda: float
    scopes: _containers.RepeatedScalarFieldContainer[Scope]
    kinds: _containers.RepeatedScalarFieldContainer[MemoryKind]
    now: _timestamp_pb2.Timestamp
    include_superseded: bool
    hits_only: bool
    def __init__(self, tenant: _Optional[str] = ..., query: _Optional[str] = ..., user_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., top_k: _Optional[int] = ..., recency_weight: _Optional[float] = ..., score_threshold: _Optional[float] = ..., mmr_lambda: _Optional[float] = ..., scopes: _Optional[_Iterable[_Union[Scope, str]]] = ..., kinds: _Optional[_Iterable[_Union[MemoryKind, str]]] = ..., now: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., include_superseded: _Optional[bool] = ..., hits_only: _Optional[bool] = ...) -> None: ...

class StageTimings(_message.Message):
    __slots__ = ("embed_ms", "candidates_ms", "rerank_ms", "mmr_ms", "total_ms")
    EMBED_MS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_MS_FIELD_NUMBER: _ClassVar[int]
    RERANK_MS_FIELD_NUMBER: _ClassVar[int]
    MMR_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    embed_ms: float
    candidates_ms: float
    rerank_ms: float
    mmr_ms: float
    total_ms: float
    def __init__(self, embed_ms: _Optional[float] = ..., candidates_ms: _Optional[float] = ..., rerank_ms: _Optional[float] = ..., mmr_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("hits", "summary", "profile", "outcome", "candidates_considered", "timings")
    HITS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_CONSIDERED_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    hits: _containers.RepeatedCompositeFieldContainer[SearchHit]
    summary: Memory
    profile: _containers.RepeatedCompositeFieldContainer[Memory]
    outcome: SearchOutcome
    candidates_considered: int
    timings: StageTimings
    def __init__(self, hits: _Optional[_Iterable[_Union[SearchHit, _Mapping]]] = ..., summary: _Optional[_Union[Memory, _Mapping]] = ..., profile: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., outcome: _Optional[_Union[SearchOutcome, str]] = ..., candidates_considered: _Optional[int] = ..., timings: _Optional[_Union[StageTimings, _Mapping]] = ...) -> None: ...

class StreamedSearch(_message.Message):
    __slots__ = ("id", "request", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    id: int
    request: SearchRequest
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[int] = ..., request: _Optional[_Union[SearchRequest, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class StreamedSearchReply(_message.Message):
    __slots__ = ("id", "response", "status_code", "status_details")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_DETAILS_FIELD_NUMBER: _ClassVar[int]
    id: int
    response: SearchResponse
    status_code: int
    status_details: str
    def __init__(self, id: _Optional[int] = ..., response: _Optional[_Union[SearchResponse, _Mapping]] = ..., status_code: _Optional[int] = ..., status_details: _Optional[str] = ...) -> None: ...

class UpsertRequest(_message.Message):
    __slots__ = ("tenant", "memories")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    def __init__(self, tenant: _Optional[str] = ..., memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ...) -> None: ...

class UpsertResult(_message.Message):
    __slots__ = ("id", "status", "created_at", "updated_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    status: UpsertStatus
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., status: _Optional[_Union[UpsertStatus, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class UpsertResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[UpsertResult]
    def __init__(self, results: _Optional[_Iterable[_Union[UpsertResult, _Mapping]]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("tenant", "ids")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted_ids", "missing_ids")
    DELETED_IDS_FIELD_NUMBER: _ClassVar[int]
    MISSING_IDS_FIELD_NUMBER: _ClassVar[int]
    deleted_ids: _containers.RepeatedScalarFieldContainer[str]
    missing_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, deleted_ids: _Optional[_Iterable[str]] = ..., missing_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("tenant", "ids")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("memories", "missing_ids")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    MISSING_IDS_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    missing_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., missing_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class MemoryFilter(_message.Message):
    __slots__ = ("user_id", "conversation_id", "kinds", "tags", "include_superseded", "source_ids", "role", "created_after", "created_before")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_IDS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    conversation_id: str
    kinds: _containers.RepeatedScalarFieldContainer[MemoryKind]
    tags: _containers.RepeatedScalarFieldContainer[str]
    include_superseded: bool
    source_ids: _containers.RepeatedScalarFieldContainer[str]
    role: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    def __init__(self, user_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., kinds: _Optional[_Iterable[_Union[MemoryKind, str]]] = ..., tags: _Optional[_Iterable[str]] = ..., include_superseded: _Optional[bool] = ..., source_ids: _Optional[_Iterable[str]] = ..., role: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("tenant", "filter", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    filter: MemoryFilter
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., filter: _Optional[_Union[MemoryFilter, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("memories", "next_page_token")
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    memories: _containers.RepeatedCompositeFieldContainer[Memory]
    next_page_token: str
    def __init__(self, memories: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CountRequest(_message.Message):
    __slots__ = ("tenant", "filter")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    filter: MemoryFilter
    def __init__(self, tenant: _Optional[str] = ..., filter: _Optional[_Union[MemoryFilter, _Mapping]] = ...) -> None: ...

class CountResponse(_message.Message):
    __slots__ = ("count", "by_kind")
    class ByKindEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BY_KIND_FIELD_NUMBER: _ClassVar[int]
    count: int
    by_kind: _containers.ScalarMap[str, int]
    def __init__(self, count: _Optional[int] = ..., by_kind: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ListScopesRequest(_message.Message):
    __slots__ = ("tenant", "user_id", "limit", "include_superseded")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    user_id: str
    limit: int
    include_superseded: bool
    def __init__(self, tenant: _Optional[str] = ..., user_id: _Optional[str] = ..., limit: _Optional[int] = ..., include_superseded: _Optional[bool] = ...) -> None: ...

class ScopeEntry(_message.Message):
    __slots__ = ("user_id", "conversation_id", "memories")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORIES_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    conversation_id: str
    memories: int
    def __init__(self, user_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., memories: _Optional[int] = ...) -> None: ...

class ListScopesResponse(_message.Message):
    __slots__ = ("scopes", "truncated")
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    scopes: _containers.RepeatedCompositeFieldContainer[ScopeEntry]
    truncated: bool
    def __init__(self, scopes: _Optional[_Iterable[_Union[ScopeEntry, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...
