"""The server store: a Qdrant collection through ``qdrant_client.AsyncQdrantClient``.

Used when ``ENGRAM_QDRANT_URL`` is set (Kubernetes, shared deployments). The same
adapter runs on qdrant-client's local mode (``location=":memory:"`` or ``path``), which
the contract tests use; local mode has no payload indexes, so none are created there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from qdrant_client import AsyncQdrantClient
from qdrant_client import models as m

from engram_core.logging import get_logger
from engram_retrieval.lexical import SPARSE_VECTOR, SparseVec
from engram_retrieval.store.base import (
    DENSE_VECTOR,
    PAYLOAD_INDEXES,
    TOKENS_VECTOR,
    DimensionMismatchError,
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

log = get_logger(__name__)


def to_qdrant_filter(
    flt: PointFilter, *, before: str | None = None, at: str | None = None
) -> m.Filter:
    must: list[Any] = [m.FieldCondition(key="tenant", match=m.MatchValue(value=flt.tenant))]
    must_not: list[Any] = []
    if flt.user_id is not None:
        must.append(m.FieldCondition(key="user_id", match=m.MatchValue(value=flt.user_id)))
    if flt.conversation_id is not None:
        must.append(
            m.FieldCondition(key="conversation_id", match=m.MatchValue(value=flt.conversation_id))
        )
    if flt.exclude_conversation_ids:
        must_not.append(
            m.FieldCondition(
                key="conversation_id", match=m.MatchAny(any=list(flt.exclude_conversation_ids))
            )
        )
    if flt.kinds:
        must.append(m.FieldCondition(key="kind", match=m.MatchAny(any=list(flt.kinds))))
    if flt.tags:
        must.append(m.FieldCondition(key="tags", match=m.MatchAny(any=list(flt.tags))))
    if flt.source_ids:
        must.append(m.FieldCondition(key="source_id", match=m.MatchAny(any=list(flt.source_ids))))
    if flt.role is not None:
        must.append(m.FieldCondition(key="role", match=m.MatchValue(value=flt.role)))
    if flt.turn_index is not None:
        must.append(m.FieldCondition(key="turn_index", match=m.MatchValue(value=flt.turn_index)))
    if flt.context_turn_ids:
        followed = m.MatchAny(any=list(flt.context_turn_ids))
        must.append(m.FieldCondition(key="context_turn_id", match=followed))
    if not flt.include_superseded:
        must.append(m.IsEmptyCondition(is_empty=m.PayloadField(key="superseded_by")))
    if flt.created_after is not None or flt.created_before is not None:
        bounds = m.DatetimeRange(gte=flt.created_after, lt=flt.created_before)
        must.append(m.FieldCondition(key="created_at", range=bounds))
    if before is not None:
        must.append(m.FieldCondition(key="created_at", range=m.DatetimeRange(lt=before)))
    if at is not None:
        must.append(m.FieldCondition(key="created_at", range=m.DatetimeRange(gte=at, lte=at)))
    return m.Filter(must=must, must_not=must_not or None)


class QdrantStore:
    """:class:`~engram_retrieval.store.base.MemoryStore` on a Qdrant collection."""

    def __init__(
        self,
        client: AsyncQdrantClient,
        collection: str,
        dim: int,
        *,
        late_interaction: bool = True,
    ) -> None:
        self._client = client
        self.collection = collection
        self.dim = dim
        self.late_interaction = late_interaction
        self.reads_inline = False
        self.kept_search_points = 0

    @classmethod
    async def open(
        cls,
        collection: str,
        dim: int,
        *,
        url: str | None = None,
        api_key: str | None = None,
        location: str | None = None,
        path: str | None = None,
    ) -> QdrantStore:
        """Connect (server ``url``, or local ``location``/``path``) and ensure the collection."""
        local = url is None
        client = AsyncQdrantClient(url=url, api_key=api_key, location=location, path=path)
        try:
            late = await _ensure_collection(client, collection, dim, indexes=not local)
        except BaseException:
            await client.close()
            raise
        if not late:
            log.warning(
                "store.no_token_vectors",
                detail="searching without late interaction; run `engram rebuild` into a new "
                "ENGRAM_QDRANT_COLLECTION to re-index",
                collection=collection,
            )
        return cls(client, collection, dim, late_interaction=late)

    async def upsert(self, tenant: str, points: Sequence[StoredPoint]) -> None:
        if not points:
            return
        records = await self._client.retrieve(
            self.collection, [p.id for p in points], with_payload=["tenant"], with_vectors=False
        )
        taken = foreign_ids(tenant, [(str(r.id), (r.payload or {}).get("tenant")) for r in records])
        if taken:
            raise ForeignIdError(taken)
        structs = [
            m.PointStruct(id=p.id, vector=_vectors(p, self.late_interaction), payload=p.payload)
            for p in points
        ]
        await self._client.upsert(self.collection, structs, wait=True)

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
        queries: list[tuple[Any, str]] = []
        if dense:
            queries.append((np.asarray(vector, dtype=np.float32).tolist(), DENSE_VECTOR))
        if sparse:
            queries.append((_sparse(sparse), SPARSE_VECTOR))
        requests = [
            m.QueryRequest(
                query=query,
                using=using,
                filter=to_qdrant_filter(f),
                limit=limit,
                with_payload=True,
                with_vector=[DENSE_VECTOR],
            )
            for f in filters
            for query, using in queries
        ]
        responses = await self._client.query_batch_points(self.collection, requests)
        rows = [[stored_point(p, score=float(p.score)) for p in r.points] for r in responses]
        return merge_batch_rows(vector, rows, dense=dense, lexical=bool(sparse))

    async def retrieve(
        self, tenant: str, ids: Sequence[str], *, with_vectors: bool = False
    ) -> list[StoredPoint]:
        if not ids:
            return []
        vectors = [DENSE_VECTOR, TOKENS_VECTOR] if self.late_interaction else [DENSE_VECTOR]
        records = await self._client.retrieve(
            self.collection,
            list(ids),
            with_payload=True,
            with_vectors=vectors if with_vectors else False,
        )
        points = [stored_point(r) for r in records]
        return [p for p in points if p.payload.get("tenant") == tenant]

    async def late_scores(
        self, tenant: str, query_tokens: np.ndarray, ids: Sequence[str]
    ) -> dict[str, float]:
        if not ids or not self.late_interaction or len(query_tokens) == 0:
            return {}
        response = await self._client.query_points(
            self.collection,
            query=np.asarray(query_tokens, dtype=np.float32).tolist(),
            using=TOKENS_VECTOR,
            query_filter=m.Filter(
                must=[
                    m.FieldCondition(key="tenant", match=m.MatchValue(value=tenant)),
                    m.HasIdCondition(has_id=list(ids)),
                ]
            ),
            limit=len(ids),
            with_payload=False,
            with_vectors=False,
        )
        return {str(p.id): float(p.score) for p in response.points}

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]:
        owned = [p.id for p in await self.retrieve(tenant, ids)]
        if owned:
            await self._client.delete(
                self.collection, m.PointIdsList(points=list(owned)), wait=True
            )
        return owned

    async def list_page(
        self, flt: PointFilter, limit: int, after: PageCursor | None = None
    ) -> Page:
        return await newest_first_page(flt, limit, after, self._ordered_before, self._at)

    async def _ordered_before(
        self, flt: PointFilter, before: str | None, limit: int
    ) -> list[StoredPoint]:
        records, _ = await self._client.scroll(
            self.collection,
            scroll_filter=to_qdrant_filter(flt, before=before),
            limit=limit,
            order_by=m.OrderBy(key="created_at", direction=m.Direction.DESC),
            with_payload=True,
            with_vectors=False,
        )
        return [stored_point(r) for r in records]

    async def _at(
        self, flt: PointFilter, instant: str, after_id: str | None, limit: int
    ) -> list[StoredPoint]:
        records, _ = await self._client.scroll(
            self.collection,
            scroll_filter=to_qdrant_filter(flt, at=instant),
            offset=after_id,
            limit=limit + (1 if after_id else 0),
            with_payload=True,
            with_vectors=False,
        )
        points = [stored_point(r) for r in records]
        return [p for p in points if p.id != after_id][:limit]

    async def count(self, flt: PointFilter) -> int:
        result = await self._client.count(
            self.collection, count_filter=to_qdrant_filter(flt), exact=True
        )
        return int(result.count)

    async def facet(self, flt: PointFilter, key: str, limit: int) -> list[tuple[str, int]]:
        found = await self._client.facet(
            self.collection, key, facet_filter=to_qdrant_filter(flt), limit=limit, exact=True
        )
        return [(str(hit.value), int(hit.count)) for hit in found.hits]

    async def count_embedded_by_others(self, model_id: str) -> int:
        current = m.FieldCondition(key="embedding_model", match=m.MatchValue(value=model_id))
        result = await self._client.count(
            self.collection, count_filter=m.Filter(must_not=[current]), exact=True
        )
        return int(result.count)

    async def close(self) -> None:
        await self._client.close()


def _sparse(vec: SparseVec) -> m.SparseVector:
    return m.SparseVector(indices=list(vec.indices), values=list(vec.values))


def _vectors(point: StoredPoint, late_interaction: bool) -> dict[str, Any]:
    vectors: dict[str, Any] = {DENSE_VECTOR: np.asarray(point.vector, dtype=np.float32).tolist()}
    if point.sparse:
        vectors[SPARSE_VECTOR] = _sparse(point.sparse)
    if late_interaction and point.tokens is not None and len(point.tokens):
        vectors[TOKENS_VECTOR] = np.asarray(point.tokens, dtype=np.float32).tolist()
    return vectors


def _tokens_params(dim: int) -> m.VectorParams:
    # Scored only for given ids (late interaction over a candidate pool): no graph, on disk.
    return m.VectorParams(
        size=dim,
        distance=m.Distance.COSINE,
        multivector_config=m.MultiVectorConfig(comparator=m.MultiVectorComparator.MAX_SIM),
        datatype=m.Datatype.FLOAT16,
        on_disk=True,
        hnsw_config=m.HnswConfigDiff(m=0, payload_m=0),
    )


async def _ensure_collection(
    client: AsyncQdrantClient, collection: str, dim: int, *, indexes: bool
) -> bool:
    """Create the collection or check an existing one; whether it has token vectors."""
    late = True
    if await client.collection_exists(collection):
        info = await client.get_collection(collection)
        vectors = info.config.params.vectors
        params = vectors.get(DENSE_VECTOR) if isinstance(vectors, dict) else None
        if params is None or params.size != dim:
            found = params.size if params is not None else "no"
            raise DimensionMismatchError(f"collection {collection!r}", found, dim)
        if SPARSE_VECTOR not in (info.config.params.sparse_vectors or {}):
            raise StoreError(
                f"collection {collection!r} has no sparse vector {SPARSE_VECTOR!r}; "
                "use another ENGRAM_QDRANT_COLLECTION"
            )
        late = isinstance(vectors, dict) and TOKENS_VECTOR in vectors
    else:
        await client.create_collection(
            collection,
            vectors_config={
                DENSE_VECTOR: m.VectorParams(size=dim, distance=m.Distance.COSINE),
                TOKENS_VECTOR: _tokens_params(dim),
            },
            sparse_vectors_config={SPARSE_VECTOR: m.SparseVectorParams(modifier=m.Modifier.IDF)},
        )
    if not indexes:
        return late
    for name, kind in PAYLOAD_INDEXES:
        schema: Any
        if kind == "tenant":
            schema = m.KeywordIndexParams(type=m.KeywordIndexType.KEYWORD, is_tenant=True)
        elif kind == "datetime":
            schema = m.PayloadSchemaType.DATETIME
        else:
            schema = m.PayloadSchemaType.KEYWORD
        # Idempotent on the server: an existing index of the same type is kept.
        await client.create_payload_index(collection, name, field_schema=schema, wait=True)
    return late
