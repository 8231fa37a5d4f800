"""The storage interface of the retrieval service, independent of the Qdrant flavour.

Every read takes the tenant and every adapter puts it in the filter, so no code path
can return or delete another tenant's points (retrieve/delete by id check it too).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from engram_core.lru import LruCache
from engram_retrieval.lexical import SparseVec

DENSE_VECTOR = "dense"
# Token vectors of the index key (a MaxSim multivector, float16) for late interaction.
TOKENS_VECTOR = "tokens"

# (field, index type) created on open. tenant is the tenant index (Qdrant co-locates a
# tenant's points); created_at is a datetime index (range filters, newest-first order).
PAYLOAD_INDEXES: tuple[tuple[str, str], ...] = (
    ("tenant", "tenant"),
    ("user_id", "keyword"),
    ("conversation_id", "keyword"),
    ("kind", "keyword"),
    ("role", "keyword"),
    ("source_id", "keyword"),
    ("context_turn_id", "keyword"),
    ("tags", "keyword"),
    ("superseded_by", "keyword"),
    ("created_at", "datetime"),
)


class StoreError(RuntimeError):
    """The store cannot be opened or used (bad path, incompatible collection...)."""


class DimensionMismatchError(StoreError):
    """The store holds vectors of another dimension than the embedder's: another model."""

    def __init__(self, where: str, stored: int | str, produced: int) -> None:
        super().__init__(
            f"{where} holds {stored}-d vectors but the embedder produces {produced}-d ones "
            "(another embedding model). `engram reembed` re-embeds in place only at the "
            "same dimension: point ENGRAM_QDRANT_COLLECTION at a new collection and run "
            "`engram rebuild` (from the mirror), or go back to the model that wrote it"
        )
        self.stored = stored
        self.produced = produced


class ForeignIdError(StoreError):
    """An upsert names point ids that belong to another tenant."""

    def __init__(self, ids: Sequence[str]) -> None:
        super().__init__(f"ids already in use: {', '.join(ids)}")
        self.ids = list(ids)


@dataclass(frozen=True)
class PointFilter:
    """Which points a read may see. ``None``/empty fields do not constrain."""

    tenant: str
    user_id: str | None = None
    conversation_id: str | None = None
    exclude_conversation_ids: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()  # any of
    source_ids: tuple[str, ...] = ()  # any of
    role: str | None = None
    #: a turn's place in its conversation (``turn_index``)
    turn_index: int | None = None
    #: turns whose BM25 document also holds one of these turns' words (writes.py)
    context_turn_ids: tuple[str, ...] = ()  # any of
    include_superseded: bool = False
    # created_at bounds, in the payload's timestamp format: after <= created_at < before.
    created_after: str | None = None
    created_before: str | None = None

    def __post_init__(self) -> None:
        if not self.tenant:
            raise ValueError("a store filter always names the tenant")


#: Dense vectors of recently ranked points (float32, read-only), keyed by (point id,
#: ``embed_hash``). Converting a search result's vector out of the embedded store's record
#: (a list of 384 Python floats, then an array) costs ≈ 30 µs a point, and MMR compares up
#: to ≈ 150 candidates a search, mostly the same memories of one user search after search.
#: A point's vector changes only with its index key or embedding model (retrieval's write
#: path reuses it otherwise, and no request carries vectors), which change ``embed_hash``,
#: so an entry is never stale and writes need not invalidate it.
DenseVectorCache = LruCache[tuple[int, str], np.ndarray]


class RecordVector:
    """A search result's dense vector, converted from the store's record when first
    read (``np.asarray``). A search ranks most of its candidates on their scores alone;
    only the ones MMR compares, and lexical-only ones (for their cosine), need the
    vector, and converting every row's 384 floats was over a quarter of the store's part
    of a search. With a cache and the point's key, a vector converted by an earlier
    search is not converted again."""

    __slots__ = ("_array", "_cache", "_key", "_record")

    def __init__(
        self,
        record: Any,
        cache: DenseVectorCache | None = None,
        key: tuple[int, str] | None = None,
    ) -> None:
        self._record: Any = record
        self._array: np.ndarray | None = None
        self._cache = cache if key is not None else None
        self._key = key

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if self._array is None:
            cache, key = self._cache, self._key
            array = cache.get(key) if cache is not None and key is not None else None
            if array is None:
                # float32 values are exact in float64: MMR reads the same values either way
                array = dense_vector_of(self._record.vector, dtype=np.float32)
                if array is None:
                    raise StoreError("a search result came back without its dense vector")
                array.setflags(write=False)
                if cache is not None and key is not None:
                    cache.put(key, array)
            self._array, self._record = array, None
        return self._array if dtype is None else self._array.astype(dtype, copy=False)


@dataclass
class StoredPoint:
    id: str
    payload: dict[str, Any]
    #: An array, or for search results of the embedded store one converted when read.
    vector: np.ndarray | RecordVector | None = None
    score: float | None = None  # cosine to the query, for search results
    sparse: SparseVec | None = None  # BM25 document vector, written on upsert
    sparse_score: float | None = None  # BM25 score, when the lexical source found it
    tokens: np.ndarray | None = None  # (n, dim) token vectors of the index key

    @property
    def created_at(self) -> str:
        return str(self.payload.get("created_at") or "")


def dense_vector_of(raw: Any, *, dtype: Any = np.float32) -> np.ndarray | None:
    """The dense vector from a record's vector field (plain list or named vectors)."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        raw = raw.get(DENSE_VECTOR)
        if raw is None:
            return None
    return np.asarray(raw, dtype=dtype)


def token_vectors_of(raw: Any) -> np.ndarray | None:
    if not isinstance(raw, dict) or raw.get(TOKENS_VECTOR) is None:
        return None
    return np.asarray(raw[TOKENS_VECTOR], dtype=np.float16)


def stored_point(record: Any, *, score: float | None = None) -> StoredPoint:
    """A StoredPoint from either adapter's record (both expose id, payload, vector)."""
    vectors = record.vector  # built anew by the bindings on every access: read once
    return StoredPoint(
        id=str(record.id),
        payload=dict(record.payload or {}),
        vector=dense_vector_of(vectors),
        score=score,
        tokens=token_vectors_of(vectors),
    )


@dataclass(frozen=True)
class PageCursor:
    """Position in newest-first order: (created_at desc, id asc)."""

    created_at: str
    id: str


@dataclass
class Page:
    points: list[StoredPoint] = field(default_factory=list)
    next: PageCursor | None = None


T = TypeVar("T")


class PerSearchedPoint(Generic[T]):
    """What is made of a searched point (the ranking's signals, the reply's message),
    made once while the store hands out the same payload object for it
    (``MemoryStore.kept_search_points``: the embedded shard's cache of searched points
    makes a new object once the point is written again). An entry holds while its
    payload is the very object it was made from; it keeps that object alive, so the
    check is sound. As large as the store's cache: a server's store, which keeps none,
    keeps nothing here either."""

    def __init__(self, capacity: int, make: Callable[[StoredPoint], T]) -> None:
        self._made: LruCache[str, tuple[dict[str, Any], T]] = LruCache(capacity)
        self._make = make

    def of(self, point: StoredPoint) -> T:
        payload = point.payload
        cached = self._made.get(point.id)
        if cached is not None and cached[0] is payload:
            return cached[1]
        made = self._make(point)
        self._made.put(point.id, (payload, made))
        return made


class MemoryStore(Protocol):
    """Async access to the memory collection. Implementations: edge, qdrant."""

    dim: int
    # False for a collection created before token vectors were stored: search then
    # ranks without late interaction until the index is rebuilt (docs/retrieval.md).
    late_interaction: bool
    #: Reads run on the caller's thread and never wait on I/O (the embedded shard): two
    #: of them gain nothing from being awaited together. False for a server.
    reads_inline: bool
    #: How many searched points a search hands out again as the very same objects, until
    #: a point is written again (the embedded shard's cache of searched points); 0: every
    #: read makes new ones (a server).
    kept_search_points: int

    async def upsert(self, tenant: str, points: Sequence[StoredPoint]) -> None:
        """Insert or replace the tenant's points (each with payload and vector).

        Raises :class:`ForeignIdError`, writing nothing, when an id belongs to another
        tenant: a write can never take over another tenant's point.
        """
        ...

    async def search(
        self,
        vector: np.ndarray,
        filters: Sequence[PointFilter],
        limit: int,
        *,
        sparse: SparseVec | None = None,
        dense: bool = True,
    ) -> list[list[StoredPoint]]:
        """Candidates per filter, with payload and dense vector, run as one batch.

        Each list holds the ``limit`` dense nearest neighbours (``score`` = cosine;
        skipped when ``dense`` is false) and, when ``sparse`` has terms, the ``limit``
        best BM25 matches as well (``sparse_score``), merged by :func:`merge_hybrid`.
        ``vector`` is needed either way: it gives lexical-only matches their cosine.
        """
        ...

    async def late_scores(
        self, tenant: str, query_tokens: np.ndarray, ids: Sequence[str]
    ) -> dict[str, float]:
        """MaxSim of the query's token vectors against each point's (the sum over query
        tokens of the best cosine among the point's tokens), computed by the engine, for
        the tenant's points among ``ids`` that have token vectors."""
        ...

    async def retrieve(
        self, tenant: str, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[StoredPoint]:
        """The points among ``ids`` that exist and belong to ``tenant`` (with their dense
        and token vectors when ``with_vectors``)."""
        ...

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]:
        """Delete the tenant's points among ``ids``; returns the ids deleted."""
        ...

    async def list_page(
        self, flt: PointFilter, limit: int, after: PageCursor | None = None
    ) -> Page:
        """Newest first (created_at desc, then id asc); ``next`` set when more follow."""
        ...

    async def count(self, flt: PointFilter) -> int: ...

    async def facet(self, flt: PointFilter, key: str, limit: int) -> list[tuple[str, int]]:
        """The distinct values of the keyword field ``key`` among the points ``flt``
        matches, with how many points hold each: most first, at most ``limit``."""
        ...

    async def count_embedded_by_others(self, model_id: str) -> int:
        """Points of every tenant whose ``embedding_model`` is not ``model_id`` (written
        by another model, or before the field existed): what ``engram reembed`` would
        rewrite. A full scan (the field is not indexed), for a check at start-up."""
        ...

    async def close(self) -> None: ...


OrderedBefore = Callable[[PointFilter, str | None, int], Awaitable[list[StoredPoint]]]
AtInstant = Callable[[PointFilter, str, str | None, int], Awaitable[list[StoredPoint]]]


async def newest_first_page(
    flt: PointFilter,
    limit: int,
    after: PageCursor | None,
    ordered_before: OrderedBefore,
    at_instant: AtInstant,
) -> Page:
    """Keyset pagination over (created_at desc, id asc) from two store primitives.

    ``ordered_before(flt, ts, n)``: up to n points with created_at < ts (no bound when
    None), newest first, ties in any order. ``at_instant(flt, ts, after_id, n)``: up to n
    points with created_at == ts and id > after_id, in id order. Qdrant orders by a
    payload field without a tie-break, so a timestamp shared by many points (a bulk
    import) is paged by id instead, which Qdrant's plain scroll does natively.
    """
    want = limit + 1  # one more than asked tells whether a next page exists
    out: list[StoredPoint] = []
    before: str | None = None
    if after is not None:
        out.extend(await at_instant(flt, after.created_at, after.id, want))
        before = after.created_at
    if len(out) < want:
        page = await ordered_before(flt, before, want - len(out))
        if page:
            boundary = page[-1].created_at
            head = [p for p in page if p.created_at != boundary]
            head.sort(key=lambda p: p.id)
            head.sort(key=lambda p: p.created_at, reverse=True)
            out.extend(head)
            out.extend(await at_instant(flt, boundary, None, want - len(out)))
    points = out[:limit]
    more = len(out) > limit
    next_cursor = PageCursor(points[-1].created_at, points[-1].id) if more and points else None
    return Page(points=points, next=next_cursor)


def foreign_ids(tenant: str, owners: Sequence[tuple[str, object]]) -> list[str]:
    """Ids whose stored tenant differs from ``tenant``, from (id, stored tenant) pairs."""
    return [point_id for point_id, owner in owners if owner != tenant]


def lexical_only_ids(rows: Sequence[list[StoredPoint]], *, dense: bool, lexical: bool) -> set[str]:
    """Ids the lexical source found that the dense one did not, in any filter of a batch
    issued per filter as [dense, lexical]: the points whose cosine is not in the rows."""
    if not (dense and lexical):
        return set()
    found: set[str] = set()
    for i in range(0, len(rows), 2):
        found |= {p.id for p in rows[i + 1]} - {p.id for p in rows[i]}
    return found


def merge_batch_rows(
    query: np.ndarray,
    rows: Sequence[list[StoredPoint]],
    *,
    dense: bool,
    lexical: bool,
    cosines: Mapping[str, float] | None = None,
) -> list[list[StoredPoint]]:
    """Regroup a batch's result rows, issued per filter as [dense?, lexical?], into one
    merged candidate list per filter."""
    step = int(dense) + int(lexical)
    if step == 0:
        return []
    return [
        merge_hybrid(
            query,
            rows[i] if dense else [],
            rows[i + step - 1] if lexical else [],
            cosines=cosines,
        )
        for i in range(0, len(rows), step)
    ]


def merge_hybrid(
    query: np.ndarray,
    dense: Sequence[StoredPoint],
    lexical: Sequence[StoredPoint],
    *,
    cosines: Mapping[str, float] | None = None,
) -> list[StoredPoint]:
    """Union of one filter's dense and lexical candidates: dense order first, then the
    lexical-only ones (their cosine from ``cosines`` when the store scored them, else
    computed from the returned vector); every point the lexical source returned carries
    its ``sparse_score``."""
    by_id = {p.id: p for p in dense}
    merged = list(dense)
    q = np.asarray(query, dtype=np.float64)
    q = q / max(float(np.linalg.norm(q)), 1e-12)
    for point in lexical:
        held = by_id.get(point.id)
        if held is not None:
            held.sparse_score = point.score
            continue
        cosine = cosines.get(point.id) if cosines is not None else None
        if cosine is None:
            vector = np.asarray(point.vector, dtype=np.float64)
            cosine = float(vector @ q / max(float(np.linalg.norm(vector)), 1e-12))
        merged.append(
            StoredPoint(
                id=point.id,
                payload=point.payload,
                vector=point.vector,
                score=cosine,
                sparse_score=point.score,
            )
        )
        by_id[point.id] = merged[-1]
    return merged
