"""Calls someone waits for go first (engram_retrieval.priority): while the gateway's
Search is in flight, a worker's call waits before it starts (at most the configured
wait); with no interactive call in flight nothing waits."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engram_core.codec import pb
from engram_core.memory import SearchQuery
from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.embedder import Encoded
from engram_retrieval.pipeline import Ranked
from engram_retrieval.priority import InteractiveFirst
from engram_testing.worker_stack import running_retrieval

from .test_service import fact

SEARCH = pb.SearchRequest(tenant="acme", query="what pets do I have?", user_id="u1")
COUNT = pb.CountRequest(tenant="acme")


async def test_a_background_call_waits_for_the_interactive_ones_then_goes() -> None:
    gate = InteractiveFirst(max_wait_s=5.0)
    await asyncio.wait_for(gate.background(), 0.1)  # nothing in flight: no wait
    async with gate.interactive():
        waiting = asyncio.create_task(gate.background())
        await asyncio.sleep(0.05)
        assert not waiting.done()
    await asyncio.wait_for(waiting, 0.1)  # released when the last interactive call ends
    assert gate.waited == 1


async def test_a_background_call_waits_no_longer_than_the_bound() -> None:
    gate = InteractiveFirst(max_wait_s=0.05)
    async with gate.interactive():
        waiting = asyncio.create_task(gate.background())
        await asyncio.sleep(0.01)
        assert not waiting.done()  # it does wait...
        await asyncio.wait_for(waiting, 1.0)  # ...but the write path is never stopped
        assert gate.in_flight == 1
    # a wait of 0 serves calls in arrival order: nothing waits
    arrival_order = InteractiveFirst(max_wait_s=0)
    async with arrival_order.interactive():
        await asyncio.wait_for(arrival_order.background(), 0.01)
    assert arrival_order.waited == 0


async def test_the_gateways_search_holds_back_a_workers_call_until_it_is_answered(
    tmp_path: Path,
) -> None:
    async with running_retrieval(tmp_path / "data", retrieval_background_wait_ms=5000) as ret:
        release = asyncio.Event()
        searching = asyncio.Event()
        pipeline = ret.server.servicer.pipeline
        real_run = pipeline.run

        async def slow_run(query: SearchQuery, **how: Any) -> Ranked:
            searching.set()
            await release.wait()
            return await real_run(query, **how)

        pipeline.run = slow_run  # type: ignore[method-assign]
        gateway = RetrievalClient(ret.server.address, timeout_s=30, interactive=True)
        try:
            # a worker's Search (not interactive) does not hold anything back
            worker_search = asyncio.create_task(ret.client.search(SEARCH))
            await searching.wait()
            await asyncio.wait_for(ret.client.count(COUNT), 2.0)
            release.set()
            await worker_search

            release.clear()
            searching.clear()
            chat: asyncio.Task[Any] = asyncio.create_task(gateway.search(SEARCH))
            await searching.wait()
            count = asyncio.create_task(ret.client.count(COUNT))
            await asyncio.sleep(0.3)
            assert not count.done()  # waits for the chat's Search...
            release.set()
            await chat
            assert (await asyncio.wait_for(count, 2.0)).count == 0  # ...then is answered
            assert ret.server.servicer.priority.waited == 1
        finally:
            release.set()
            await gateway.close()


async def test_a_workers_search_embeds_off_the_loop_and_finds_what_the_chats_finds(
    tmp_path: Path,
) -> None:
    """A worker's Search embeds its query in the writes' thread, so the loop can start a
    chat's Search meanwhile; a chat's embeds on the loop. Both rank the same way."""
    async with running_retrieval(tmp_path / "data") as ret:
        await store_facts(ret.client)
        encoder = ret.server.servicer.pipeline.encoder
        embedder = encoder.embedder
        assert encoder.inline_searches  # the packaged, quantized embedder
        threads: list[threading.Thread] = []
        real_encode = embedder.encode

        def recording(texts: Sequence[str]) -> list[Encoded]:
            threads.append(threading.current_thread())
            return real_encode(texts)

        embedder.encode = recording  # type: ignore[method-assign]
        gateway = RetrievalClient(ret.server.address, timeout_s=30, interactive=True)
        try:
            chat = await gateway.search(pets_query("which pets do I have?"))
            worker = await ret.client.search(pets_query())
        finally:
            await gateway.close()
        loop_thread = threading.current_thread()
        chats_thread, workers_thread = threads
        assert chats_thread is loop_thread and workers_thread is not loop_thread
        assert worker.outcome == chat.outcome == pb.SEARCH_OUTCOME_RANKED
        assert [h.memory.text for h in worker.hits] == [h.memory.text for h in chat.hits]
        assert worker.hits[0].memory.text == "User's cat is called Miso."


async def store_facts(client: RetrievalClient) -> None:
    """Enough facts of one user that a search ranks them (not a small store)."""
    facts = [
        "User's cat is called Miso.",
        "User works as a nurse.",
        *(f"User visited town number {i} in spring." for i in range(24)),
    ]
    memories = [fact(text, days_ago=len(facts) - i) for i, text in enumerate(facts)]
    await client.upsert(pb.UpsertRequest(tenant="acme", memories=memories))


def pets_query(text: str = "what pets do I have?") -> pb.SearchRequest:
    return pb.SearchRequest(tenant="acme", query=text, user_id="u1", top_k=3)


async def test_between_steps_a_background_call_waits_for_the_interactive_ones() -> None:
    gate = InteractiveFirst(max_wait_s=5.0)
    await asyncio.wait_for(gate.between_steps(), 0.1)  # nothing in flight: it goes on
    async with gate.interactive():
        paused = asyncio.create_task(gate.between_steps())
        await asyncio.sleep(0.05)
        assert not paused.done()
    await asyncio.wait_for(paused, 0.1)


async def test_a_workers_search_pauses_between_its_stages_and_a_chats_does_not(
    tmp_path: Path,
) -> None:
    async with running_retrieval(tmp_path / "data", retrieval_background_wait_ms=5000) as ret:
        await store_facts(ret.client)
        priority = ret.server.servicer.priority
        real_pause = priority.between_steps
        pauses: list[str] = []

        async def recording() -> None:
            pauses.append("pause")
            await real_pause()

        priority.between_steps = recording  # type: ignore[method-assign]
        gateway = RetrievalClient(ret.server.address, timeout_s=30, interactive=True)
        try:
            await gateway.search(pets_query())
            assert pauses == []  # a chat's Search runs its stages back to back
            await ret.client.search(pets_query("which pets do I have?"))
            assert pauses == ["pause"] * 3  # before candidates, rerank and MMR
        finally:
            await gateway.close()
