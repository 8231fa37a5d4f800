"""Batches in ingest and evict, on the retrieval port in memory: ingest stores a batch of
turns with one Upsert, handles them one by one when retrieval refuses that shared write
(but not when it is down: then they all wait for their backoff); evict counts each
conversation of a batch once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
import pytest

from engram_core import lifecycle
from engram_core.bus import ensure_stream, publish_event
from engram_core.events import MemoryChanged, TurnPersisted
from engram_core.memory import KindCounts, MemoryFilter
from engram_testing.memory_store import InMemoryPort
from engram_testing.worker_stack import WorkerStack, consumer_settled, published, quick_settings
from engram_workers.evict import EVICT, EvictSettings
from engram_workers.ingest import turn_memory as ingest_turn_memory

from .test_batches import publish_all, turn

pytestmark = pytest.mark.integration


async def test_ingest_stores_a_batch_of_turns_with_one_upsert(
    ingest, publisher, nats_url: str, eventually
) -> None:
    events = [turn(f"turn {i}", conversation=f"c{i % 3}") for i in range(8)]
    await publish_all(publisher, nats_url, events)
    await ingest.start(batch_size=16)
    await eventually(ingest.settled, what="every ack")
    assert [len(call.records) for call in ingest.memories.upserts] == [8]
    changes = await published(nats_url, MemoryChanged)
    assert sorted(c.memory.text for c in changes) == sorted(e.text for e in events)


async def test_a_refused_shared_write_leaves_each_turn_its_own_fate(
    ingest, publisher, nats_url: str, eventually
) -> None:
    """The batch's Upsert is refused, then so is one turn's own: that turn alone is
    dead-lettered; the others are stored and announced once."""
    events = [turn(f"turn {i}") for i in range(5)]
    await publish_all(publisher, nats_url, events)
    memories = ingest.memories
    memories.fail_upserts_next = [grpc.StatusCode.INVALID_ARGUMENT] * 2
    await ingest.start(batch_size=16)
    [letter] = await ingest.dead_letters(1)
    await eventually(ingest.settled, what="every answer")
    assert "INVALID_ARGUMENT" in letter.reason
    refused = TurnPersisted.model_validate_json(letter.original_body)
    # in a conversation the turns go one by one in order: the first is the one refused
    assert refused.text == events[0].text
    assert sorted(m.text for m in memories.records("acme")) == [e.text for e in events[1:]]
    changes = await published(nats_url, MemoryChanged)
    assert sorted(c.memory.text for c in changes) == [e.text for e in events[1:]]


async def test_retrieval_down_fails_every_turn_of_the_batch_to_be_retried(
    ingest, publisher, nats_url: str, eventually
) -> None:
    """What says "try again" is not tried again turn by turn at once: each turn waits
    for its backoff, then the batch is stored whole."""
    events = [turn(f"turn {i}") for i in range(4)]
    await publish_all(publisher, nats_url, events)
    memories = ingest.memories
    memories.fail_upserts_next = [grpc.StatusCode.UNAVAILABLE]
    await ingest.start(batch_size=16, batch_max_wait_ms=300, retry_backoff_s=(0.2,))
    await eventually(ingest.settled, what="every ack")
    assert len(memories.upsert_attempts) == 2
    assert [len(call.records) for call in memories.upserts] == [4]
    assert await ingest.dead_letter_count() == 0


# --- evict ---------------------------------------------------------------------------------


@dataclass
class CountingPort(InMemoryPort):
    counted: list[str] = field(default_factory=list)  # the conversation of every Count

    async def count(self, tenant: str, flt: MemoryFilter) -> KindCounts:
        self.counted.append(flt.conversation_id or "")
        return await super().count(tenant, flt)


async def test_evict_checks_each_conversation_of_a_batch_once(
    publisher, nats_url: str, eventually
) -> None:
    """Ten new turns in one conversation and five in another: two counts, not fifteen,
    and the conversation over its limit is still brought under it."""
    port = CountingPort()
    conversations = {"busy": 10, "quiet": 5}
    changes = []
    for conversation, count in conversations.items():
        records = [
            ingest_turn_memory(turn(f"{conversation} {i}", conversation=conversation))
            for i in range(count)
        ]
        stored = await port.upsert("acme", records)
        changes += [lifecycle.change("acme", s.record, "created", cause="test") for s in stored]
    await ensure_stream(nats_url)
    for change in changes:
        await publish_event(publisher, change)
    stack = WorkerStack(nats_url, memories=port)
    try:
        settings = EvictSettings(**quick_settings(nats_url), max_entries=8, batch_size=32)
        await stack.start(EVICT, settings)
        await eventually(lambda: consumer_settled(nats_url, "evict"), what="every ack")
        busy = [r for r in port.records("acme") if r.conversation_id == "busy"]
        assert len(busy) == 8
    finally:
        await stack.stop_all()
    # one unlocked count per conversation, and a second, locked one where over the limit
    assert sorted(port.counted) == ["busy", "busy", "quiet"]
