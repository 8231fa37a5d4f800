"""Event models: one definition, strict validation, stable JSON round-trip."""

import pytest
from pydantic import ValidationError

from engram_core.dead_letters import DeadLetterFilter, StoredDeadLetter
from engram_core.events import (
    DeadLetter,
    MemoryChanged,
    MemoryChangeOp,
    TurnPersisted,
    dlq_subject,
    event_subject,
)
from engram_core.memory import MemoryKindName, MemoryRecord


def test_turn_round_trips_through_json() -> None:
    event = TurnPersisted(
        tenant="t1", turn_id="r1:user", role="user", text="hi", conversation_id="c1", user_id="u1"
    )
    again = TurnPersisted.model_validate_json(event.model_dump_json())
    assert again == event
    assert again.type == "turn.persisted"
    assert TurnPersisted.subject == "engram.turn.persisted.v1"


def test_each_event_gets_its_own_id() -> None:
    a = TurnPersisted(tenant="t", turn_id="1", role="user", text="x")
    b = TurnPersisted(tenant="t", turn_id="1", role="user", text="x")
    assert a.event_id != b.event_id


@pytest.mark.parametrize(
    "payload",
    [
        {"tenant": "", "turn_id": "1", "role": "user", "text": "x"},
        {"tenant": "t", "turn_id": "1", "role": "robot", "text": "x"},
        {"tenant": "t", "turn_id": "1", "role": "user", "text": "x", "surprise": 1},
        {"tenant": "t", "role": "user", "text": "x"},
    ],
)
def test_malformed_turns_are_rejected(payload: dict) -> None:
    with pytest.raises(ValidationError):
        TurnPersisted.model_validate(payload)


def test_dead_letter_subjects_live_under_the_stream() -> None:
    assert dlq_subject("ingest") == "engram.dlq.ingest"


def _change(kind: MemoryKindName, op: MemoryChangeOp) -> MemoryChanged:
    memory = MemoryRecord(id="m1", kind=kind, text="User has a cat named Miso.")
    return MemoryChanged(tenant="t", op=op, memory=memory)


def test_a_memory_change_is_published_on_its_kind_and_op() -> None:
    assert _change("fact", "created").published_subject == "engram.memory.changed.v1.fact.created"
    assert _change("summary", "superseded").published_subject == (
        "engram.memory.changed.v1.summary.superseded"
    )
    turn = TurnPersisted(tenant="t", turn_id="1", role="user", text="x")
    assert turn.published_subject == TurnPersisted.subject


def test_spans_and_metrics_name_the_event_not_its_kind_and_op() -> None:
    assert event_subject("engram.memory.changed.v1.fact.created") == "engram.memory.changed.v1"
    assert event_subject("engram.memory.changed.v1") == "engram.memory.changed.v1"
    assert event_subject("engram.turn.persisted.v1") == "engram.turn.persisted.v1"
    assert event_subject("engram.dlq.ingest") == "engram.dlq.ingest"
    # a later version is another event, not this one's kind and op
    assert event_subject("engram.memory.changed.v2.fact.created") == (
        "engram.memory.changed.v2.fact.created"
    )


def test_a_consumer_of_some_changes_keeps_the_subject_of_changes_from_before_the_split() -> None:
    subjects = MemoryChanged.subjects_where(lambda kind, op: kind == "fact" and op != "updated")
    assert subjects == (
        "engram.memory.changed.v1",
        "engram.memory.changed.v1.fact.created",
        "engram.memory.changed.v1.fact.superseded",
        "engram.memory.changed.v1.fact.deleted",
        "engram.memory.changed.v1.fact.evicted",
    )
    assert MemoryChanged.consumed_subjects() == (
        "engram.memory.changed.v1",
        "engram.memory.changed.v1.>",
    )


def test_dead_letters_of_a_memory_change_are_found_by_its_subject_or_its_event() -> None:
    letter = DeadLetter(
        worker="summarize",
        subject="engram.memory.changed.v1.fact.created",
        reason="boom",
        deliveries=3,
        original_body="{}",
    )
    stored, now = StoredDeadLetter(id=1, letter=letter), letter.failed_at

    def found(subject: str) -> bool:
        return DeadLetterFilter(subject=subject).matches(stored, now)

    assert found("engram.memory.changed.v1.fact.created")
    assert found("engram.memory.changed.v1")
    assert not found("engram.memory.changed.v1.fact.deleted")
    assert not found("engram.turn.persisted.v1")
