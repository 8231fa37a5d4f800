"""Ingest's own decisions, without NATS or retrieval: a turn's id, the memory it
becomes, and when a turn seen again is a repeat to skip."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from engram_core.events import TurnPersisted
from engram_core.memory import MemoryRecord
from engram_workers.ingest import IngestDelivery, is_repeat, turn_memory, turn_memory_id


@dataclass
class SeenDelivery:
    """What is_repeat reads of a delivery."""

    attempt: int = 1
    replayed: bool = False


def seen(attempt: int = 1, replayed: bool = False) -> IngestDelivery:
    """A delivery as is_repeat sees it (the two fields it reads, nothing behind them)."""
    return cast(IngestDelivery, SeenDelivery(attempt, replayed))


def event(text: str = "I love pizza.", **fields: object) -> TurnPersisted:
    values: dict[str, object] = {
        "tenant": "acme",
        "user_id": "alice",
        "conversation_id": "c1",
        "turn_id": "chat/3/abc",
        "role": "user",
        "text": text,
        "model": "gpt-test",
        "created_at": datetime(2026, 2, 1, tzinfo=UTC),
    }
    return TurnPersisted.model_validate(values | fields)


def test_a_turn_is_one_memory_whatever_event_carries_it() -> None:
    first, retried = event(), event(event_id="retried-request")
    assert turn_memory(first).id == turn_memory(retried).id
    assert turn_memory(first).id == turn_memory_id("acme", "c1", "chat/3/abc")
    # the id parts are kept apart: ("a.b", "c") is not ("a", "b.c")
    assert turn_memory_id("acme", "a.b", "c") != turn_memory_id("acme", "a", "b.c")
    memory = turn_memory(first)
    assert (memory.kind, memory.role, memory.user_id, memory.text) == (
        "turn",
        "user",
        "alice",
        "I love pizza.",
    )
    assert memory.metadata == {
        "turn_id": "chat/3/abc",
        "event_id": first.event_id,
        "model": "gpt-test",
    }


def test_the_same_text_seen_again_in_a_new_message_is_a_repeat() -> None:
    stored: MemoryRecord = turn_memory(event())
    assert is_repeat(event(event_id="retried"), stored, seen())
    assert not is_repeat(event(), None, seen())  # not stored yet
    assert not is_repeat(event("I love pasta."), stored, seen())  # text changed


def test_a_redelivery_a_replay_or_a_reextraction_is_never_a_repeat() -> None:
    # the first delivery may have stopped half-way; these must finish the work
    stored = turn_memory(event())
    assert not is_repeat(event(), stored, seen(attempt=2))
    assert not is_repeat(event(), stored, seen(replayed=True))
    assert not is_repeat(event(reextract=True), stored, seen())
