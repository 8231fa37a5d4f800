"""A turn's BM25 document also holds the words of the turn it follows (writes.py): an
answer is found by the words of the question it answers, and a deleted or rewritten
question takes its words out of the answer's document."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import numpy as np
import pytest

from engram_core.codec import pb, to_timestamp
from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.lexical import LexicalEncoder
from engram_retrieval.server import RunningServer
from engram_retrieval.store import PointFilter, StoreError
from engram_testing.worker_stack import RealRetrieval, running_retrieval

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
QUESTION = "Anything else you enjoy doing on weekends, Nate?"
ANSWER = "Playing video games and watching movies are my main hobbies."
LEXICAL = LexicalEncoder()


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "data") as running:
        yield running


@pytest.fixture
def server(retrieval: RealRetrieval) -> RunningServer:
    return retrieval.server


@pytest.fixture
def client(retrieval: RealRetrieval) -> RetrievalClient:
    return retrieval.client


def turn(
    text: str,
    index: int,
    minutes: float,
    *,
    role: str = "user",
    conversation: str = "c1",
    memory_id: str = "",
    user: str = "u1",
) -> pb.Memory:
    return pb.Memory(
        id=memory_id,
        kind=pb.MEMORY_KIND_TURN,
        role=role,
        text=text,
        user_id=user,
        conversation_id=conversation,
        turn_index=index,
        created_at=to_timestamp(NOW - timedelta(minutes=60 - minutes)),
    )


async def upsert(client: RetrievalClient, *memories: pb.Memory) -> list[str]:
    reply = await client.upsert(pb.UpsertRequest(tenant="acme", memories=list(memories)))
    return [r.id for r in reply.results]


async def found_by_words(server: RunningServer, words: str, user: str = "u1") -> set[str]:
    """The texts BM25 alone finds for ``words`` in the user's memories."""
    (pool,) = await server.store.search(
        np.zeros(server.store.dim), [PointFilter("acme", user_id=user)], 20,
        sparse=LEXICAL.query(words), dense=False,
    )  # fmt: skip
    return {str(p.payload["text"]) for p in pool}


async def test_an_answer_is_found_by_the_words_of_the_question_it_answers(
    server: RunningServer, client: RetrievalClient
) -> None:
    # written one by one, as a chat's turns are: the question is read from the store
    await upsert(client, turn(QUESTION, 3, 1))
    await upsert(client, turn(ANSWER, 4, 2, role="assistant"))
    # the turn after the answer (same words as nothing asked) and another conversation's
    # turn at the answer's place are not indexed with the question
    await upsert(client, turn("Sounds fun.", 5, 3), turn("Fine, thanks.", 4, 2, conversation="c2"))

    assert await found_by_words(server, "enjoy doing on weekends") == {QUESTION, ANSWER}
    # the answer is still found by its own words, and its text is its own
    assert ANSWER in await found_by_words(server, "video games")


async def test_a_turn_never_holds_another_users_words(
    server: RunningServer, client: RetrievalClient
) -> None:
    # Two users who both name their conversation "c1": each conversation is its user's.
    await upsert(client, turn(QUESTION, 3, 1, user="alice"))
    await upsert(client, turn(ANSWER, 4, 2, user="bob"))
    await upsert(
        client,
        turn("My locker code is 4711.", 5, 3, user="alice"),
        turn("Noted, see you.", 6, 4, user="bob"),
    )
    assert await found_by_words(server, "enjoy doing on weekends", user="bob") == set()
    assert await found_by_words(server, "locker code", user="bob") == set()
    assert await found_by_words(server, "enjoy doing on weekends", user="alice") == {QUESTION}


async def test_within_one_upsert_the_newest_turn_said_before_it_is_the_one_followed(
    server: RunningServer, client: RetrievalClient
) -> None:
    # A client that sends no history numbers every question 0 and every reply 1.
    await upsert(
        client,
        turn("What should I cook tonight?", 0, 1),
        turn("Try a mushroom risotto.", 1, 2, role="assistant"),
        turn("Which museum opens on Mondays?", 0, 3),
        turn("The science museum does.", 1, 4, role="assistant"),
    )
    assert await found_by_words(server, "cook tonight") == {
        "What should I cook tonight?",
        "Try a mushroom risotto.",
    }
    assert await found_by_words(server, "museum opens Mondays") == {
        "Which museum opens on Mondays?",
        "The science museum does.",
    }


async def test_a_deleted_question_leaves_no_words_in_its_answers_document(
    server: RunningServer, client: RetrievalClient
) -> None:
    question, _ = await upsert(client, turn(QUESTION, 3, 1), turn(ANSWER, 4, 2, role="assistant"))
    assert ANSWER in await found_by_words(server, "enjoy doing on weekends")

    deleted = await client.delete(pb.DeleteRequest(tenant="acme", ids=[question]))
    assert list(deleted.deleted_ids) == [question]
    assert await found_by_words(server, "enjoy doing on weekends") == set()
    assert ANSWER in await found_by_words(server, "video games")  # its own words stay


async def test_a_delete_that_fails_after_the_follower_was_reindexed_is_retried_whole(
    server: RunningServer, client: RetrievalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    question, _ = await upsert(client, turn(QUESTION, 3, 1), turn(ANSWER, 4, 2, role="assistant"))
    delete = server.store.delete

    async def fails_once(tenant: str, ids: Sequence[str]) -> list[str]:
        monkeypatch.setattr(server.store, "delete", delete)
        raise StoreError("the disk is full")

    monkeypatch.setattr(server.store, "delete", fails_once)
    with pytest.raises(grpc.aio.AioRpcError):
        await client.delete(pb.DeleteRequest(tenant="acme", ids=[question]))
    # the follower lost the question's words before the question was to go
    assert await found_by_words(server, "enjoy doing on weekends") == {QUESTION}

    retried = await client.delete(pb.DeleteRequest(tenant="acme", ids=[question]))
    assert list(retried.deleted_ids) == [question]
    assert await found_by_words(server, "enjoy doing on weekends") == set()


async def test_a_rewritten_question_lends_its_new_words_to_its_answer(
    server: RunningServer, client: RetrievalClient
) -> None:
    question, _ = await upsert(client, turn(QUESTION, 3, 1), turn(ANSWER, 4, 2, role="assistant"))
    await upsert(client, turn("What do you do after work?", 3, 1, memory_id=question))

    assert await found_by_words(server, "enjoy doing on weekends") == set()
    assert ANSWER in await found_by_words(server, "after work")


async def test_with_weight_zero_a_turn_is_indexed_under_its_own_words_only(
    tmp_path: Path,
) -> None:
    async with running_retrieval(tmp_path / "data", index_previous_turn_weight=0.0) as running:
        await upsert(running.client, turn(QUESTION, 3, 1), turn(ANSWER, 4, 2, role="assistant"))
        assert await found_by_words(running.server, "enjoy doing on weekends") == {QUESTION}


def test_context_words_are_added_term_by_term_with_their_weight() -> None:
    from engram_retrieval.lexical import SparseVec, with_context

    own = SparseVec((1, 2), (1.0, 0.5))
    before = SparseVec((2, 3), (1.0, 2.0))
    merged = with_context(own, before, 2.0)
    assert dict(zip(merged.indices, merged.values, strict=True)) == {1: 1.0, 2: 2.5, 3: 4.0}
    assert with_context(own, before, 0.0) is own
    assert with_context(own, SparseVec((), ()), 2.0) is own
