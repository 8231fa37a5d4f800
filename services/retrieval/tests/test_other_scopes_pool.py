"""Beside the conversation, the user's other conversations are searched for what the
conversation's pool leaves (``ENGRAM_SEARCH_OTHER_SCOPES_POOL=remainder``): a search
ranks about one pool per source however many conversations the user has, and a clear
match from another conversation is still recalled."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from engram_core.codec import pb, to_timestamp
from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.ranking import other_scopes_limit
from engram_testing.worker_stack import running_retrieval

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
CAT = "My cat Miso sleeps on the radiator all winter."
TOPICS = (
    "the quarterly budget review",
    "a flaky integration test",
    "the office move in March",
    "renewing the TLS certificates",
    "the new hire's onboarding plan",
    "a slow database migration",
)


def turn(text: str, index: int, conversation: str) -> pb.Memory:
    return pb.Memory(
        kind=pb.MEMORY_KIND_TURN,
        role="user",
        text=text,
        user_id="u1",
        conversation_id=conversation,
        turn_index=index,
        created_at=to_timestamp(NOW - timedelta(minutes=500 - index)),
    )


def work_turns(conversation: str, count: int) -> list[pb.Memory]:
    return [
        turn(f"Note {i}: we talked about {TOPICS[i % len(TOPICS)]} again today.", i, conversation)
        for i in range(count)
    ]


async def search(client: RetrievalClient, conversation: str) -> pb.SearchResponse:
    return await client.search(
        pb.SearchRequest(
            tenant="acme",
            query="What is my cat called?",
            user_id="u1",
            conversation_id=conversation,
            top_k=5,  # pools of 25 per source
            score_threshold=0.0,
            hits_only=True,
        )
    )


async def fill(client: RetrievalClient) -> None:
    memories = [*work_turns("work", 40), *work_turns("home", 30), turn(CAT, 30, "home")]
    await client.upsert(pb.UpsertRequest(tenant="acme", memories=memories))


def test_the_other_scopes_get_what_the_conversation_leaves_but_never_fewer_than_top_k() -> None:
    assert other_scopes_limit(own_pool=10, pool_size=100, top_k=27, small_store_size=5) == 90
    assert other_scopes_limit(own_pool=0, pool_size=100, top_k=27, small_store_size=5) == 100
    assert other_scopes_limit(own_pool=150, pool_size=100, top_k=27, small_store_size=5) == 27
    assert other_scopes_limit(own_pool=100, pool_size=100, top_k=1, small_store_size=5) == 6


async def test_a_long_conversation_ranks_fewer_candidates_and_still_recalls_another_ones_match(
    tmp_path: Path,
) -> None:
    async with running_retrieval(tmp_path / "data", search_other_scopes_pool="full") as full:
        await fill(full.client)
        before = await search(full.client, "work")
        from_new = await search(full.client, "a-new-chat")
    async with running_retrieval(tmp_path / "data") as remainder:
        after = await search(remainder.client, "work")
        new_after = await search(remainder.client, "a-new-chat")

    # "work" fills its own pool of 25: "home" is searched for top_k (5) per source only.
    assert after.candidates_considered < before.candidates_considered
    for response in (before, after):
        assert response.hits[0].memory.text == CAT
        assert response.hits[0].scope == pb.SCOPE_USER
    # A new conversation has nothing of its own: the others get the whole pool.
    assert new_after.candidates_considered == from_new.candidates_considered
    assert [h.memory.id for h in new_after.hits] == [h.memory.id for h in from_new.hits]
