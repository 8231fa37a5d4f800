"""Vector store adapters behind one async interface (:class:`MemoryStore`)."""

from __future__ import annotations

from engram_retrieval.settings import RetrievalSettings
from engram_retrieval.store.base import (
    ForeignIdError,
    MemoryStore,
    Page,
    PageCursor,
    PerSearchedPoint,
    PointFilter,
    StoredPoint,
    StoreError,
)

__all__ = [
    "ForeignIdError",
    "MemoryStore",
    "Page",
    "PageCursor",
    "PerSearchedPoint",
    "PointFilter",
    "StoreError",
    "StoredPoint",
    "open_store",
]


async def open_store(settings: RetrievalSettings, dim: int) -> MemoryStore:
    """The Qdrant server store when ENGRAM_QDRANT_URL is set, qdrant-client's local mode
    when ENGRAM_QDRANT_PATH is, else the embedded one."""
    if settings.qdrant_path:
        from engram_retrieval.store.qdrant import QdrantStore

        memory = settings.qdrant_path == ":memory:"
        return await QdrantStore.open(
            settings.qdrant_collection,
            dim,
            location=":memory:" if memory else None,
            path=None if memory else settings.qdrant_path,
        )
    if settings.qdrant_url:
        from engram_retrieval.store.qdrant import QdrantStore

        api_key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return await QdrantStore.open(
            settings.qdrant_collection, dim, url=settings.qdrant_url, api_key=api_key
        )
    from engram_retrieval.store.edge import EdgeStore

    threshold = settings.edge_index_threshold
    return await EdgeStore.open(
        settings.edge_store_path,
        dim,
        optimize_after=threshold if settings.edge_optimize else None,
        index_threshold=threshold,
        vector_cache=settings.edge_vector_cache,
        point_cache=settings.edge_point_cache,
        search_threads=settings.edge_search_threads,
    )
