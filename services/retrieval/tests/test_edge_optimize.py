"""Background optimisation of the embedded shard: HNSW built in a child process over
a copy, writes made meanwhile replayed, then a switch — with the store searchable and
writable throughout, and the same answers before and after."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import numpy as np
import pytest

from engram_retrieval.lexical import LexicalEncoder
from engram_retrieval.store import PointFilter, StoredPoint, StoreError
from engram_retrieval.store.edge import EdgeStore
from engram_retrieval.store.edge_optimize import ShardGenerations
from engram_testing.waiting import eventually

DIM = 16
THRESHOLD = 300  # points per indexed segment: small, so tests build real HNSW graphs
LEXICAL = LexicalEncoder()
WORDS = ["garden", "piano", "lisbon", "marathon", "sushi", "kitten", "invoice", "tent"]


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def pid(n: int) -> str:
    return str(uuid.UUID(int=n + 1))


def make_points(start: int, count: int, tenant: str = "a") -> list[StoredPoint]:
    rng = np.random.default_rng(start)
    points = []
    for n in range(start, start + count):
        vector = rng.standard_normal(DIM).astype(np.float32)
        text = f"{WORDS[n % len(WORDS)]} note {n}"
        points.append(
            StoredPoint(
                id=pid(n),
                payload={
                    "tenant": tenant,
                    "user_id": "u",
                    "conversation_id": f"c{n % 3}",
                    "kind": "fact",
                    "text": text,
                    "role": "",
                    "created_at": f"2025-01-01T00:00:00.{n:06d}Z",
                    "source_id": f"s{n}",
                    "tags": [],
                    "superseded_by": None,
                },
                vector=vector / np.linalg.norm(vector),
                sparse=LEXICAL.document(text),
            )
        )
    return points


QUERIES = [np.random.default_rng(s).standard_normal(DIM).astype(np.float32) for s in range(99, 107)]
FILTERS = [PointFilter(tenant="a"), PointFilter(tenant="a", conversation_id="c1")]


async def answers(store: EdgeStore) -> list[list[object]]:
    """Dense neighbours by id and order; BM25 matches by score (the toy texts tie a
    lot, and ties may come back in any order)."""
    out: list[list[object]] = []
    sparse = LEXICAL.query("garden piano")
    for query in QUERIES:
        dense = await store.search(query, FILTERS, 10)
        lexical = await store.search(query, FILTERS, 10, sparse=sparse, dense=False)
        out.extend([p.id for p in pool] for pool in dense)
        out.extend([round(p.sparse_score or 0.0, 4) for p in pool] for pool in lexical)
    return out


async def test_optimisation_keeps_answers_and_serves_meanwhile(tmp_path: Path) -> None:
    # the reference never optimises and gets the same writes in the same order
    reference = await EdgeStore.open(tmp_path / "reference", DIM)
    store = await EdgeStore.open(tmp_path / "shard", DIM, index_threshold=THRESHOLD)
    try:
        for target in (store, reference):
            await target.upsert("a", make_points(0, 900))
            await target.upsert("b", make_points(5000, 50, tenant="b"))
        assert await answers(store) == await answers(reference)

        task = asyncio.create_task(store.optimize())
        searches = 0
        written = 900
        while not task.done():  # reads and writes go on while the child works
            pools = await store.search(QUERIES[0], FILTERS, 10)
            assert len(pools[0]) == 10
            searches += 1
            if written < 1000:
                for target in (store, reference):
                    await target.upsert("a", make_points(written, 20))
                written += 20
            await asyncio.sleep(0.01)
        assert await task is True
        assert searches > 3 and written == 1000
        assert store.optimizations == 1
        assert store._shard.info().segments_count > 1  # an indexed segment beside the new one

        # the writes made meanwhile were replayed onto the optimised copy
        assert await store.count(PointFilter(tenant="a")) == 1000
        assert await store.count(PointFilter(tenant="b")) == 50
        expected = await answers(reference)
        assert await answers(store) == expected
    finally:
        await store.close()
        await reference.close()

    generations = ShardGenerations(tmp_path / "shard")
    assert generations.switched and generations.active.name == "shard.gen-1"
    assert not (tmp_path / "shard").exists()  # the original was removed after the switch
    reopened = await EdgeStore.open(tmp_path / "shard", DIM, index_threshold=THRESHOLD)
    try:
        assert await reopened.count(PointFilter(tenant="a")) == 1000
        assert await answers(reopened) == expected
    finally:
        await reopened.close()


async def test_written_points_start_an_optimisation(tmp_path: Path) -> None:
    store = await EdgeStore.open(tmp_path / "shard", DIM, optimize_after=THRESHOLD)
    try:
        await store.upsert("a", make_points(0, THRESHOLD - 1))
        assert not store.optimizing
        await store.upsert("a", make_points(THRESHOLD, 1))
        assert store.optimizing
        await eventually(lambda: not store.optimizing, what="optimisation finished")
        assert store.optimizations == 1
        assert await store.count(PointFilter(tenant="a")) == THRESHOLD
        await store.upsert("a", make_points(1000, 10))  # counting starts again
        assert not store.optimizing
    finally:
        await store.close()


async def test_close_stops_a_running_optimisation(tmp_path: Path) -> None:
    store = await EdgeStore.open(tmp_path / "shard", DIM, index_threshold=THRESHOLD)
    await store.upsert("a", make_points(0, 600))
    task = asyncio.create_task(store.optimize())
    await asyncio.sleep(0.2)
    await store.close()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert names(tmp_path) == ["shard"]  # the copy was removed
    reopened = await EdgeStore.open(tmp_path / "shard", DIM)
    try:
        assert await reopened.count(PointFilter(tenant="a")) == 600
    finally:
        await reopened.close()


async def test_a_read_after_close_is_a_clear_error(tmp_path: Path) -> None:
    # reads run inline on the event loop: one on a closed shard must not reach the engine
    store = await EdgeStore.open(tmp_path / "shard", DIM)
    await store.upsert("a", make_points(0, 10))
    await store.close()
    with pytest.raises(StoreError, match="store is closed"):
        await store.search(QUERIES[0], FILTERS, 10)
    with pytest.raises(StoreError, match="store is closed"):
        await store.count(PointFilter(tenant="a"))


def test_leftovers_of_interrupted_runs_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "shard"
    (root / "segments").mkdir(parents=True)
    (tmp_path / "shard.gen-1").mkdir()  # an optimisation that never switched
    generations = ShardGenerations(root)
    assert generations.open_active() == root and not (tmp_path / "shard.gen-1").exists()

    (tmp_path / "shard.gen-2" / "segments").mkdir(parents=True)
    generations.switch_to(tmp_path / "shard.gen-2")  # committed, old not yet removed
    (tmp_path / "shard.gen-3").mkdir()
    reopened = ShardGenerations(root)
    assert reopened.open_active() == tmp_path / "shard.gen-2"
    assert names(tmp_path) == ["shard.current", "shard.gen-2"]
    assert reopened.next_path() == tmp_path / "shard.gen-3"


async def test_a_large_store_never_optimised_is_optimised_after_opening(tmp_path: Path) -> None:
    plain = await EdgeStore.open(tmp_path / "shard", DIM)  # optimisation off
    await plain.upsert("a", make_points(0, THRESHOLD))
    await plain.close()
    store = await EdgeStore.open(tmp_path / "shard", DIM, optimize_after=THRESHOLD)
    try:
        assert store.optimizing
        assert await store.optimize() is True
        assert await store.count(PointFilter(tenant="a")) == THRESHOLD
    finally:
        await store.close()
    again = await EdgeStore.open(tmp_path / "shard", DIM, optimize_after=THRESHOLD)
    try:  # switched stores count only new writes
        assert not again.optimizing
    finally:
        await again.close()
