"""The summarize worker's batch hook, on the retrieval port in memory: the new facts and
turns of one conversation in a batch are handled once (one fold, one episode check),
not once each; a conversation with a removal in the batch keeps its stream order."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from engram_core import lifecycle
from engram_core.bus import ensure_stream, publish_event
from engram_core.memory import KindCounts, MemoryFilter, MemoryRecord
from engram_testing.memory_store import InMemoryPort
from engram_testing.worker_stack import WorkerStack, consumer_settled, quick_settings
from engram_workers.ingest import turn_memory as ingest_turn_memory
from engram_workers.summarize import SUMMARIZE, SummarizeSettings
from engram_workers.summarize.core import summary_memory_id

from .test_batches import turn

pytestmark = pytest.mark.integration


@dataclass
class CountingPort(InMemoryPort):
    gets: list[list[str]] = field(default_factory=list)
    counted: list[str] = field(default_factory=list)

    async def get(self, tenant: str, ids: Iterable[str]) -> dict[str, MemoryRecord]:
        self.gets.append(list(ids))
        return await super().get(tenant, ids)

    async def count(self, tenant: str, flt: MemoryFilter) -> KindCounts:
        self.counted.append(flt.conversation_id or "")
        return await super().count(tenant, flt)


def fact(text: str, conversation: str) -> MemoryRecord:
    return MemoryRecord(
        id=str(uuid.uuid4()), kind="fact", text=text, user_id="u1", conversation_id=conversation
    )


async def summarize_settled(nats_url: str, port: CountingPort, eventually: Any) -> None:
    stack = WorkerStack(nats_url, memories=port)
    try:
        settings = SummarizeSettings(**quick_settings(nats_url), batch_size=64, episode_turns=4)
        await stack.start(SUMMARIZE, settings)
        await eventually(lambda: consumer_settled(nats_url, "summarize"), what="every ack")
    finally:
        await stack.stop_all()


async def test_one_fold_and_one_episode_check_per_conversation_of_a_batch(
    publisher: Any, nats_url: str, eventually: Any
) -> None:
    port = CountingPort()
    changes = []
    for conversation, count in {"busy": 6, "quiet": 2}.items():
        turns = [
            ingest_turn_memory(turn(f"{conversation} turn {i}", conversation=conversation))
            for i in range(count)
        ]
        facts = [fact(f"User likes {conversation} thing {i}.", conversation) for i in range(count)]
        for stored in await port.upsert("acme", [*turns, *facts]):
            changes.append(lifecycle.change("acme", stored.record, "created", cause="test"))
    await ensure_stream(nats_url)
    for change in changes:
        await publish_event(publisher, change)
    await summarize_settled(nats_url, port, eventually)

    # one read for each conversation's fold (its summary and its new facts), not one a fact
    assert sorted(len(ids) for ids in port.gets) == [1 + 2, 1 + 6]
    # one unlocked episode count per conversation, not one a turn
    assert port.counted.count("quiet") == 1
    assert port.counted.count("busy") >= 1 and len(port.counted) < 6 + 2
    for conversation, count in {"busy": 6, "quiet": 2}.items():
        summary_id = summary_memory_id("acme", "u1", conversation)
        (record,) = (await port.get("acme", [summary_id])).values()
        assert record.metadata["facts_folded"] == str(count)
    # the busy conversation's six turns made an episode of four (the window closed)
    episodes = [r for r in port.records("acme") if r.kind == "episode"]
    assert [e.conversation_id for e in episodes] == ["busy"]
