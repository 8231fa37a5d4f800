"""The embedded shard's configuration and how it is opened: the same in the service
(:mod:`engram_retrieval.store.edge`) and in the optimiser's child process
(:mod:`engram_retrieval.store.edge_optimize`), which both import it from here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from qdrant_edge import (
    DatetimeIndexParams,
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeShard,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    HnswIndexConfig,
    KeywordIndexParams,
    Modifier,
    MultiVectorComparator,
    MultiVectorConfig,
    UpdateOperation,
    VectorStorageDatatype,
)

from engram_retrieval.lexical import SPARSE_VECTOR
from engram_retrieval.store.base import (
    DENSE_VECTOR,
    PAYLOAD_INDEXES,
    TOKENS_VECTOR,
    DimensionMismatchError,
    StoreError,
)

DEFAULT_INDEX_THRESHOLD = 20_000

# Every read filters on the tenant, so the graph is built per tenant (payload_m on the
# is_tenant index) and there is no global graph (m=0), which no query could use.
# Filters matching fewer vectors than full_scan_threshold (KB of vectors, ~6.6k
# 384-d vectors) are answered exactly through the payload indexes, graph or not.
TENANT_GRAPH_M = 16
# Token vectors are only ever scored for given ids (late interaction over a candidate
# pool), never searched: no graph at all (payload_m 0), and kept on disk.
#
# They are stored quantised (TurboQuant, 8 bits a component): a memory's ≈ 20 token
# vectors take ≈ 8 KB instead of 15 KB in float16, and scoring reads the compact codes
# instead of faulting float16 pages into memory (at 100k memories, 620 searches had
# made 984 MB of float16 token pages resident). MaxSim from the codes differs from
# float16's by ≈ 0.1 % (docs/retrieval.md, "Token vectors"). Shards created with
# float16 token vectors (before 2026-11-24) open as they are; `engram rebuild` into a
# fresh store (a new collection or data dir) gets quantised ones.
TOKEN_DATATYPES = (VectorStorageDatatype.Turbo8, VectorStorageDatatype.Float16)


def _hnsw(payload_m: int, max_indexing_threads: int = 0) -> HnswIndexConfig:
    return HnswIndexConfig(
        m=0,
        payload_m=payload_m,
        ef_construct=100,
        full_scan_threshold=10_000,
        max_indexing_threads=max_indexing_threads,
    )


def edge_config(
    dim: int,
    index_threshold: int = DEFAULT_INDEX_THRESHOLD,
    *,
    tokens: VectorStorageDatatype | None = TOKEN_DATATYPES[0],
    search_threads: int | None = None,
) -> EdgeConfig:
    """The shard's configuration; the same in the service and the optimiser process.
    ``tokens``: how token vectors are stored (None: a shard without them);
    ``search_threads``: the engine's threads a query's segments are searched on (0: its
    own choice, one per core; None: as the shard was last opened with)."""
    vectors = {DENSE_VECTOR: EdgeVectorParams(size=dim, distance=Distance.Cosine)}
    if tokens is not None:
        vectors[TOKENS_VECTOR] = EdgeVectorParams(
            size=dim,
            distance=Distance.Cosine,
            multivector_config=MultiVectorConfig(MultiVectorComparator.MaxSim),
            datatype=tokens,
            on_disk=True,
            hnsw_config=_hnsw(payload_m=0),
        )
    return EdgeConfig(
        vectors=vectors,
        sparse_vectors={SPARSE_VECTOR: EdgeSparseVectorParams(modifier=Modifier.Idf)},
        # one indexing thread: on a small machine the other core keeps serving
        hnsw_config=_hnsw(payload_m=TENANT_GRAPH_M, max_indexing_threads=1),
        optimizers=EdgeOptimizersConfig(
            indexing_threshold=max(1, index_threshold * dim * 4 // 1024),  # KB of vectors
            prevent_unoptimized=False,  # never hide points waiting for an index
        ),
        max_search_threads=search_threads,
    )


def index_schema(kind: str) -> Any:
    # Only the tenant gets HNSW sub-graphs; the other indexes serve exact filtering.
    if kind == "tenant":
        return KeywordIndexParams(is_tenant=True, enable_hnsw=True)
    if kind == "datetime":
        return DatetimeIndexParams(enable_hnsw=False)
    return KeywordIndexParams(enable_hnsw=False)


def open_shard(
    path: Path,
    dim: int,
    index_threshold: int = DEFAULT_INDEX_THRESHOLD,
    search_threads: int | None = None,
) -> tuple[EdgeShard, VectorStorageDatatype | None]:
    """The shard at ``path`` (created when absent) and how it stores token vectors (None:
    it has none). A shard created with an earlier layout opens as it is."""
    try:
        if path.is_dir() and any(path.iterdir()):
            shard, tokens = _load(path, dim, index_threshold, search_threads)
        else:
            path.mkdir(parents=True, exist_ok=True)
            tokens = TOKEN_DATATYPES[0]
            config = edge_config(dim, index_threshold, tokens=tokens, search_threads=search_threads)
            shard = EdgeShard.create(str(path), config)
    except StoreError:
        raise
    except Exception as exc:  # the bindings raise plain Exception subclasses
        raise StoreError(f"cannot open the embedded Qdrant store at {path}: {exc}") from exc
    existing = shard.info().payload_schema
    for name, kind in PAYLOAD_INDEXES:
        schema = index_schema(kind)
        held = existing.get(name)
        if held is not None:
            if getattr(held.params, "enable_hnsw", None) == schema.enable_hnsw:
                continue
            # created before sub-graphs were limited to the tenant: recreate
            shard.update(UpdateOperation.delete_field_index(name))
        shard.update(UpdateOperation.create_field_index(name, schema))
    return shard, tokens


#: How Qdrant names a vector of another size than the configuration's (dense and token
#: vectors have the embedder's dimension; whichever it checks first is named).
_DENSE_SIZE = re.compile(
    rf'vector "(?:{DENSE_VECTOR}|{TOKENS_VECTOR})".*'
    r"expected vector size (?P<produced>\d+), but got (?P<stored>\d+)"
)


def _load(
    path: Path, dim: int, index_threshold: int, search_threads: int | None
) -> tuple[EdgeShard, VectorStorageDatatype | None]:
    # Qdrant refuses a configuration that differs from the stored one, naming the
    # difference: try the current layout, then the earlier ones.
    for tokens in (*TOKEN_DATATYPES, None):
        try:
            config = edge_config(dim, index_threshold, tokens=tokens, search_threads=search_threads)
            return EdgeShard.load(str(path), config), tokens
        except Exception as exc:
            earlier_layout = (
                "expected vector storage datatype" in str(exc)  # other token storage
                or "vector storages with keys" in str(exc)  # a shard without tokens
            )
            other_size = _DENSE_SIZE.search(str(exc))
            if other_size:
                raise DimensionMismatchError(
                    f"the embedded store at {path}", int(other_size["stored"]), dim
                ) from exc
            if tokens is None or not earlier_layout:
                raise
    raise AssertionError("unreachable")
