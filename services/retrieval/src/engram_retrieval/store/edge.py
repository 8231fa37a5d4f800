"""The embedded store: a Qdrant Edge shard on local disk (``qdrant-edge-py``).

Edge calls are synchronous; they run on one dedicated thread so the event loop never
blocks on them and the shard is only ever touched from one thread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from qdrant_edge import (
    CountRequest,
    DatetimeIndexParams,
    Direction,
    Distance,
    EdgeConfig,
    EdgeShard,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    IsEmptyCondition,
    KeywordIndexParams,
    MatchAny,
    MatchValue,
    Modifier,
    OrderBy,
    PayloadSelector,
    Point,
    Query,
    QueryBatchRequest,
    QueryRequest,
    RangeDateTime,
    ScrollRequest,
    SparseVector,
    UpdateOperation,
)

from engram_retrieval.lexical import SPARSE_VECTOR, SparseVec
from engram_retrieval.store.base import (
    DENSE_VECTOR,
    PAYLOAD_INDEXES,
    ForeignIdError,
    Page,
    PageCursor,
    PointFilter,
    StoredPoint,
    StoreError,
    foreign_ids,
    merge_batch_rows,
    newest_first_page,
    stored_point,
)

T = TypeVar("T")


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
    if not flt.include_superseded:
        must.append(IsEmptyCondition("superseded_by"))
    if before is not None:
        must.append(FieldCondition("created_at", range=RangeDateTime(lt=before)))
    if at is not None:
        must.append(FieldCondition("created_at", range=RangeDateTime(gte=at, lte=at)))
    return Filter(must=must, must_not=must_not or None)


class EdgeStore:
    """:class:`~engram_retrieval.store.base.MemoryStore` on a Qdrant Edge shard."""

    def __init__(self, shard: EdgeShard, executor: ThreadPoolExecutor, dim: int) -> None:
        self._shard = shard
        self._executor = executor
        self.dim = dim
        self._closed = False

    @classmethod
    async def open(cls, path: Path, dim: int) -> EdgeStore:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qdrant-edge")
        loop = asyncio.get_running_loop()
        try:
            shard = await loop.run_in_executor(executor, _open_shard, path, dim)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(shard, executor, dim)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreError("store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    async def upsert(self, tenant: str, points: Sequence[StoredPoint]) -> None:
        if not points:
            return
        records = await self._run(
            self._shard.retrieve,
            [p.id for p in points],
            PayloadSelector.Include(["tenant"]),
            False,
        )
        taken = foreign_ids(tenant, [(str(r.id), (r.payload or {}).get("tenant")) for r in records])
        if taken:
            raise ForeignIdError(taken)
        edge_points = [Point(p.id, _vectors(p), p.payload) for p in points]
        await self._run(self._shard.update, UpdateOperation.upsert_points(edge_points))

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
        batch = QueryBatchRequest(
            [
                QueryRequest(
                    limit=limit,
                    query=query,
                    filter=to_edge_filter(f),
                    with_payload=True,
                    with_vector=[DENSE_VECTOR],
                )
                for f in filters
                for query in queries
            ]
        )
        results = await self._run(self._shard.query_batch, batch)
        rows = [[stored_point(r, score=float(r.score)) for r in found] for found in results]
        return merge_batch_rows(vector, rows, dense=dense, lexical=bool(sparse))

    async def retrieve(
        self, tenant: str, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[StoredPoint]:
        if not ids:
            return []
        records = await self._run(
            self._shard.retrieve, list(ids), True, [DENSE_VECTOR] if with_vectors else False
        )
        points = [stored_point(r) for r in records]
        return [p for p in points if p.payload.get("tenant") == tenant]

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]:
        owned = [p.id for p in await self.retrieve(tenant, ids)]
        if owned:
            await self._run(self._shard.update, UpdateOperation.delete_points(list(owned)))
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
        records, _ = await self._run(self._shard.scroll, request)
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
        records, _ = await self._run(self._shard.scroll, request)
        points = [stored_point(r) for r in records]
        return [p for p in points if p.id != after_id][:limit]

    async def count(self, flt: PointFilter) -> int:
        request = CountRequest(exact=True, filter=to_edge_filter(flt))
        return int(await self._run(self._shard.count, request))

    async def close(self) -> None:
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        shard = self._shard

        def _close() -> None:
            shard.flush()
            shard.close()

        await loop.run_in_executor(self._executor, _close)
        self._closed = True
        self._executor.shutdown(wait=True)


def _sparse(vec: SparseVec) -> SparseVector:
    return SparseVector(list(vec.indices), list(vec.values))


def _vectors(point: StoredPoint) -> dict[str, Any]:
    vectors: dict[str, Any] = {DENSE_VECTOR: np.asarray(point.vector, dtype=np.float32).tolist()}
    if point.sparse:
        vectors[SPARSE_VECTOR] = _sparse(point.sparse)
    return vectors


def _edge_config(dim: int) -> EdgeConfig:
    return EdgeConfig(
        vectors={DENSE_VECTOR: EdgeVectorParams(size=dim, distance=Distance.Cosine)},
        sparse_vectors={SPARSE_VECTOR: EdgeSparseVectorParams(modifier=Modifier.Idf)},
    )


def _open_shard(path: Path, dim: int) -> EdgeShard:
    config = _edge_config(dim)
    try:
        if path.is_dir() and any(path.iterdir()):
            shard = EdgeShard.load(str(path), config)
        else:
            path.mkdir(parents=True, exist_ok=True)
            shard = EdgeShard.create(str(path), config)
    except Exception as exc:  # the bindings raise plain Exception subclasses
        raise StoreError(f"cannot open the embedded Qdrant store at {path}: {exc}") from exc
    existing = set(shard.info().payload_schema)
    for name, kind in PAYLOAD_INDEXES:
        if name in existing:
            continue
        schema: Any
        if kind == "tenant":
            schema = KeywordIndexParams(is_tenant=True)
        elif kind == "datetime":
            schema = DatetimeIndexParams()
        else:
            schema = KeywordIndexParams()
        shard.update(UpdateOperation.create_field_index(name, schema))
    return shard
