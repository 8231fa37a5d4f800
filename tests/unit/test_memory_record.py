"""pb.Memory and the events' MemoryRecord convert both ways without losing a field."""

from datetime import UTC, datetime

from engram_core.codec import record_from_pb, record_to_pb
from engram_core.events import MemoryChanged
from engram_core.memory import MemoryRecord, ProposedProfileFact


def test_every_field_survives_a_round_trip() -> None:
    record = MemoryRecord(
        id="5b0c2f7e-0000-4000-8000-000000000001",
        kind="profile",
        text="name: Anne",
        role="",
        user_id="u1",
        conversation_id="c1",
        created_at=datetime(2026, 5, 1, 12, 0, tzinfo=UTC),
        updated_at=datetime(2026, 5, 2, 12, 0, tzinfo=UTC),
        source_id="D1:3",
        turn_index=7,
        source_turn_ids=["t1", "t2"],
        valid_from=datetime(2026, 5, 1, 12, 0, tzinfo=UTC),
        valid_to=datetime(2026, 6, 1, 12, 0, tzinfo=UTC),
        superseded_by="5b0c2f7e-0000-4000-8000-000000000002",
        tags=["family"],
        profile=ProposedProfileFact(
            category="identity", key="wife_name", value="Anne", confidence=0.9, importance=0.75
        ),
        turn_range=(1, 20),
        metadata={"k": "v"},
    )
    assert record_from_pb(record_to_pb(record, tenant="t")) == record
    assert record_to_pb(record, tenant="t").tenant == "t"


def test_unset_optionals_stay_unset() -> None:
    record = MemoryRecord(id="m1", kind="turn", text="hi", role="user")
    again = record_from_pb(record_to_pb(record))
    assert again.created_at is None and again.profile is None and again.turn_range is None
    change = MemoryChanged(tenant="t", op="created", memory=again)
    assert MemoryChanged.model_validate_json(change.model_dump_json()) == change
