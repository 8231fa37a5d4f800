"""The embedded store: a Qdrant Edge shard on local disk (``qdrant-edge-py``).

Edge calls are synchronous and hold the GIL while they run (measured: a Python thread
beside back-to-back queries runs at half speed, as beside another Python thread), so a
thread gives them no parallelism with the event loop. Reads therefore run inline on
the event loop: a hop to a thread and back cost more CPU than a typical read
(docs/benchmarks.md). Writes, the journal and the switch to an optimised copy run on
one dedicated edge thread, in order; a lock keeps a read off a shard while the switch
closes it. Holding the GIL is also why HNSW indexes are never built in this process: a
build of 100k points takes minutes and would freeze the whole service. Instead, once
``optimize_after`` points were written, :meth:`EdgeStore.optimize` builds them in a
child process over a copy of the shard (:mod:`engram_retrieval.store.edge_optimize`)
while this process keeps serving from the original, replays the writes made
meanwhile onto the optimised copy in small steps, and switches to it.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
from qdrant_edge import (
    CountRequest,
    Direction,
    EdgeShard,
    FacetRequest,
    FieldCondition,
    Filter,
    HasIdCondition,
    IsEmptyCondition,
    MatchAny,
    MatchValue,
    OrderBy,
    PayloadSelector,
    Point,
    Query,
    QueryBatchRequest,
    QueryRequest,
    RangeDateTime,
    Record,
    ScrollRequest,
    SparseVector,
    UpdateOperation,
)

if TYPE_CHECKING:
    from qdrant_edge import PointId  # the stubs' alias, not a runtime name

from engram_core.logging import get_logger
from engram_core.lru import LruCache
from engram_retrieval.lexical import SPARSE_VECTOR, SparseVec
from engram_retrieval.store.base import (
    DENSE_VECTOR,
    TOKENS_VECTOR,
    DenseVectorCache,
    ForeignIdError,
    Page,
    PageCursor,
    PointFilter,
    RecordVector,
    StoredPoint,
    StoreError,
    foreign_ids,
    lexical_only_ids,
    merge_batch_rows,
    newest_first_page,
    stored_point,
)
from engram_retrieval.store.edge_optimize import ShardGenerations, run_optimizer
from engram_retrieval.store.edge_shard import DEFAULT_INDEX_THRESHOLD, TOKEN_DATATYPES, open_shard

#: Dense vectors kept converted for MMR (ENGRAM_EDGE_VECTOR_CACHE): 12 MB at 384-d
DEFAULT_VECTOR_CACHE = 8192
#: Recently searched points kept converted (ENGRAM_EDGE_POINT_CACHE): ≈ 3 KB each
DEFAULT_POINT_CACHE = 4096
#: The engine's search threads (ENGRAM_EDGE_SEARCH_THREADS): 1, a query on the caller's
DEFAULT_SEARCH_THREADS = 1

T = TypeVar("T")

log = get_logger(__name__)

# Writes replayed per edge-thread call while catching up after an optimisation: each is
# one Upsert/Delete, so searches wait for at most a few of them.
CATCH_UP_OPS = 4


def to_edge_filter(flt: PointFilter, *, before: str | None = None, at: str | None = None) -> Filter:
    must: list[Any] = [FieldCondition("tenant", match=MatchValue(flt.tenant))]
    must_not: list[Any] = []
    if flt.user_id is not None:
        must.append(FieldCondition("user_id", match=MatchValue(flt.user_id)))
    if flt.conversation_id is not None:
        must.append(FieldCondition("conversation_id", match=MatchValue(flt.conversation_id)))
    if flt.exclude_conversation_ids:
        must_not.append(
            FieldCondition("conversation_id", match=MatchAny(list(flt.exclude_conversation_ids)))
        )
    if flt.kinds:
        must.append(FieldCondition("kind", match=MatchAny(list(flt.kinds))))
    if flt.tags:
        must.append(FieldCondition("tags", match=MatchAny(list(flt.tags))))
    if flt.source_ids:
        must.append(FieldCondition("source_id", match=MatchAny(list(flt.source_ids))))
    if flt.role is not None:
        must.append(FieldCondition("role", match=MatchValue(flt.role)))
    if flt.turn_index is not None:
        must.append(FieldCondition("turn_index", match=MatchValue(flt.turn_index)))
    if flt.context_turn_ids:
        must.append(FieldCondition("context_turn_id", match=MatchAny(list(flt.context_turn_ids))))
    if not flt.include_superseded:
        must.append(IsEmptyCondition("superseded_by"))
    if flt.created_after is not None or flt.created_before is not None:
        bounds = RangeDateTime(gte=flt.created_after, lt=flt.created_before)
        must.append(FieldCondition("created_at", range=bounds))
    if before is not None:
        must.append(FieldCondition("created_at", range=RangeDateTime(lt=before)))
    if at is not None:
        must.append(FieldCondition("created_at", range=RangeDateTime(gte=at, lte=at)))
    return Filter(must=must, must_not=must_not or None)


def _search_point(uid: uuid.UUID, record: Record, vectors: DenseVectorCache) -> StoredPoint:
    """A search result whose dense vector is converted when first read, or taken from
    ``vectors`` when an earlier search converted it (the key needs the ``embed_hash``)."""
    payload = record.payload or {}
    embedded = payload.get("embed_hash")
    key = (uid.int, str(embedded)) if embedded else None
    return StoredPoint(str(uid), payload, RecordVector(record, vectors, key))


class EdgeStore:
    """:class:`~engram_retrieval.store.base.MemoryStore` on a Qdrant Edge shard."""

    def __init__(
        self,
        shard: EdgeShard,
        executor: ThreadPoolExecutor,
        dim: int,
        *,
        generations: ShardGenerations,
        optimize_after: int | None = None,
        index_threshold: int = DEFAULT_INDEX_THRESHOLD,
        unindexed: int = 0,
        late_interaction: bool = True,
        vector_cache: int = DEFAULT_VECTOR_CACHE,
        point_cache: int = DEFAULT_POINT_CACHE,
        search_threads: int | None = None,
    ) -> None:
        self._shard = shard
        self._search_threads = search_threads
        self.vectors = DenseVectorCache(vector_cache)
        # A search's candidates as it read them (payload and vector), by UUID int: most
        # are the same memories of one user search after search, and reading a point
        # back out of the shard (≈ 12 µs) and converting its payload (as much again)
        # was over half of the store's part of a search. Every write of a point goes
        # through upsert or delete, which drop its entry once the shard holds the write.
        self.search_points: LruCache[int, StoredPoint] = LruCache(point_cache)
        #: The last search's points' UUIDs by id (late_scores reads them).
        self._searched_uuids: dict[str, uuid.UUID] = {}
        self.late_interaction = late_interaction
        self.reads_inline = True
        self.kept_search_points = point_cache
        self._executor = executor
        self.dim = dim
        self._closed = False
        #: Held by a read, and by the edge thread while it switches or closes the shard.
        self._shard_lock = threading.Lock()
        self._generations = generations
        self._index_threshold = index_threshold
        self.optimize_after = optimize_after
        self._unindexed = unindexed  # points written since the last optimisation
        # Writes made while a copy is being optimised, replayed onto it before the switch.
        self._journal: list[UpdateOperation] | None = None
        self._writes = asyncio.Lock()  # held while the shard's files are copied
        self._optimizing: asyncio.Task[bool] | None = None
        self.optimizations = 0

    @classmethod
    async def open(
        cls,
        path: Path,
        dim: int,
        *,
        optimize_after: int | None = None,
        index_threshold: int | None = None,
        vector_cache: int = DEFAULT_VECTOR_CACHE,
        point_cache: int = DEFAULT_POINT_CACHE,
        search_threads: int | None = DEFAULT_SEARCH_THREADS,
    ) -> EdgeStore:
        """Open (or create) the shard at ``path``. ``optimize_after`` points written
        start a background optimisation (None: never); ``index_threshold`` is the
        segment size (points) that gets an HNSW index, by default ``optimize_after``;
        ``search_threads``: the engine's search threads (edge_shard.edge_config)."""
        threshold = index_threshold or optimize_after or DEFAULT_INDEX_THRESHOLD
        generations = ShardGenerations(path)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qdrant-edge")
        loop = asyncio.get_running_loop()
        try:
            shard, tokens = await loop.run_in_executor(
                executor, open_shard, generations.open_active(), dim, threshold, search_threads
            )
            # A store never optimised by a switch may hold any number of plain points.
            unindexed = 0 if generations.switched else shard.info().points_count
        except BaseException:
            executor.shutdown(wait=False)
            raise
        store = cls(
            shard,
            executor,
            dim,
            generations=generations,
            optimize_after=optimize_after,
            index_threshold=threshold,
            unindexed=unindexed,
            late_interaction=tokens is not None,
            vector_cache=vector_cache,
            point_cache=point_cache,
            search_threads=search_threads,
        )
        if tokens is None:
            log.warning(
                "store.no_token_vectors",
                detail="searching without late interaction; run `engram rebuild` to re-index",
                path=str(path),
            )
        elif tokens != TOKEN_DATATYPES[0]:
            log.info(
                "store.float16_token_vectors",
                detail="token vectors are not quantised; `engram rebuild` into a fresh "
                "store makes it smaller in memory (docs/retrieval.md, Token vectors)",
                path=str(path),
            )
        store._maybe_optimize()
        return store

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreError("store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _read(self, method: str, *args: Any) -> Any:
        """A read (``method`` of the current shard), inline on the event loop."""
        with self._shard_lock:
            if self._closed:
                raise StoreError("store is closed")
            return getattr(self._shard, method)(*args)

    async def upsert(self, tenant: str, points: Sequence[StoredPoint]) -> None:
        if not points:
            return
        records = self._read(
            "retrieve",
            [p.id for p in points],
            PayloadSelector.Include(["tenant"]),
            False,
        )
        taken = foreign_ids(tenant, [(str(r.id), (r.payload or {}).get("tenant")) for r in records])
        if taken:
            raise ForeignIdError(taken)
        edge_points = [Point(p.id, _vectors(p, self.late_interaction), p.payload) for p in points]
        try:
            await self._update(UpdateOperation.upsert_points(edge_points))
        finally:
            self._forget_search_points(p.id for p in points)
        self._unindexed += len(points)
        self._maybe_optimize()

    def _forget_search_points(self, ids: Iterable[str]) -> None:
        """Drop the cached search reads of ``ids``: called on the event loop once the
        edge thread applied (or failed) their write, so a search that read a point before
        the write cannot keep it, and one reading after it reads the write."""
        for point_id in ids:
            self.search_points.pop(uuid_int(point_id))

    async def _update(self, operation: UpdateOperation) -> None:
        async with self._writes:
            await self._run(self._apply, operation)

    def _apply(self, operation: UpdateOperation) -> None:  # on the edge thread
        self._shard.update(operation)
        if self._journal is not None:
            self._journal.append(operation)

    async def search(
        self,
        vector: np.ndarray,
        filters: Sequence[PointFilter],
        limit: int,
        *,
        sparse: SparseVec | None = None,
        dense: bool = True,
    ) -> list[list[StoredPoint]]:
        if not filters:
            return []
        if not dense and not sparse:
            return [[] for _ in filters]
        queries = []
        if dense:
            queries.append(
                Query.Nearest(np.asarray(vector, dtype=np.float32).tolist(), using=DENSE_VECTOR)
            )
        if sparse:
            queries.append(Query.Nearest(_sparse(sparse), using=SPARSE_VECTOR))
        # Each scope's filter is built once and shared by its dense and lexical queries.
        # The batch returns ids and scores only, and each distinct point's payload and
        # vector is read once afterwards: reading payloads inside the queries cost the
        # engine more than the whole batch plus one retrieve (a point found by several
        # queries was read, and converted, once per row).
        batch = QueryBatchRequest(
            [
                QueryRequest(
                    limit=limit,
                    query=query,
                    filter=edge_filter,
                    with_payload=False,
                    with_vector=False,
                )
                for edge_filter in map(to_edge_filter, filters)
                for query in queries
            ]
        )
        with self._shard_lock:  # both reads see one shard, even across a switch
            if self._closed:
                raise StoreError("store is closed")
            # Every Engram point id is a UUID (engram_core.ids); the bindings build a new
            # uuid.UUID per access, and its int is the cheap key.
            hits = cast(
                list[list[tuple[uuid.UUID, float]]],
                [
                    [(r.id, float(r.score)) for r in found]
                    for found in self._shard.query_batch(batch)
                ],
            )
            distinct = {uid.int: uid for found in hits for uid, _ in found}
            points: dict[int, StoredPoint] = {}
            missing: list[PointId] = []
            for key, uid in distinct.items():
                cached = self.search_points.get(key)
                if cached is None:
                    missing.append(uid)
                else:
                    points[key] = cached
            records = self._shard.retrieve(missing, True, [DENSE_VECTOR]) if missing else []
        read = cast(list[tuple[uuid.UUID, Record]], [(r.id, r) for r in records])
        for uid, record in read:
            point = points[uid.int] = _search_point(uid, record, self.vectors)
            if self.search_points.capacity:
                np.asarray(point.vector)  # converted now: a cached point holds no record
                self.search_points.put(uid.int, point)
        uuids = {points[key].id: uid for key, uid in distinct.items() if key in points}
        self._searched_uuids = uuids
        # Writes run on the edge thread and may land between the two reads: a point
        # deleted meanwhile is no candidate, nor is one whose id another tenant's write
        # took over meanwhile (the retrieve by id does not filter on the tenant).
        tenants = [flt.tenant for flt in filters for _ in queries]
        rows = [
            [
                StoredPoint(base.id, base.payload, base.vector, score=score)
                for uid, score in found
                if (base := points.get(uid.int)) is not None
                and base.payload.get("tenant") == tenant
            ]
            for found, tenant in zip(hits, tenants, strict=True)
        ]
        lexical_only = lexical_only_ids(rows, dense=dense, lexical=bool(sparse))
        # lexical-only points exist only beside a dense query, which is queries[0]
        cosines = (
            self._cosines(filters[0].tenant, queries[0], {i: uuids[i] for i in lexical_only})
            if lexical_only
            else {}
        )
        return merge_batch_rows(vector, rows, dense=dense, lexical=bool(sparse), cosines=cosines)

    def _cosines(self, tenant: str, nearest: Query, ids: dict[str, uuid.UUID]) -> dict[str, float]:
        """The dense query's cosine to each of ``ids`` (each point's id and its UUID),
        scored by the engine (one query restricted to them) instead of converting their
        vectors to compute it here."""
        request = QueryRequest(
            limit=len(ids),
            query=nearest,
            filter=Filter(
                must=[
                    FieldCondition("tenant", match=MatchValue(tenant)),
                    HasIdCondition(set(ids.values())),
                ]
            ),
            with_payload=False,
            with_vector=False,
        )
        return _scores_by_id(self._read("query", request), ids)

    async def retrieve(
        self, tenant: str, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[StoredPoint]:
        if not ids:
            return []
        vectors = [DENSE_VECTOR, TOKENS_VECTOR] if self.late_interaction else [DENSE_VECTOR]
        records = self._read("retrieve", list(ids), True, vectors if with_vectors else False)
        points = [stored_point(r) for r in records]
        return [p for p in points if p.payload.get("tenant") == tenant]

    async def late_scores(
        self, tenant: str, query_tokens: np.ndarray, ids: Sequence[str]
    ) -> dict[str, float]:
        if not ids or not self.late_interaction or len(query_tokens) == 0:
            return {}
        # The candidates are the last search's points: their UUIDs are at hand, and the
        # engine reads a UUID in less time than its text. Another's (a search in between)
        # goes as text, which names the same point.
        searched = self._searched_uuids
        keys: dict[str, uuid.UUID | str] = {i: searched.get(i) or i for i in ids}
        request = QueryRequest(
            limit=len(ids),
            query=Query.Nearest(
                # Lists of the float32 values: the binding reads them in half the time
                # it takes over the array itself (0.06 vs 0.12 ms for 5 tokens).
                np.asarray(query_tokens, dtype=np.float32).tolist(),
                using=TOKENS_VECTOR,
            ),
            filter=Filter(
                must=[
                    FieldCondition("tenant", match=MatchValue(tenant)),
                    HasIdCondition(set(keys.values())),
                ]
            ),
            with_payload=False,
            with_vector=False,
        )
        found = self._read("query", request)
        return _scores_by_id(found, keys)

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]:
        owned = [p.id for p in await self.retrieve(tenant, ids)]
        if owned:
            try:
                await self._update(UpdateOperation.delete_points(list(owned)))
            finally:
                self._forget_search_points(owned)
        return owned

    async def list_page(
        self, flt: PointFilter, limit: int, after: PageCursor | None = None
    ) -> Page:
        return await newest_first_page(flt, limit, after, self._ordered_before, self._at)

    async def _ordered_before(
        self, flt: PointFilter, before: str | None, limit: int
    ) -> list[StoredPoint]:
        request = ScrollRequest(
            limit=limit,
            filter=to_edge_filter(flt, before=before),
            with_payload=True,
            with_vector=False,
            order_by=OrderBy("created_at", direction=Direction.Desc),
        )
        records, _ = self._read("scroll", request)
        return [stored_point(r) for r in records]

    async def _at(
        self, flt: PointFilter, instant: str, after_id: str | None, limit: int
    ) -> list[StoredPoint]:
        # offset is inclusive: ask for one more and drop the cursor's own point.
        request = ScrollRequest(
            offset=after_id,
            limit=limit + (1 if after_id else 0),
            filter=to_edge_filter(flt, at=instant),
            with_payload=True,
            with_vector=False,
        )
        records, _ = self._read("scroll", request)
        points = [stored_point(r) for r in records]
        return [p for p in points if p.id != after_id][:limit]

    async def count(self, flt: PointFilter) -> int:
        request = CountRequest(exact=True, filter=to_edge_filter(flt))
        return int(self._read("count", request))

    async def facet(self, flt: PointFilter, key: str, limit: int) -> list[tuple[str, int]]:
        request = FacetRequest(key, limit=limit, exact=True, filter=to_edge_filter(flt))
        found = self._read("facet", request)
        return [(str(hit.value), int(hit.count)) for hit in found.hits]

    async def count_embedded_by_others(self, model_id: str) -> int:
        current = FieldCondition("embedding_model", match=MatchValue(model_id))
        request = CountRequest(exact=True, filter=Filter(must_not=[current]))
        return int(self._read("count", request))

    async def close(self) -> None:
        if self._closed:
            return
        if self._optimizing is not None:
            self._optimizing.cancel()
            await asyncio.gather(self._optimizing, return_exceptions=True)
        loop = asyncio.get_running_loop()
        shard = self._shard

        def _close() -> None:
            with self._shard_lock:
                self._closed = True
                shard.flush()
                shard.close()

        await loop.run_in_executor(self._executor, _close)
        self._executor.shutdown(wait=True)

    # -- background optimisation --------------------------------------------------------

    @property
    def optimizing(self) -> bool:
        return self._optimizing is not None and not self._optimizing.done()

    def _maybe_optimize(self) -> None:
        if (
            self.optimize_after is None
            or self._closed
            or self.optimizing
            or self._unindexed < self.optimize_after
        ):
            return
        self._start_optimization()

    def _start_optimization(self) -> asyncio.Task[bool]:
        if self._optimizing is None or self._optimizing.done():
            self._optimizing = asyncio.create_task(self._optimize(), name="edge-optimize")
        return self._optimizing

    async def optimize(self) -> bool:
        """Build the HNSW indexes in a child process and switch to the result (joins
        the running optimisation if there is one).

        Reads and writes go on meanwhile: writes pause only while the shard's files are
        copied, and land in the copy too (journal, replayed a few at a time). Returns
        whether the store switched to an optimised copy.
        """
        return await self._start_optimization()

    async def _optimize(self) -> bool:
        target = self._generations.next_path()
        started = time.perf_counter()
        switched = False
        copy: asyncio.Future[None] | None = None
        try:
            async with self._writes:
                await self._run(self._begin_journal)
                copy = asyncio.ensure_future(
                    asyncio.to_thread(_copy_shard, self._generations.active, target)
                )
                await asyncio.shield(copy)
            self._unindexed = 0  # from here on, points count toward the next round
            report = await run_optimizer(target, self.dim, self._index_threshold)
            if not report.get("optimized"):
                return False
            fresh, _ = await self._run(
                open_shard, target, self.dim, self._index_threshold, self._search_threads
            )
            previous = self._generations.active
            try:
                while not switched:
                    switched = await self._run(self._catch_up, fresh, target)
            finally:
                if not switched:
                    await self._run(fresh.close)
            await asyncio.to_thread(shutil.rmtree, previous, True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed optimisation leaves the store as it was
            log.warning("store.optimise_failed", error=str(exc), target=str(target))
            return False
        finally:
            if not self._closed and not switched:
                await self._run(self._end_journal)
            if not switched:
                if copy is not None:  # a cancelled wait leaves the copying thread running
                    await asyncio.gather(copy, return_exceptions=True)
                await asyncio.to_thread(shutil.rmtree, target, True)
        self.optimizations += 1
        log.info(
            "store.optimised",
            generation=target.name,
            seconds=round(time.perf_counter() - started, 1),
            child_seconds=report.get("seconds"),
            segments=report.get("segments"),
        )
        return True

    def _begin_journal(self) -> None:  # on the edge thread
        self._shard.flush()
        self._journal = []

    def _end_journal(self) -> None:  # on the edge thread
        self._journal = None

    def _catch_up(self, fresh: EdgeShard, target: Path) -> bool:  # on the edge thread
        """Replay a few journaled writes onto ``fresh``; once none are left, switch."""
        journal = self._journal
        assert journal is not None
        for operation in journal[:CATCH_UP_OPS]:
            fresh.update(operation)
        del journal[:CATCH_UP_OPS]
        if journal:
            return False
        fresh.flush()
        with self._shard_lock:
            old = self._shard
            self._generations.switch_to(target)
            self._shard, self._journal = fresh, None
            old.close()
        return True


def _scores_by_id(found: Sequence[Any], ids: dict[str, Any]) -> dict[str, float]:
    """Each found point's score under the id it was asked for (``ids``: id → the id
    as the engine took it, a UUID or its canonical text), without formatting every
    UUID the engine returns back into text."""
    by_int = {uuid_int(key): point_id for point_id, key in ids.items()}
    return {by_int[r.id.int]: float(r.score) for r in found}


def uuid_int(key: uuid.UUID | str) -> int:
    """The 128-bit value of a UUID, or of its text (any case, with or without dashes)."""
    return key.int if isinstance(key, uuid.UUID) else int(key.replace("-", ""), 16)


def _sparse(vec: SparseVec) -> SparseVector:
    return SparseVector(list(vec.indices), list(vec.values))


def _vectors(point: StoredPoint, late_interaction: bool) -> dict[str, Any]:
    vectors: dict[str, Any] = {DENSE_VECTOR: np.asarray(point.vector, dtype=np.float32).tolist()}
    if point.sparse:
        vectors[SPARSE_VECTOR] = _sparse(point.sparse)
    if late_interaction and point.tokens is not None and len(point.tokens):
        vectors[TOKENS_VECTOR] = np.asarray(point.tokens, dtype=np.float16)
    return vectors


def _copy_shard(source: Path, target: Path) -> None:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
