"""The summarize worker's episodes, through the real nats-server, the real retrieval
service (in-process) and a scripted model keyed on the prompt."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engram_core.bus import publish_event
from engram_core.codec import from_timestamp, pb, to_timestamp
from engram_core.events import MemoryChanged
from engram_testing.upstream import ScriptedUpstream, UpstreamError
from engram_testing.waiting import eventually
from engram_testing.worker_stack import (
    HORIZON_AFTER_TWO_DELIVERIES,
    RealRetrieval,
    ScriptedModel,
    WorkerStack,
    changed,
    consumer_settled,
    dead_letter_count,
    published,
)
from engram_workers.prompts import EpisodeTurn
from engram_workers.summarize import SUMMARIZE, SummarizeSettings
from engram_workers.summarize.app import EpisodeBoundaries
from engram_workers.summarize.core import episode_memory_id, rule_based_episode

pytestmark = pytest.mark.integration

TENANT = "acme"
CONVERSATION = "c1"
START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
CELLO = "My sister Anna lives in Porto and plays the cello in an orchestra."


def turn_text(n: int) -> str:
    """Turn n (1-based): user turns are odd, assistant turns even."""
    if n == 3:
        return CELLO
    if n == 5:
        return "What should I get Anna for her birthday?"
    if n == 6:
        return "A set of good cello strings would make a thoughtful gift. Or concert tickets."
    return f"I went to museum number {n}." if n % 2 else f"Noted, museum {n - 1}."


def episode_from_turns(payload: dict[str, Any]) -> str:
    """A model that names the range and retells the cello line (so search can find it)."""
    texts = " ".join(t["text"] for t in payload["turns"])
    gist = "The user's sister Anna plays the cello in Porto. " if "cello" in texts else ""
    first, last = payload["first_turn"], payload["last_turn"]
    return json.dumps({"summary": f"{gist}Museum visits, turns {first} to {last}."})


@pytest.fixture
def model(scripted_upstream: ScriptedUpstream) -> ScriptedModel:
    scripted = ScriptedModel(episode=episode_from_turns)
    scripted_upstream.replies = [scripted]
    return scripted


async def start_summarize(
    workers: WorkerStack, upstream: ScriptedUpstream, **overrides: Any
) -> None:
    values = {
        **workers.common(),
        "llm_base_url": upstream.base_url,
        "llm_model": "scripted",
        "llm_timeout_s": 5.0,
        "lock_wait_s": 10.0,
        **overrides,
    }
    await workers.start(SUMMARIZE, SummarizeSettings(**values))


async def add_turns(
    retrieval: RealRetrieval, publisher: Any, numbers: range, *, announce: bool = True
) -> list[pb.Memory]:
    """Store turns (as ingest does) and publish their memory.changed, in order."""
    turns = [
        pb.Memory(
            id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"turn-{n}")),
            tenant=TENANT,
            user_id="u1",
            conversation_id=CONVERSATION,
            kind=pb.MEMORY_KIND_TURN,
            role="user" if n % 2 else "assistant",
            text=turn_text(n),
            created_at=to_timestamp(START + timedelta(seconds=n)),
        )
        for n in numbers
    ]
    await retrieval.client.upsert(pb.UpsertRequest(tenant=TENANT, memories=turns))
    if announce:
        for turn in turns:
            await publish_event(publisher, changed(TENANT, turn))
    return turns


async def episodes(retrieval: RealRetrieval) -> list[pb.Memory]:
    reply = await retrieval.client.list(
        pb.ListRequest(
            tenant=TENANT,
            filter=pb.MemoryFilter(
                conversation_id=CONVERSATION,
                kinds=[pb.MEMORY_KIND_EPISODE],
                include_superseded=True,
            ),
        )
    )
    return sorted(reply.memories, key=lambda e: e.turn_range.first_turn)


async def turn_count(retrieval: RealRetrieval) -> int:
    reply = await retrieval.client.count(
        pb.CountRequest(
            tenant=TENANT,
            filter=pb.MemoryFilter(conversation_id=CONVERSATION, kinds=[pb.MEMORY_KIND_TURN]),
        )
    )
    return reply.count


async def test_twenty_five_turns_make_one_episode_of_turns_1_to_20(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    await start_summarize(workers, scripted_upstream)
    turns = await add_turns(retrieval, publisher, range(1, 26))
    [episode] = await eventually(lambda: episodes(retrieval), what="the episode")
    await eventually(
        lambda: consumer_settled(workers.nats_url, "summarize"), what="every turn handled"
    )

    assert len(await episodes(retrieval)) == 1  # 25 events, one episode
    assert (episode.turn_range.first_turn, episode.turn_range.last_turn) == (1, 20)
    window = turns[:20]
    assert list(episode.source_turn_ids) == [t.id for t in window]
    assert episode.id == episode_memory_id(TENANT, CONVERSATION, [t.id for t in window])
    assert episode.kind == pb.MEMORY_KIND_EPISODE
    assert episode.text.startswith("The user's sister Anna plays the cello in Porto.")
    assert episode.metadata["summarizer"] == "llm"
    assert from_timestamp(episode.created_at) == START + timedelta(seconds=20)

    [given] = model.inputs("episode")
    assert (given["first_turn"], given["last_turn"]) == (1, 20)
    assert [(t["n"], t["role"], t["text"]) for t in given["turns"]] == [
        (n, "user" if n % 2 else "assistant", turn_text(n)) for n in range(1, 21)
    ]

    # embedded on Upsert, so search finds it by its content
    found = await retrieval.client.search(
        pb.SearchRequest(
            tenant=TENANT,
            query="Which instrument does Anna play?",
            user_id="u1",
            conversation_id=CONVERSATION,
            kinds=[pb.MEMORY_KIND_EPISODE, pb.MEMORY_KIND_FACT],
        )
    )
    assert found.outcome == pb.SEARCH_OUTCOME_SMALL_STORE or found.hits
    assert episode.id in [hit.memory.id for hit in found.hits]
    ranked = await retrieval.client.search(
        pb.SearchRequest(
            tenant=TENANT,
            query="Which instrument does Anna play?",
            user_id="u1",
            conversation_id=CONVERSATION,
        )
    )
    assert ranked.outcome == pb.SEARCH_OUTCOME_RANKED
    assert episode.id in [hit.memory.id for hit in ranked.hits]

    announced = [
        e for e in await published(workers.nats_url, MemoryChanged) if e.memory.kind == "episode"
    ]
    assert [(e.op, e.cause, e.memory.id, e.memory.turn_range) for e in announced] == [
        ("created", "summarize:episode", episode.id, (1, 20))
    ]


async def test_numbering_counts_covered_turns_so_it_survives_their_eviction(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    await start_summarize(workers, scripted_upstream)
    first_turns = await add_turns(retrieval, publisher, range(1, 22))
    await eventually(lambda: episodes(retrieval), what="the first episode")
    # evict turns 1-20 (what the evict worker does first: the oldest raw turns)
    await retrieval.client.delete(
        pb.DeleteRequest(tenant=TENANT, ids=[t.id for t in first_turns[:20]])
    )
    later = await add_turns(retrieval, publisher, range(22, 42))

    async def two() -> list[pb.Memory]:
        found = await episodes(retrieval)
        return found if len(found) == 2 else []

    _, second = await eventually(two, what="the second episode")
    assert (second.turn_range.first_turn, second.turn_range.last_turn) == (21, 40)
    assert list(second.source_turn_ids) == [first_turns[20].id] + [t.id for t in later[:19]]
    assert [t["n"] for t in model.inputs("episode")[1]["turns"]] == list(range(21, 41))
    await eventually(
        lambda: consumer_settled(workers.nats_url, "summarize"), what="every turn handled"
    )
    assert len(await episodes(retrieval)) == 2


async def test_model_junk_gives_a_rule_based_episode_marked_as_such(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    model.answers["episode"] = lambda payload: "Here is a lovely summary of the turns!"
    await start_summarize(workers, scripted_upstream)
    await add_turns(retrieval, publisher, range(1, 26))
    [episode] = await eventually(lambda: episodes(retrieval), what="the episode")
    await eventually(
        lambda: consumer_settled(workers.nats_url, "summarize"), what="every turn handled"
    )

    assert (episode.turn_range.first_turn, episode.turn_range.last_turn) == (1, 20)
    assert len(episode.source_turn_ids) == 20
    assert episode.metadata["summarizer"] == "rule-based"
    assert "invalid output" in episode.metadata["fallback_reason"]
    assert episode.text.startswith("Turns 1-20 (rule-based summary")
    assert CELLO in episode.text  # the most salient sentence
    assert (
        "Q: What should I get Anna for her birthday? A: A set of good cello strings would "
        "make a thoughtful gift. Or concert tickets." in episode.text
    )
    assert len(model.inputs("episode")) == 2  # the request and one re-ask
    assert await turn_count(retrieval) == 25  # nothing lost
    assert len(await episodes(retrieval)) == 1


async def test_an_unavailable_model_is_retried_then_the_episode_falls_back(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    model.answers["episode"] = lambda payload: UpstreamError(500)
    await start_summarize(workers, scripted_upstream, **HORIZON_AFTER_TWO_DELIVERIES)
    turns = await add_turns(retrieval, publisher, range(1, 22), announce=False)
    await publish_event(publisher, changed(TENANT, turns[-1]))  # one trigger: countable calls

    [episode] = await eventually(lambda: episodes(retrieval), what="the episode")
    await eventually(lambda: consumer_settled(workers.nats_url, "summarize"), what="the ack")
    assert len(model.inputs("episode")) == 2  # one per delivery, the last falls back
    assert episode.metadata["summarizer"] == "rule-based"
    assert "unavailable until the retry horizon" in episode.metadata["fallback_reason"]
    assert episode.text.startswith("Turns 1-20 (rule-based summary")
    assert await dead_letter_count(workers.nats_url, "summarize") == 0
    assert await turn_count(retrieval) == 21


async def test_a_window_waits_for_a_later_turn(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    await start_summarize(workers, scripted_upstream, episode_turns=4)
    await add_turns(retrieval, publisher, range(1, 5))
    await eventually(
        lambda: consumer_settled(workers.nats_url, "summarize"), what="four turns handled"
    )
    assert await episodes(retrieval) == []  # turn 4's answer may still be on its way
    await add_turns(retrieval, publisher, range(5, 10))
    await eventually(
        lambda: consumer_settled(workers.nats_url, "summarize"), what="five more handled"
    )
    assert [
        (e.turn_range.first_turn, e.turn_range.last_turn) for e in await episodes(retrieval)
    ] == [
        (1, 4),
        (5, 8),
    ]


def _ranges(found: list[pb.Memory]) -> list[tuple[int, int]]:
    return [(e.turn_range.first_turn, e.turn_range.last_turn) for e in found]


async def test_two_replicas_build_each_window_once_in_order(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    # Each replica remembers a conversation's episode boundary between turns; the other
    # replica's episodes make what it remembers stale, never wrong.
    for _ in range(2):
        await start_summarize(workers, scripted_upstream, episode_turns=4, worker_concurrency=4)
    for start in range(1, 30, 7):  # bursts: windows close while turns keep arriving
        await add_turns(retrieval, publisher, range(start, start + 7))
    await eventually(
        lambda: consumer_settled(workers.nats_url, "summarize"), what="every turn handled"
    )
    assert _ranges(await episodes(retrieval)) == [(n, n + 3) for n in range(1, 33, 4)]
    announced = [
        e.memory.id
        for e in await published(workers.nats_url, MemoryChanged)
        if e.memory.kind == "episode"
    ]
    assert sorted(announced) == sorted(e.id for e in await episodes(retrieval))
    assert len(model.inputs("episode")) == 8  # no window asked of the model twice


async def test_a_deleted_episode_is_built_again_by_the_next_turn(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    # What a person deletes in the memory browser: the turns are uncovered again, and
    # the boundary this worker remembered must not hide that. (One at a time: turn 6
    # is handled after the episode exists, so the boundary remembered is the episode's.)
    await start_summarize(workers, scripted_upstream, episode_turns=4, worker_concurrency=1)
    await add_turns(retrieval, publisher, range(1, 7))
    [episode] = await eventually(lambda: episodes(retrieval), what="turns 1-4")
    await eventually(lambda: consumer_settled(workers.nats_url, "summarize"), what="the acks")
    await retrieval.client.delete(pb.DeleteRequest(tenant=TENANT, ids=[episode.id]))
    await publish_event(publisher, changed(TENANT, episode, op="deleted", cause="api"))
    await eventually(lambda: consumer_settled(workers.nats_url, "summarize"), what="the delete")
    assert await episodes(retrieval) == []

    await add_turns(retrieval, publisher, range(7, 8))
    rebuilt = await eventually(lambda: episodes(retrieval), what="turns 1-4 again")
    assert _ranges(rebuilt) == [(1, 4)] and rebuilt[0].id == episode.id


def test_rule_based_episode_is_bounded_and_keeps_conversation_order() -> None:
    turns = [
        EpisodeTurn(n=n, role="user" if n % 2 else "assistant", text=turn_text(n))
        for n in range(1, 21)
    ]
    text = rule_based_episode(turns, 300)
    assert len(text) <= 300
    assert text.startswith("Turns 1-20 (rule-based summary")
    assert CELLO in text
    # greetings and acknowledgements never make it in
    hello = [EpisodeTurn(n=1, role="user", text="Hi there!"), *turns[1:]]
    assert "Hi there" not in rule_based_episode(hello, 2000)
    body = rule_based_episode(turns, 2000)
    assert body.index(CELLO) < body.index("Q: What should I get Anna")


def test_a_remembered_boundary_expires_and_the_oldest_conversation_goes_first() -> None:
    now = [0.0]
    boundaries = EpisodeBoundaries(size=2, ttl_s=60.0, clock=lambda: now[0])
    a, b, c = (("acme", "u1", name) for name in "abc")
    boundaries.put(a, START)
    boundaries.put(b, None)  # no episode yet is remembered too
    assert boundaries.get(a) == (True, START) and boundaries.get(b) == (True, None)
    boundaries.put(c, START)  # over the size: a, the least recently used, goes
    assert boundaries.get(a) == (False, None) and boundaries.get(c) == (True, START)
    now[0] = 61.0
    assert boundaries.get(c) == (False, None)  # read afresh after ttl_s
    boundaries.put(c, START)
    boundaries.drop(c)
    assert boundaries.get(c) == (False, None)
