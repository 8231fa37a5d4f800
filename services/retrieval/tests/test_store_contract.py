"""One contract, both adapters: the embedded Qdrant Edge shard and qdrant-client
(local mode, the same code path as a Qdrant server apart from payload indexes)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from qdrant_edge import Point, UpdateOperation

from engram_retrieval.lexical import LexicalEncoder
from engram_retrieval.store import (
    ForeignIdError,
    MemoryStore,
    PointFilter,
    StoredPoint,
    StoreError,
)
from engram_retrieval.store.base import DenseVectorCache, DimensionMismatchError, RecordVector
from engram_retrieval.store.edge import EdgeStore, _vectors
from engram_retrieval.store.qdrant import QdrantStore

DIM = 4
LEXICAL = LexicalEncoder()


def pid(n: int) -> str:
    return str(uuid.UUID(int=n))


def point(
    n: int,
    tenant: str = "a",
    *,
    vector: list[float] | None = None,
    created: str = "2025-01-01T00:00:00.000000Z",
    **payload: object,
) -> StoredPoint:
    body: dict[str, object] = {
        "tenant": tenant,
        "user_id": "u1",
        "conversation_id": "c1",
        "kind": "fact",
        "text": f"memory {n}",
        "role": "",
        "created_at": created,
        "source_id": f"s{n}",
        "tags": [],
        "superseded_by": None,
    }
    body.update(payload)
    return StoredPoint(
        sparse=LEXICAL.document(str(body["text"])),
        id=pid(n),
        payload=body,
        vector=np.array(vector or [1.0, n / 10, 0.0, 0.5], dtype=np.float32),
    )


@pytest.fixture(params=["edge", "qdrant"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    if request.param == "edge":
        opened: MemoryStore = await EdgeStore.open(tmp_path / "shard", DIM)
    else:
        opened = await QdrantStore.open("memories", DIM, location=":memory:")
    try:
        yield opened
    finally:
        await opened.close()


async def test_upsert_retrieve_is_tenant_scoped(store: MemoryStore) -> None:
    await store.upsert("a", [point(1), point(2)])
    await store.upsert("b", [point(3, tenant="b")])
    got = await store.retrieve("a", [pid(1), pid(2), pid(3), pid(99)], with_vectors=True)
    assert sorted(p.id for p in got) == [pid(1), pid(2)]
    assert got[0].payload["tenant"] == "a" and got[0].vector is not None
    assert np.linalg.norm(got[0].vector) == pytest.approx(1.0, abs=1e-5)
    assert await store.retrieve("b", [pid(1)]) == []
    without = await store.retrieve("a", [pid(1)])
    assert without[0].vector is None


async def test_upsert_refuses_another_tenants_id(store: MemoryStore) -> None:
    await store.upsert("a", [point(1)])
    with pytest.raises(ForeignIdError) as exc:
        await store.upsert("b", [point(2, tenant="b"), point(1, tenant="b", text="hijack")])
    assert exc.value.ids == [pid(1)]
    (kept,) = await store.retrieve("a", [pid(1)])
    assert kept.payload["text"] == "memory 1"
    assert await store.retrieve("b", [pid(2)]) == []  # nothing written


async def test_upsert_replaces(store: MemoryStore) -> None:
    await store.upsert("a", [point(1)])
    await store.upsert("a", [point(1, text="changed")])
    (got,) = await store.retrieve("a", [pid(1)])
    assert got.payload["text"] == "changed"
    assert await store.count(PointFilter(tenant="a")) == 1


async def test_search_filters_and_batches(store: MemoryStore) -> None:
    await store.upsert(
        "a",
        [
            point(1, vector=[1, 0, 0, 0]),
            point(2, vector=[0.9, 0.1, 0, 0], conversation_id="c2"),
            point(3, vector=[0.8, 0.2, 0, 0], kind="summary"),
            point(4, vector=[1, 0, 0, 0], superseded_by=pid(1)),
            point(5, vector=[0.7, 0.3, 0, 0], conversation_id="global", user_id=""),
        ],
    )
    await store.upsert("b", [point(6, tenant="b", vector=[1, 0, 0, 0])])
    query = np.array([1, 0, 0, 0], dtype=np.float32)
    conv = PointFilter(tenant="a", conversation_id="c1", kinds=("fact",))
    user = PointFilter(tenant="a", user_id="u1", exclude_conversation_ids=("c1", "global"))
    glob = PointFilter(tenant="a", conversation_id="global")
    every = PointFilter(tenant="a", include_superseded=True)
    pools = await store.search(query, [conv, user, glob, every], limit=10)
    assert [[p.id for p in pool] for pool in pools[:3]] == [[pid(1)], [pid(2)], [pid(5)]]
    assert {p.id for p in pools[3]} == {pid(n) for n in (1, 2, 3, 4, 5)}
    top = pools[0][0]
    assert top.score == pytest.approx(1.0, abs=1e-5)
    # a search result's vector may be converted only when read (RecordVector)
    assert top.vector is not None
    assert np.asarray(top.vector, dtype=np.float64) == pytest.approx([1.0, 0, 0, 0], abs=1e-6)
    user_pool_point = pools[1][0]
    assert np.asarray(user_pool_point.vector) == pytest.approx(
        np.array([0.9, 0.1, 0, 0]) / np.linalg.norm([0.9, 0.1, 0, 0]), abs=1e-6
    )
    assert top.payload["source_id"] == "s1"
    limited = await store.search(query, [every], limit=2)
    scores = [p.score for p in limited[0] if p.score is not None]
    assert len(scores) == len(limited[0])  # a search result is scored
    assert scores == sorted(scores, reverse=True)
    assert len(limited[0]) == 2


async def test_hybrid_search_adds_lexical_candidates(store: MemoryStore) -> None:
    await store.upsert(
        "a",
        [
            point(1, vector=[1, 0, 0, 0], text="apples and pears"),
            point(2, vector=[0.6, 0.8, 0, 0], text="a zebra crossing"),
            point(3, vector=[0.9, 0.1, 0, 0], text="bananas"),
            point(4, tenant="b", vector=[0, 1, 0, 0], text="zebra"),
            point(5, vector=[0.8, 0, 0.6, 0], text="zebra stripes", conversation_id="c2"),
            point(6, vector=[1, 0, 0, 0], text="apples", conversation_id="c2"),
            point(7, vector=[0.9, 0.1, 0, 0], text="pears", conversation_id="c2"),
        ],
    )
    query = np.array([1, 0, 0, 0], dtype=np.float32)
    flt = PointFilter(tenant="a", conversation_id="c1")
    (dense_only,) = await store.search(query, [flt], limit=2)
    assert [p.id for p in dense_only] == [pid(1), pid(3)]
    assert all(p.sparse_score is None for p in dense_only)
    other = PointFilter(tenant="a", conversation_id="c2")
    hybrid, elsewhere = await store.search(
        query, [flt, other], limit=2, sparse=LEXICAL.query("zebras?")
    )
    assert [p.id for p in hybrid] == [pid(1), pid(3), pid(2)]
    lexical_only = hybrid[2]
    assert lexical_only.score == pytest.approx(0.6, abs=1e-6)  # its cosine to the query
    assert lexical_only.sparse_score is not None and lexical_only.sparse_score > 0
    assert lexical_only.vector is not None and lexical_only.payload["tenant"] == "a"
    assert np.asarray(lexical_only.vector) == pytest.approx([0.6, 0.8, 0, 0], abs=1e-6)
    # each filter of the batch gets its own lexical-only points, with their cosines
    assert [p.id for p in elsewhere] == [pid(6), pid(7), pid(5)]
    assert elsewhere[2].score == pytest.approx(0.8, abs=1e-6)
    assert elsewhere[2].sparse_score is not None and elsewhere[0].sparse_score is None
    (both,) = await store.search(query, [flt], limit=3, sparse=LEXICAL.query("bananas"))
    assert [p.id for p in both] == [pid(1), pid(3), pid(2)]
    assert both[1].sparse_score is not None and both[0].sparse_score is None


async def test_lexical_only_search(store: MemoryStore) -> None:
    await store.upsert(
        "a",
        [
            point(1, vector=[1, 0, 0, 0], text="apples and pears"),
            point(2, vector=[0, 1, 0, 0], text="a zebra crossing"),
            point(3, vector=[0.6, 0.8, 0, 0], text="two zebras, one zebra"),
        ],
    )
    query = np.array([1, 0, 0, 0], dtype=np.float32)
    flt = PointFilter(tenant="a")
    (found,) = await store.search(query, [flt], limit=5, sparse=LEXICAL.query("zebra"), dense=False)
    assert {p.id for p in found} == {pid(2), pid(3)}  # no dense neighbour (pid 1)
    assert all(p.sparse_score is not None and p.sparse_score > 0 for p in found)
    cosines = {p.id: p.score for p in found}
    assert cosines[pid(3)] == pytest.approx(0.6, abs=1e-6)  # computed from the vector
    assert await store.search(query, [flt, flt], limit=5, dense=False) == [[], []]


async def test_payload_filters(store: MemoryStore) -> None:
    await store.upsert(
        "a",
        [
            point(1, tags=["x", "y"], role="user"),
            point(2, tags=["y"], role="assistant", kind="turn"),
            point(3, tags=[], role="user", kind="turn"),
        ],
    )
    assert await store.count(PointFilter(tenant="a", tags=("x",))) == 1
    assert await store.count(PointFilter(tenant="a", tags=("y", "x"))) == 2
    assert await store.count(PointFilter(tenant="a", role="user")) == 2
    assert await store.count(PointFilter(tenant="a", kinds=("turn",))) == 2
    assert await store.count(PointFilter(tenant="a", source_ids=("s1", "s3"))) == 2
    assert await store.count(PointFilter(tenant="b")) == 0


async def test_turn_place_and_context_filters(store: MemoryStore) -> None:
    await store.upsert(
        "a",
        [
            point(1, kind="turn", turn_index=4),
            point(2, kind="turn", turn_index=5, context_turn_id=pid(1)),
            point(3, kind="turn", turn_index=5, context_turn_id=None),
        ],
    )
    # another tenant's turn naming the same id is not read through tenant a
    await store.upsert("b", [point(4, "b", kind="turn", turn_index=5, context_turn_id=pid(1))])
    at_five = await store.list_page(PointFilter(tenant="a", turn_index=5), 10)
    assert {p.id for p in at_five.points} == {pid(2), pid(3)}
    assert await store.count(PointFilter(tenant="a", turn_index=0)) == 0
    following = await store.list_page(PointFilter(tenant="a", context_turn_ids=(pid(1),)), 10)
    assert [p.id for p in following.points] == [pid(2)]  # not tenant b's point 4
    assert await store.count(PointFilter(tenant="b", context_turn_ids=(pid(1),))) == 1


async def test_delete_only_own_points(store: MemoryStore) -> None:
    await store.upsert("a", [point(1), point(2)])
    await store.upsert("b", [point(3, tenant="b")])
    assert await store.delete("b", [pid(1), pid(3)]) == [pid(3)]
    assert sorted(await store.delete("a", [pid(1), pid(2), pid(7)])) == [pid(1), pid(2)]
    assert await store.count(PointFilter(tenant="a", include_superseded=True)) == 0


async def test_list_pages_newest_first_with_ties(store: MemoryStore) -> None:
    stamps = {
        1: "2025-01-03",
        2: "2025-01-02",
        3: "2025-01-02",
        4: "2025-01-02",
        5: "2025-01-01",
        6: "2025-01-05",
        7: "2025-01-02",
    }
    await store.upsert(
        "a", [point(n, created=f"{day}T10:00:00.000000Z") for n, day in stamps.items()]
    )
    await store.upsert("b", [point(8, tenant="b", created="2025-01-09T00:00:00.000000Z")])
    expected = [pid(6), pid(1), pid(2), pid(3), pid(4), pid(7), pid(5)]
    flt = PointFilter(tenant="a")
    for size in (1, 2, 3, 7, 50):
        seen: list[str] = []
        page = await store.list_page(flt, size)
        seen += [p.id for p in page.points]
        while page.next is not None:
            page = await store.list_page(flt, size, page.next)
            seen += [p.id for p in page.points]
        assert seen == expected, size
    last = await store.list_page(flt, 7)
    assert last.next is None


async def test_list_excludes_superseded_unless_asked(store: MemoryStore) -> None:
    await store.upsert("a", [point(1), point(2, superseded_by=pid(1))])
    assert [p.id for p in (await store.list_page(PointFilter(tenant="a"), 10)).points] == [pid(1)]
    everything = await store.list_page(PointFilter(tenant="a", include_superseded=True), 10)
    assert {p.id for p in everything.points} == {pid(1), pid(2)}


async def test_created_bounds_include_after_exclude_before(store: MemoryStore) -> None:
    days = {1: "2025-01-01", 2: "2025-01-02", 3: "2025-01-03", 4: "2025-01-04"}
    await store.upsert("a", [point(n, created=f"{d}T00:00:00.000000Z") for n, d in days.items()])
    await store.upsert("b", [point(5, tenant="b", created="2025-01-02T00:00:00.000000Z")])
    window = PointFilter(
        tenant="a",
        created_after="2025-01-02T00:00:00.000000Z",
        created_before="2025-01-04T00:00:00.000000Z",
    )
    page = await store.list_page(window, 10)
    assert [p.id for p in page.points] == [pid(3), pid(2)]
    assert await store.count(window) == 2
    since = PointFilter(tenant="a", created_after="2025-01-03T00:00:00.000000Z")
    assert await store.count(since) == 2
    until = PointFilter(tenant="a", created_before="2025-01-02T00:00:00.000000Z")
    assert [p.id for p in (await store.list_page(until, 10)).points] == [pid(1)]
    # paging through a window keeps to it
    first = await store.list_page(window, 1)
    assert first.next is not None
    rest = await store.list_page(window, 10, first.next)
    assert [p.id for p in rest.points] == [pid(2)] and rest.next is None


async def test_facet_counts_distinct_values_of_the_tenant(store: MemoryStore) -> None:
    await store.upsert(
        "a",
        [
            point(1, user_id="alice", conversation_id="home"),
            point(2, user_id="alice", conversation_id="home"),
            point(3, user_id="alice", conversation_id="work"),
            point(4, user_id="", conversation_id="global"),
            point(5, user_id="bob", conversation_id="home", superseded_by=pid(9)),
        ],
    )
    await store.upsert("b", [point(6, tenant="b", user_id="eve")])
    users = await store.facet(PointFilter(tenant="a"), "user_id", 10)
    assert users == [("alice", 3), ("", 1)]  # bob's only memory is superseded
    everyone = await store.facet(PointFilter(tenant="a", include_superseded=True), "user_id", 10)
    assert sorted(everyone) == [("", 1), ("alice", 3), ("bob", 1)]
    alices = await store.facet(PointFilter(tenant="a", user_id="alice"), "conversation_id", 10)
    assert alices == [("home", 2), ("work", 1)]
    assert await store.facet(PointFilter(tenant="a"), "user_id", 1) == [("alice", 3)]
    assert await store.facet(PointFilter(tenant="c"), "user_id", 10) == []


async def test_memories_of_other_embedding_models_are_counted_across_tenants(
    store: MemoryStore,
) -> None:
    await store.upsert(
        "a",
        [
            point(1, embedding_model="new"),
            point(2, embedding_model="old"),
            point(3, embedding_model="old", superseded_by=pid(2)),
            point(4),  # written before the field existed
        ],
    )
    await store.upsert("b", [point(5, tenant="b", embedding_model="old")])
    assert await store.count_embedded_by_others("new") == 4
    assert await store.count_embedded_by_others("old") == 2
    await store.upsert("a", [point(n, embedding_model="new") for n in (2, 3, 4)])
    await store.upsert("b", [point(5, tenant="b", embedding_model="new")])
    assert await store.count_embedded_by_others("new") == 0


async def test_edge_store_persists_across_reopen(tmp_path: Path) -> None:
    first = await EdgeStore.open(tmp_path / "shard", DIM)
    await first.upsert("a", [point(1)])
    await first.close()
    second = await EdgeStore.open(tmp_path / "shard", DIM)
    try:
        assert [p.id for p in await second.retrieve("a", [pid(1)])] == [pid(1)]
    finally:
        await second.close()


async def test_stores_reject_an_existing_collection_of_another_size(tmp_path: Path) -> None:
    edge = await EdgeStore.open(tmp_path / "shard", DIM)
    await edge.close()
    other_model = "holds 4-d vectors but the embedder produces 8-d ones"
    with pytest.raises(DimensionMismatchError, match=other_model):
        await EdgeStore.open(tmp_path / "shard", 8)

    path = str(tmp_path / "local")
    local = await QdrantStore.open("memories", DIM, path=path)
    await local.close()
    with pytest.raises(DimensionMismatchError, match=other_model):
        await QdrantStore.open("memories", 8, path=path)


def unit_rows(*rows: list[float]) -> np.ndarray:
    m = np.array(rows, dtype=np.float32)
    return (m / np.linalg.norm(m, axis=1, keepdims=True)).astype(np.float16)


async def test_late_scores_are_maxsim_over_token_vectors(store: MemoryStore) -> None:
    assert store.late_interaction
    one, two, bare = point(1), point(2), point(3)
    one.tokens = unit_rows([1, 0, 0, 0], [0, 0, 1, 0])
    two.tokens = unit_rows([0, 1, 0, 0], [1, 1, 0, 0])
    await store.upsert("a", [one, two, bare])
    other = point(4, tenant="b")
    other.tokens = unit_rows([1, 0, 0, 0])
    await store.upsert("b", [other])

    query = unit_rows([1, 0, 0, 0], [0, 1, 0, 0])
    scores = await store.late_scores("a", query, [pid(1), pid(2), pid(3), pid(4)])
    # sum over query tokens of the best cosine among the point's tokens
    assert scores[pid(1)] == pytest.approx(1.0 + 0.0, abs=1e-2)
    assert scores[pid(2)] == pytest.approx(np.sqrt(0.5) + 1.0, abs=1e-2)
    # no token vectors: no score; another tenant's id: never scored
    assert set(scores) == {pid(1), pid(2)}
    assert await store.late_scores("a", query, []) == {}
    # the same after a search has found some of them (the embedded store then names the
    # searched ones by their UUIDs), and for ids written in upper case
    await store.search(np.array([1, 0, 0, 0], dtype=np.float32), [PointFilter("a")], 1)
    ids = [pid(1), pid(2), pid(3), pid(4)]
    assert await store.late_scores("a", query, ids) == pytest.approx(scores)
    upper = await store.late_scores("a", query, [i.upper() for i in ids])
    assert upper == pytest.approx({i.upper(): s for i, s in scores.items()})

    # token vectors come back with the point, for reuse when only the payload changes
    (got,) = await store.retrieve("a", [pid(2)], with_vectors=True)
    assert got.tokens is not None and got.tokens.shape == (2, DIM)


async def test_a_store_made_before_token_vectors_opens_without_late_interaction(
    tmp_path: Path,
) -> None:
    from qdrant_edge import EdgeShard

    from engram_retrieval.store.edge_shard import edge_config

    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shard = EdgeShard.create(str(legacy), edge_config(DIM, tokens=None))
    shard.close()
    store = await EdgeStore.open(legacy, DIM)
    try:
        assert not store.late_interaction
        stale = point(1)
        stale.tokens = unit_rows([1, 0, 0, 0])
        await store.upsert("a", [stale])  # tokens are not written, the point is
        assert [p.id for p in await store.retrieve("a", [pid(1)])] == [pid(1)]
        assert await store.late_scores("a", unit_rows([1, 0, 0, 0]), [pid(1)]) == {}
    finally:
        await store.close()


async def test_token_vectors_are_stored_quantised_and_score_as_float16_would(
    tmp_path: Path,
) -> None:
    from qdrant_edge import VectorStorageDatatype

    from engram_retrieval.store.edge_shard import open_shard

    dim, rng = 384, np.random.default_rng(3)

    def unit(m: np.ndarray) -> np.ndarray:
        return (m / np.linalg.norm(m, axis=-1, keepdims=True)).astype(np.float32)

    # like a sentence model's token vectors: a shared direction plus each token's own
    shared = rng.normal(size=dim)
    tokens = {n: unit(shared + rng.normal(size=(12, dim))) for n in range(1, 41)}
    store = await EdgeStore.open(tmp_path / "shard", dim)
    try:
        points = []
        for n, rows in tokens.items():
            p = point(n, vector=list(unit(rng.normal(size=dim))))
            p.tokens = rows.astype(np.float16)
            points.append(p)
        await store.upsert("a", points)
        # a question that shares three of memory 7's tokens, roughly
        query = unit(
            np.vstack(
                [
                    tokens[7][:3] + 0.5 * unit(rng.normal(size=(3, dim))),
                    shared + rng.normal(size=(3, dim)),
                ]
            )
        )
        scores = await store.late_scores("a", query, [pid(n) for n in tokens])
    finally:
        await store.close()
    exact = {pid(n): float((query @ rows.T).max(axis=1).sum()) for n, rows in tokens.items()}
    assert set(scores) == set(exact)
    worst = max(abs(scores[i] - exact[i]) / exact[i] for i in exact)
    assert worst < 0.01, worst  # measured: 0.09 %
    assert max(scores, key=scores.__getitem__) == max(exact, key=exact.__getitem__) == pid(7)
    _, held = open_shard(tmp_path / "shard", dim)
    assert held == VectorStorageDatatype.Turbo8


async def test_a_store_with_float16_token_vectors_opens_as_it_is(tmp_path: Path) -> None:
    from qdrant_edge import EdgeShard, VectorStorageDatatype

    from engram_retrieval.store.edge_shard import edge_config

    earlier = tmp_path / "float16"
    earlier.mkdir()
    shard = EdgeShard.create(str(earlier), edge_config(DIM, tokens=VectorStorageDatatype.Float16))
    shard.close()
    store = await EdgeStore.open(earlier, DIM)
    try:
        assert store.late_interaction
        one = point(1)
        one.tokens = unit_rows([1, 0, 0, 0], [0, 0, 1, 0])
        await store.upsert("a", [one])
        scores = await store.late_scores("a", unit_rows([0, 0, 1, 0]), [pid(1)])
        assert scores[pid(1)] == pytest.approx(1.0, abs=1e-3)  # float16: exact
    finally:
        await store.close()


def test_a_record_vector_is_converted_once_when_first_read() -> None:
    class Record:
        reads = 0

        @property
        def vector(self) -> dict[str, list[float]]:
            Record.reads += 1
            return {"dense": [0.6, 0.8, 0.0, 0.0]}

    lazy = RecordVector(Record())
    assert Record.reads == 0  # a candidate MMR never compares costs nothing
    assert np.asarray(lazy).dtype == np.float32
    assert np.asarray(lazy, dtype=np.float64) == pytest.approx([0.6, 0.8, 0, 0])
    assert np.asarray(lazy).shape == (DIM,) and Record.reads == 1

    # MMR reads float64 first: the very values of the float32 vector, in one conversion
    float32_values = [0.1, 0.7, 1 / 3, -0.25]
    Record.reads = 0

    class Thirds(Record):
        @property
        def vector(self) -> dict[str, list[float]]:
            Record.reads += 1
            return {"dense": [float(np.float32(v)) for v in float32_values]}

    wide = RecordVector(Thirds())
    assert np.asarray(wide, dtype=np.float64).dtype == np.float64
    assert np.array_equal(
        np.asarray(wide, dtype=np.float64),
        np.asarray(float32_values, dtype=np.float32).astype(np.float64),
    )
    assert Record.reads == 1

    class Bare:
        vector = None

    with pytest.raises(StoreError, match="without its dense vector"):
        np.asarray(RecordVector(Bare()))


def test_a_vector_converted_by_one_search_is_taken_from_the_cache_by_the_next() -> None:
    class Record:
        reads = 0

        def __init__(self, values: list[float]) -> None:
            self.values = values

        @property
        def vector(self) -> dict[str, list[float]]:
            Record.reads += 1
            return {"dense": self.values}

    cache = DenseVectorCache(2)
    first = np.asarray(RecordVector(Record([0.6, 0.8, 0, 0]), cache, (1, "h1")), dtype=np.float64)
    again = np.asarray(RecordVector(Record([9.0, 9.0, 9, 9]), cache, (1, "h1")), dtype=np.float64)
    assert Record.reads == 1 and np.array_equal(first, again)
    # the same point with another index key (another embed_hash) is converted anew
    rewritten = RecordVector(Record([0.0, 1.0, 0, 0]), cache, (1, "h2"))
    assert np.asarray(rewritten) == pytest.approx([0, 1, 0, 0]) and Record.reads == 2
    # full: the least recently used goes first
    np.asarray(RecordVector(Record([1.0, 0.0, 0, 0]), cache, (2, "h1")))
    assert len(cache) == 2 and cache.get((1, "h1")) is None
    assert cache.get((1, "h2")) is not None
    # a cached vector is read-only: a caller cannot change what the next search reads
    with pytest.raises(ValueError):
        np.asarray(RecordVector(Record([0.0, 0.0, 0, 0]), cache, (1, "h2")))[0] = 5.0
    # no key (a point without embed_hash), or capacity 0: converted each time, kept nowhere
    Record.reads = 0
    np.asarray(RecordVector(Record([1.0, 0.0, 0, 0]), cache))
    off = DenseVectorCache(0)
    for _ in range(2):
        np.asarray(RecordVector(Record([1.0, 0.0, 0, 0]), off, (3, "h")))
    assert Record.reads == 3 and len(off) == 0
    with pytest.raises(ValueError, match="capacity"):
        DenseVectorCache(-1)


async def test_an_edge_search_reads_a_rewritten_points_new_vector(tmp_path: Path) -> None:
    store = await EdgeStore.open(tmp_path / "shard", DIM)
    try:
        first = point(1, vector=[1, 0, 0, 0], embed_hash="text-1")
        await store.upsert("a", [first, point(2, vector=[0.6, 0.8, 0, 0])])

        async def vectors() -> dict[str, np.ndarray]:
            (pool,) = await store.search(np.array([1.0, 0, 0, 0]), [PointFilter("a")], 5)
            return {p.id: np.asarray(p.vector, dtype=np.float64) for p in pool}

        assert (await vectors())[pid(1)] == pytest.approx([1, 0, 0, 0])
        assert len(store.vectors) == 1  # point 2 has no embed_hash: never cached
        # its text changed: a new embed_hash and a new vector, read in the next search
        changed = point(1, vector=[0.8, 0.6, 0, 0], embed_hash="text-2")
        await store.upsert("a", [changed])
        read = await vectors()
        assert read[pid(1)] == pytest.approx([0.8, 0.6, 0, 0], abs=1e-6)
        assert read[pid(2)] == pytest.approx([0.6, 0.8, 0, 0], abs=1e-6)
    finally:
        await store.close()


async def test_an_edge_search_drops_a_point_deleted_between_its_two_reads(
    tmp_path: Path,
) -> None:
    # The edge search reads ids and scores first, then each distinct point's payload;
    # a write on the edge thread may land in between.
    store = await EdgeStore.open(tmp_path / "shard", DIM)
    try:
        await store.upsert("a", [point(1, vector=[1, 0, 0, 0]), point(2, vector=[0.9, 0.1, 0, 0])])
        shard: Any = store._shard

        class DeletesBeforeRetrieve:
            def query_batch(self, batch: Any) -> Any:
                return shard.query_batch(batch)

            def retrieve(self, ids: list[Any], *args: Any) -> Any:
                return shard.retrieve([i for i in ids if str(i) != pid(1)], *args)

        store._shard = cast(Any, DeletesBeforeRetrieve())
        query = np.array([1, 0, 0, 0], dtype=np.float32)
        (found,) = await store.search(query, [PointFilter(tenant="a")], limit=5)
        store._shard = shard
        assert [p.id for p in found] == [pid(2)]
        assert found[0].payload["text"] == "memory 2"
    finally:
        await store.close()


async def test_an_edge_search_never_returns_a_point_another_tenant_took_between_its_reads(
    tmp_path: Path,
) -> None:
    # Deleted by tenant a and written under the same (client-chosen) id by tenant b
    # between the batch and the retrieve: b's payload must not reach a's search.
    store = await EdgeStore.open(tmp_path / "shard", DIM)
    try:
        await store.upsert("a", [point(1, vector=[1, 0, 0, 0]), point(2, vector=[0.9, 0.1, 0, 0])])
        shard: Any = store._shard
        taken = point(1, tenant="b", vector=[1, 0, 0, 0], text="tenant b's secret")

        class TakenBeforeRetrieve:
            def query_batch(self, batch: Any) -> Any:
                return shard.query_batch(batch)

            def retrieve(self, ids: list[Any], *args: Any) -> Any:
                edge_point = Point(taken.id, _vectors(taken, True), taken.payload)
                shard.update(UpdateOperation.upsert_points([edge_point]))
                return shard.retrieve(ids, *args)

        store._shard = cast(Any, TakenBeforeRetrieve())
        query = np.array([1, 0, 0, 0], dtype=np.float32)
        (found,) = await store.search(query, [PointFilter(tenant="a")], limit=5)
        store._shard = shard
        assert [p.id for p in found] == [pid(2)]
    finally:
        await store.close()


class CountingShard:
    """The edge shard, counting the points each search reads back by id."""

    def __init__(self, shard: Any) -> None:
        self.shard = shard
        self.retrieved: list[set[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shard, name)

    def retrieve(self, ids: list[Any], *args: Any) -> Any:
        self.retrieved.append({str(i) for i in ids})
        return self.shard.retrieve(ids, *args)


async def test_an_edge_search_reads_a_point_back_once_until_it_is_written(
    tmp_path: Path,
) -> None:
    store = await EdgeStore.open(tmp_path / "shard", DIM)
    try:
        await store.upsert("a", [point(1, vector=[1, 0, 0, 0]), point(2, vector=[0.9, 0.1, 0, 0])])
        counting = CountingShard(store._shard)
        store._shard = cast(Any, counting)
        query = np.array([1, 0, 0, 0], dtype=np.float32)

        async def texts() -> dict[str, str]:
            (found,) = await store.search(query, [PointFilter(tenant="a")], limit=5)
            return {p.id: p.payload["text"] for p in found}

        assert await texts() == {pid(1): "memory 1", pid(2): "memory 2"}
        assert await texts() == {pid(1): "memory 1", pid(2): "memory 2"}
        assert counting.retrieved == [{pid(1), pid(2)}]  # the second search read none back
        # a rewrite is read by the next search (and only the rewritten point is read)
        await store.upsert("a", [point(1, vector=[1, 0, 0, 0], text="memory 1, corrected")])
        assert await texts() == {pid(1): "memory 1, corrected", pid(2): "memory 2"}
        assert counting.retrieved[-1] == {pid(1)}
        # superseded: the engine's filter drops it, whatever was read before
        await store.upsert("a", [point(2, vector=[0.9, 0.1, 0, 0], superseded_by=pid(1))])
        assert await texts() == {pid(1): "memory 1, corrected"}
        await store.delete("a", [pid(1)])
        assert await texts() == {}
        await store.upsert("a", [point(1, vector=[1, 0, 0, 0], text="memory 1, again")])
        assert await texts() == {pid(1): "memory 1, again"}
    finally:
        await store.close()


async def test_a_store_keeps_handing_out_a_searched_point_only_until_it_is_written(
    store: MemoryStore,
) -> None:
    """What ``kept_search_points`` promises (the ranking keeps what a payload says, and
    the reply its message, while its object is the same: store.PerSearchedPoint): a
    store that keeps searched points hands the same payload object out again, and a new
    one once the point is written; one that keeps none makes a new object every read."""
    await store.upsert("a", [point(1, vector=[1, 0, 0, 0])])
    query = np.array([1, 0, 0, 0], dtype=np.float32)

    async def payload() -> dict[str, Any]:
        (found,) = await store.search(query, [PointFilter(tenant="a")], limit=5)
        return found[0].payload

    first = await payload()
    assert (await payload() is first) == (store.kept_search_points > 0)
    await store.upsert("a", [point(1, vector=[1, 0, 0, 0], text="memory 1, corrected")])
    rewritten = await payload()
    assert rewritten is not first
    assert rewritten["text"] == "memory 1, corrected"


async def test_an_edge_store_without_a_point_cache_reads_every_search_back(
    tmp_path: Path,
) -> None:
    store = await EdgeStore.open(tmp_path / "shard", DIM, point_cache=0)
    try:
        await store.upsert("a", [point(1, vector=[1, 0, 0, 0])])
        counting = CountingShard(store._shard)
        store._shard = cast(Any, counting)
        for _ in range(2):
            (found,) = await store.search(np.array([1.0, 0, 0, 0]), [PointFilter("a")], 5)
            assert [p.id for p in found] == [pid(1)]
        assert counting.retrieved == [{pid(1)}, {pid(1)}]
        assert len(store.search_points) == 0
        assert store.kept_search_points == 0
    finally:
        await store.close()


_SEARCH_THREADS_PROBE = """
import asyncio, sys
from pathlib import Path
import numpy as np
from engram_retrieval.store import PointFilter
from engram_retrieval.store.edge import EdgeStore
sys.path.insert(0, sys.argv[3])
from test_store_contract import DIM, point

async def main() -> None:
    store = await EdgeStore.open(Path(sys.argv[1]), DIM, search_threads=int(sys.argv[2]))
    await store.upsert("a", [point(n) for n in range(1, 40)])
    for _ in range(200):
        found = await store.search(np.ones(DIM, np.float32), [PointFilter(tenant="a")], 5)
        assert len(found[0]) == 5
    # how long the engine's search threads ran, in ns (schedstat: precise, unlike ticks)
    print(sum(
        int((task / "schedstat").read_text().split()[0])
        for task in Path("/proc/self/task").iterdir()
        if (task / "comm").read_text().startswith("edge-search")
    ))
    await store.close()

asyncio.run(main())
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads threads from /proc")
@pytest.mark.parametrize(("search_threads", "pool"), [(1, False), (0, True)])
def test_the_engine_searches_on_the_callers_thread_unless_told_otherwise(
    tmp_path: Path, search_threads: int, pool: bool
) -> None:
    # in a process of its own: the engine's pool, once started, lives as long as its process
    import subprocess
    import sys

    tests = str(Path(__file__).parent)
    probe = [sys.executable, "-c", _SEARCH_THREADS_PROBE, str(tmp_path / "shard")]
    done = subprocess.run(
        [*probe, str(search_threads), tests], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # one: the pool's threads idle (≈ 0.1 ms of start-up); the engine's own choice: each
    # query's segments searched on them (≈ 25 ms for the 200 searches)
    assert (int(done.stdout.split()[-1]) > 2_000_000) is pool
