"""Which memories eviction chooses, in-process on the retrieval port in memory (no
nats-server: the choice needs none). ``test_evict.py`` runs the worker on the real stack."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from engram_core.memory import MemoryFilter, MemoryKindName, MemoryRecord, ProposedProfileFact
from engram_testing.memory_store import InMemoryPort
from engram_workers.evict import COUNTED_KINDS, choose_victims

TENANT = "acme"
START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
SCOPE = MemoryFilter(
    user_id="u1", conversation_id="c1", kinds=COUNTED_KINDS, include_superseded=True
)


def memory(name: str, kind: MemoryKindName, second: int, **fields: Any) -> MemoryRecord:
    return MemoryRecord(
        id=str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
        user_id="u1",
        conversation_id="c1",
        kind=kind,
        text=f"memory {name}",
        created_at=START + timedelta(seconds=second),
        **fields,
    )


async def victims(memories: InMemoryPort, excess: int) -> list[MemoryRecord]:
    counted = await memories.count(TENANT, SCOPE)
    return await choose_victims(memories, TENANT, SCOPE, excess, counted.by_kind)


async def test_turns_go_first_then_superseded_facts_then_episodes_then_facts() -> None:
    # Ages interleave across classes, so the order below is the rule, not the clock.
    fact1, fact2 = memory("fact-1", "fact", 1), memory("fact-2", "fact", 2)
    fact3 = memory("fact-3", "fact", 12)
    old1 = memory("superseded-1", "fact", 3, superseded_by=fact1.id)
    old2 = memory("superseded-2", "fact", 4, superseded_by=fact2.id)
    episode1 = memory("episode-1", "episode", 5, turn_range=(1, 20))
    episode2 = memory("episode-2", "episode", 11, turn_range=(21, 40))
    turns = [memory(f"turn-{i}", "turn", s, role="user") for i, s in enumerate((6, 7, 10))]
    summary = memory("summary", "summary", 0)
    entry = ProposedProfileFact(category="identity", key="name", value="Ana", confidence=0.9)
    profile = memory("profile", "profile", 0, profile=entry)
    memories = InMemoryPort()
    await memories.upsert(
        TENANT, [fact1, fact2, fact3, old1, old2, episode1, episode2, *turns, summary, profile]
    )

    # 10 counted (3 turns, 2 superseded + 3 current facts, 2 episodes); keep 3
    chosen = await victims(memories, 7)
    assert [m.id for m in chosen] == [m.id for m in (*turns, old1, old2, episode1, fact1)]
    # Summaries and profile entries are never chosen, nor the newest episode.
    assert {m.id for m in await victims(memories, 10)}.isdisjoint(
        {summary.id, profile.id, episode2.id}
    )


async def test_a_few_victims_come_from_the_oldest_turns_alone() -> None:
    facts = [memory(f"fact-{i}", "fact", i) for i in range(3)]
    turns = [memory(f"turn-{i}", "turn", 10 + i, role="user") for i in range(5)]
    memories = InMemoryPort()
    await memories.upsert(TENANT, [*facts, *turns])
    assert [m.id for m in await victims(memories, 2)] == [turns[0].id, turns[1].id]
