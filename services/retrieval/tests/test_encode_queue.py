"""The encode queue: concurrent requests share model runs, searches go first (on the
event loop itself when the embedder allows it), recent texts come from the cache, and
every caller gets exactly the vectors of its texts."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from engram_retrieval.embedder import Embedder, Encoded
from engram_retrieval.encode_queue import EncodeQueue


class GatedEmbedder:
    """The real embedder, held at a gate so a test decides when a model run may finish
    (every run, or only the runs with a text in ``held``), recording what each run
    embedded."""

    def __init__(self, embedder: Embedder, *, runs_inline: bool = False) -> None:
        self.embedder = embedder
        self.model_id = embedder.model_id
        self.dim = embedder.dim
        self.runs_inline = runs_inline
        self.runs: list[list[str]] = []
        self.threads: list[int] = []  # the thread each run ran on
        self.gate = threading.Event()
        self.gate.set()
        self.held: set[str] | None = None  # None: every run waits at the gate

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        self.runs.append(list(texts))
        self.threads.append(threading.get_ident())
        if self.held is None or self.held & set(texts):
            self.gate.wait(timeout=30)
        return self.embedder.encode(texts)

    # the rest of SentenceEncoder, ungated (the queue runs encode only)
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embedder.embed(texts)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embedder.embed_one(text)

    def encode_one(self, text: str) -> Encoded:
        return self.embedder.encode_one(text)

    def token_vectors(self, text: str) -> np.ndarray:
        return self.embedder.token_vectors(text)

    def close(self) -> None:
        self.embedder.close()


async def test_concurrent_requests_share_one_run_and_get_their_own_vectors(
    embedder: Embedder,
) -> None:
    gated = GatedEmbedder(embedder)
    queue = EncodeQueue(gated)
    gated.gate.clear()
    first = asyncio.create_task(queue.encode(["the first text"]))
    await asyncio.sleep(0.05)  # the first run is under way, held at the gate
    waiting = [asyncio.create_task(queue.encode([f"text number {i}"])) for i in range(5)]
    await asyncio.sleep(0.05)
    gated.gate.set()
    results = await asyncio.gather(first, *waiting)

    assert gated.runs == [["the first text"], [f"text number {i}" for i in range(5)]]
    for i, (encoded,) in enumerate(results[1:]):
        expected = embedder.encode_one(f"text number {i}")
        assert np.allclose(encoded.dense, expected.dense, atol=1e-5)
        assert encoded.tokens.shape == expected.tokens.shape


async def test_a_search_does_not_wait_for_a_running_write(embedder: Embedder) -> None:
    gated = GatedEmbedder(embedder)
    gated.held = {"a turn to store"}
    queue = EncodeQueue(gated)
    gated.gate.clear()
    write = asyncio.create_task(queue.encode(["a turn to store"]))
    await asyncio.sleep(0.05)  # the write's run is under way, held at the gate
    (found,) = await asyncio.wait_for(queue.encode(["what do I own?"], urgent=True), 10)
    assert not write.done()
    gated.gate.set()
    await write
    assert gated.runs == [["a turn to store"], ["what do I own?"]]
    assert found.dense.shape == (embedder.dim,)


async def test_recent_texts_are_not_embedded_again(embedder: Embedder) -> None:
    gated = GatedEmbedder(embedder)
    queue = EncodeQueue(gated, cache_texts=2)
    (one,) = await queue.encode(["User owns a bike."])
    (again,) = await queue.encode(["User owns a bike."])
    assert again is one
    await queue.encode(["second", "third"])  # pushes the first out of a 2-text cache
    await queue.encode(["User owns a bike.", "second"])

    assert gated.runs == [["User owns a bike."], ["second", "third"], ["User owns a bike."]]
    assert queue.stats.cached == 2


async def test_without_a_cache_every_text_is_embedded_each_time(embedder: Embedder) -> None:
    """ENGRAM_EMBED_CACHE_TEXTS=0 (what engram bench scale runs with, so a repeated
    question still costs its embedding)."""
    gated = GatedEmbedder(embedder)
    queue = EncodeQueue(gated, cache_texts=0)
    await queue.encode(["User owns a bike."])
    await queue.encode(["User owns a bike."])
    assert gated.runs == [["User owns a bike."], ["User owns a bike."]]
    assert queue.stats.cached == 0


async def test_a_failed_run_fails_its_callers_and_the_next_run_works(
    embedder: Embedder,
) -> None:
    class Failing(GatedEmbedder):
        def encode(self, texts: Sequence[str]) -> list[Encoded]:
            if "poison" in texts:
                raise RuntimeError("model failed")
            return super().encode(texts)

    queue = EncodeQueue(Failing(embedder))
    with pytest.raises(RuntimeError, match="model failed"):
        await queue.encode(["poison"])
    (fine,) = await queue.encode(["fine"])
    assert fine.dense.shape == (embedder.dim,)


async def test_a_search_is_embedded_on_the_loop_when_the_embedder_runs_inline(
    embedder: Embedder,
) -> None:
    """No hop to a thread for the text someone waits for; index writes still run off
    the loop (they batch, and nobody waits for them)."""
    inline = GatedEmbedder(embedder, runs_inline=True)
    queue = EncodeQueue(inline)
    (found,) = await queue.encode(["what pets do I have?"], urgent=True)
    await queue.encode(["User has a cat named Miso."])

    loop_thread = threading.get_ident()
    assert inline.threads[0] == loop_thread
    assert inline.threads[1] != loop_thread
    assert np.allclose(found.dense, embedder.encode_one("what pets do I have?").dense, atol=1e-5)
    (again,) = await queue.encode(["what pets do I have?"], urgent=True)
    assert again is found  # cached like any other run
    assert queue.stats.runs == 2


@pytest.mark.parametrize("allowed", [False, True], ids=["embedder-does-io", "setting-off"])
async def test_a_search_runs_in_a_thread_unless_both_embedder_and_setting_allow_it(
    embedder: Embedder, allowed: bool
) -> None:
    """A remote embedder (runs_inline False) never blocks the loop on the network;
    ENGRAM_EMBED_INLINE_SEARCHES=false keeps every run in a thread."""
    gated = GatedEmbedder(embedder, runs_inline=allowed)
    queue = EncodeQueue(gated, inline_searches=not allowed)
    await queue.encode(["what pets do I have?"], urgent=True)
    assert gated.threads == [gated.threads[0]]
    assert gated.threads[0] != threading.get_ident()


def test_only_the_quantized_embedder_runs_inline(embedder: Embedder) -> None:
    """One text a run (dynamic-int8, the default) is what makes the loop the cheaper
    place; the packaged graph batches concurrent searches in one run instead."""
    assert embedder.batch_size == 1 and embedder.runs_inline
    packaged = Embedder.default(threads=1, quantization="none")
    assert packaged.batch_size > 1 and not packaged.runs_inline
