"""The evict worker through the real nats-server and the real retrieval service."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engram_core.bus import publish_event
from engram_core.codec import pb, record_from_pb, to_timestamp
from engram_core.events import Event, MemoryChanged
from engram_testing.waiting import eventually
from engram_testing.worker_stack import (
    RealRetrieval,
    WorkerStack,
    changed,
    consumer_settled,
    dead_letter_count,
    published,
)
from engram_workers.evict import EVICT, EvictSettings, eviction_order

pytestmark = pytest.mark.integration

TENANT = "acme"
CONVERSATION = "c1"
START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


async def start_evict(
    monkeypatch: pytest.MonkeyPatch, workers: WorkerStack, max_entries: int, **overrides: Any
) -> list[Event]:
    """Starts an evict worker; the events it publishes are appended to the list returned."""
    values = {**workers.common(), "max_entries": max_entries, "lock_wait_s": 10.0, **overrides}
    running = await workers.start(EVICT, EvictSettings(**values))
    published_events: list[Event] = []
    publish = running.worker.publish

    async def recording_publish(event: Event) -> Any:
        published_events.append(event)
        return await publish(event)

    monkeypatch.setattr(running.worker, "publish", recording_publish)
    return published_events


def memory(name: str, kind: pb.MemoryKind, second: int, **fields: Any) -> pb.Memory:
    return pb.Memory(
        id=str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
        tenant=TENANT,
        user_id="u1",
        conversation_id=CONVERSATION,
        kind=kind,
        text=fields.pop("text", f"memory {name}"),
        created_at=to_timestamp(START + timedelta(seconds=second)),
        **fields,
    )


async def store(retrieval: RealRetrieval, *memories: pb.Memory) -> dict[str, pb.Memory]:
    await retrieval.client.upsert(pb.UpsertRequest(tenant=TENANT, memories=list(memories)))
    got = await retrieval.client.get(pb.GetRequest(tenant=TENANT, ids=[m.id for m in memories]))
    return {m.id: m for m in got.memories}


async def remaining(retrieval: RealRetrieval) -> set[str]:
    reply = await retrieval.client.list(
        pb.ListRequest(
            tenant=TENANT,
            filter=pb.MemoryFilter(conversation_id=CONVERSATION, include_superseded=True),
            page_size=500,
        )
    )
    return {m.id for m in reply.memories}


async def evicted_events(workers: WorkerStack) -> list[MemoryChanged]:
    return [e for e in await published(workers.nats_url, MemoryChanged) if e.op == "evicted"]


async def test_eviction_order_turns_then_superseded_facts_then_episodes_then_facts(
    workers, retrieval, publisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ages interleave across classes, so the order below is the rule, not the clock.
    fact1 = memory("fact-1", pb.MEMORY_KIND_FACT, 1)
    fact2 = memory("fact-2", pb.MEMORY_KIND_FACT, 2)
    fact3 = memory("fact-3", pb.MEMORY_KIND_FACT, 12)
    old1 = memory("superseded-1", pb.MEMORY_KIND_FACT, 3, superseded_by=fact1.id)
    old2 = memory("superseded-2", pb.MEMORY_KIND_FACT, 4, superseded_by=fact2.id)
    episode1 = memory(
        "episode-1", pb.MEMORY_KIND_EPISODE, 5, turn_range=pb.TurnRange(first_turn=1, last_turn=20)
    )
    episode2 = memory(
        "episode-2",
        pb.MEMORY_KIND_EPISODE,
        11,
        turn_range=pb.TurnRange(first_turn=21, last_turn=40),
    )
    turns = [
        memory(f"turn-{i}", pb.MEMORY_KIND_TURN, s, role="user") for i, s in enumerate((6, 7, 10))
    ]
    summary = memory("summary", pb.MEMORY_KIND_SUMMARY, 0)
    profile = memory(
        "profile",
        pb.MEMORY_KIND_PROFILE,
        0,
        profile=pb.ProfileEntry(category="identity", key="name", value="Ana", confidence=0.9),
    )
    stored = await store(
        retrieval, fact1, fact2, fact3, old1, old2, episode1, episode2, *turns, summary, profile
    )
    # 10 counted (3 turns, 2 superseded + 3 current facts, 2 episodes); keep 3
    await start_evict(monkeypatch, workers, max_entries=3)
    await publish_event(publisher, changed(TENANT, stored[turns[-1].id]))

    expected = [*turns, old1, old2, episode1, fact1]
    await eventually(
        lambda: _equals(
            remaining(retrieval), {episode2.id, fact2.id, fact3.id, summary.id, profile.id}
        ),
        what="eviction down to 3 entries",
    )
    await eventually(lambda: consumer_settled(workers.nats_url, "evict"), what="the ack")
    events = await evicted_events(workers)
    assert [e.memory.id for e in events] == [m.id for m in expected]
    for event in events:
        assert event.cause == "evict"
        assert (event.tenant, event.conversation_id) == (TENANT, CONVERSATION)
        assert event.memory == record_from_pb(stored[event.memory.id])  # the state before removal
    assert events[3].memory.superseded_by == fact1.id

    # at the limit, another change evicts nothing
    await publish_event(publisher, changed(TENANT, stored[fact3.id], event_id="again"))
    await eventually(lambda: consumer_settled(workers.nats_url, "evict"), what="the second ack")
    assert len(await evicted_events(workers)) == len(expected)
    assert await dead_letter_count(workers.nats_url, "evict") == 0


async def test_a_turn_burst_keeps_the_newest_turns_and_facts_outlive_turns(
    workers, retrieval, publisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    await start_evict(monkeypatch, workers, max_entries=10)
    facts = [memory(f"fact-{i}", pb.MEMORY_KIND_FACT, 2 * i) for i in range(4)]
    for i in range(20):
        new = [memory(f"turn-{i}", pb.MEMORY_KIND_TURN, 2 * i + 1, role="user")]
        if i < 4:
            new.append(facts[i])
        stored = await store(retrieval, *new)
        for item in new:
            await publish_event(publisher, changed(TENANT, stored[item.id]))

    newest_turns = {memory(f"turn-{i}", pb.MEMORY_KIND_TURN, 0).id for i in range(14, 20)}
    await eventually(
        lambda: _equals(remaining(retrieval), newest_turns | {f.id for f in facts}),
        what="the four facts and the six newest turns",
    )
    await eventually(lambda: consumer_settled(workers.nats_url, "evict"), what="the acks")
    evicted = [e.memory.id for e in await evicted_events(workers)]
    assert sorted(evicted) == sorted(
        memory(f"turn-{i}", pb.MEMORY_KIND_TURN, 0).id for i in range(14)
    )


async def test_two_replicas_evict_each_memory_exactly_once(
    workers, retrieval, publisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    deleted_calls: list[list[str]] = []
    store_delete = retrieval.server.store.delete

    async def recording_delete(tenant: str, ids: Any) -> list[str]:
        deleted_calls.append(list(ids))
        return await store_delete(tenant, ids)

    retrieval.server.store.delete = recording_delete
    published_by_replica = [
        await start_evict(monkeypatch, workers, max_entries=10, worker_concurrency=4)
        for _ in range(2)
    ]
    turns = [memory(f"turn-{i}", pb.MEMORY_KIND_TURN, i, role="user") for i in range(40)]
    for start in range(0, 40, 8):  # bursts: eviction runs while turns keep arriving
        stored = await store(retrieval, *turns[start : start + 8])
        for turn in turns[start : start + 8]:
            await publish_event(publisher, changed(TENANT, stored[turn.id]))

    await eventually(
        lambda: _equals(remaining(retrieval), {t.id for t in turns[30:]}),
        what="the ten newest turns",
    )
    await eventually(lambda: consumer_settled(workers.nats_url, "evict"), what="the acks")
    requested = [memory_id for call in deleted_calls for memory_id in call]
    assert sorted(requested) == sorted(t.id for t in turns[:30])  # each deleted once
    announced = []
    for events in published_by_replica:
        for event in events:
            assert isinstance(event, MemoryChanged), event
            announced.append(event.memory.id)
    assert sorted(announced) == sorted(t.id for t in turns[:30])  # each announced once
    assert len(await evicted_events(workers)) == 30
    assert await dead_letter_count(workers.nats_url, "evict") == 0


async def test_a_new_summary_or_profile_entry_evicts_nothing_a_new_turn_does(
    workers, retrieval, publisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Summaries and profile entries are exempt from the limit: their changes are not
    # even counted. The next turn finds the conversation over its limit.
    counts: list[Any] = []
    store_facet = retrieval.server.store.facet  # Count over several kinds is one facet

    async def recording_facet(flt: Any, key: str, limit: int) -> Any:
        counts.append(flt)
        return await store_facet(flt, key, limit)

    retrieval.server.store.facet = recording_facet
    turns = [memory(f"turn-{i}", pb.MEMORY_KIND_TURN, i, role="user") for i in range(4)]
    summary = memory("summary", pb.MEMORY_KIND_SUMMARY, 5)
    profile = memory(
        "profile",
        pb.MEMORY_KIND_PROFILE,
        6,
        profile=pb.ProfileEntry(category="identity", key="name", value="Ana", confidence=0.9),
    )
    stored = await store(retrieval, *turns, summary, profile)
    await start_evict(monkeypatch, workers, max_entries=2)
    await publish_event(publisher, changed(TENANT, stored[summary.id]))
    await publish_event(publisher, changed(TENANT, stored[profile.id]))
    await eventually(lambda: consumer_settled(workers.nats_url, "evict"), what="the acks")
    assert counts == [] and await evicted_events(workers) == []
    assert len(await remaining(retrieval)) == 6

    await publish_event(publisher, changed(TENANT, stored[turns[-1].id]))
    await eventually(
        lambda: _equals(remaining(retrieval), {turns[2].id, turns[3].id, summary.id, profile.id}),
        what="the two oldest turns evicted",
    )


def test_the_newest_episode_is_never_chosen() -> None:
    episodes = [record_from_pb(memory(f"episode-{i}", pb.MEMORY_KIND_EPISODE, i)) for i in range(3)]
    order = eviction_order({"episode": episodes})
    assert [m.id for m in order] == [episodes[0].id, episodes[1].id]
    assert eviction_order({"episode": episodes[:1]}) == []


async def _equals(awaitable: Any, expected: Any) -> bool:
    return (await awaitable) == expected
