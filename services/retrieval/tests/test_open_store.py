"""open_store picks the adapter from the settings: edge by default, qdrant-client's
local mode with ENGRAM_QDRANT_PATH (a directory or ':memory:')."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engram_retrieval.settings import RetrievalSettings
from engram_retrieval.store import PointFilter, StoredPoint, open_store
from engram_retrieval.store.edge import EdgeStore
from engram_retrieval.store.qdrant import QdrantStore

DIM = 4


def _point() -> StoredPoint:
    return StoredPoint(
        id="00000000-0000-0000-0000-000000000001",
        payload={"tenant": "a", "conversation_id": "c", "kind": "fact", "superseded_by": None},
        vector=np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32),
    )


async def test_default_is_the_embedded_edge_store(tmp_path: Path) -> None:
    store = await open_store(
        RetrievalSettings(data_dir=tmp_path, qdrant_url=None, qdrant_path=None), DIM
    )
    try:
        assert isinstance(store, EdgeStore)
        assert (tmp_path / "qdrant" / "engram_memories").is_dir()
    finally:
        await store.close()


@pytest.mark.parametrize("location", [":memory:", "dir"])
async def test_qdrant_path_opens_local_mode(tmp_path: Path, location: str) -> None:
    path = ":memory:" if location == ":memory:" else str(tmp_path / "local")
    settings = RetrievalSettings(data_dir=tmp_path, qdrant_url=None, qdrant_path=path)
    store = await open_store(settings, DIM)
    try:
        assert isinstance(store, QdrantStore)
        await store.upsert("a", [_point()])
        assert await store.count(PointFilter(tenant="a")) == 1
    finally:
        await store.close()
    if location == "dir":
        reopened = await open_store(settings, DIM)
        try:  # on disk: the point survived the restart
            assert await reopened.count(PointFilter(tenant="a")) == 1
        finally:
            await reopened.close()
    assert not (tmp_path / "qdrant").exists()


@pytest.mark.parametrize("optimize", [True, False])
async def test_edge_optimisation_follows_the_settings(tmp_path: Path, optimize: bool) -> None:
    settings = RetrievalSettings(
        data_dir=tmp_path,
        qdrant_url=None,
        qdrant_path=None,
        edge_optimize=optimize,
        edge_index_threshold=500,
    )
    store = await open_store(settings, DIM)
    try:
        assert isinstance(store, EdgeStore)
        assert store.optimize_after == (500 if optimize else None)
    finally:
        await store.close()
