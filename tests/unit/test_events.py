"""Event models: one definition, strict validation, stable JSON round-trip."""

import pytest
from pydantic import ValidationError

from engram_core.events import TurnPersisted, dlq_subject


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
