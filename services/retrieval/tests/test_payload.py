"""Payload schema, deterministic ids and content hashes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from engram_core.ids import memory_id
from engram_core.memory import MemoryRecord, ProposedProfileFact
from engram_retrieval.payload import (
    build_payload,
    format_ts,
    index_key,
    parse_ts,
    record_from_payload,
)

T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


def test_ids_are_uuid5_and_stable() -> None:
    memory = MemoryRecord(id="x", kind="turn", role="user", text="hi", source_id="d1:3")
    first = memory_id("t", memory)
    assert uuid.UUID(first).version == 5
    assert memory_id("t", memory.model_copy(update={"id": "y"})) == first  # the id takes no part


def test_id_inputs() -> None:
    base = MemoryRecord(id="x", kind="fact", text="likes tea", conversation_id="c")
    ids = {
        memory_id("t", base),
        memory_id("other", base),
        memory_id("t", base.model_copy(update={"kind": "turn"})),
        memory_id("t", base.model_copy(update={"conversation_id": "d"})),
        memory_id("t", base.model_copy(update={"created_at": T0})),
    }
    assert len(ids) == 5
    # with a source_id, the text and created_at do not matter: a re-sent turn is the same one
    a = MemoryRecord(id="x", kind="turn", text="v1", source_id="s", created_at=T0)
    b = MemoryRecord(id="x", kind="turn", text="v2", source_id="s")
    assert memory_id("t", a) == memory_id("t", b)


def test_timestamps_sort_as_text() -> None:
    assert format_ts(T0) == "2025-03-04T05:06:07.890123Z"
    assert format_ts(datetime(2025, 3, 4, tzinfo=UTC)) == "2025-03-04T00:00:00.000000Z"
    assert parse_ts(format_ts(T0)) == T0


FACT = MemoryRecord(
    id="id-1",
    user_id="u",
    conversation_id="c",
    kind="fact",
    text="likes tea",
    source_id="s1",
    turn_index=4,
    source_turn_ids=["a", "b"],
    valid_from=T0,
    tags=["b", "a", "b"],
    metadata={"k": "v"},
    profile=ProposedProfileFact(
        category="preference", key="drink", value="tea", confidence=0.9, importance=0.5
    ),
    turn_range=(1, 20),
)


def test_payload_round_trip_and_hash() -> None:
    payload = build_payload("t", FACT, created_at=T0, updated_at=T0, embedding_model="m")
    assert payload["tags"] == ["a", "b"] and payload["superseded_by"] is None
    assert payload["valid_from"] == format_ts(T0) and payload["valid_to"] is None
    back = record_from_payload("id-1", payload)
    assert back.id == "id-1" and back.text == "likes tea" and back.created_at == T0
    assert back.profile is not None and back.profile.value == "tea"
    assert back.turn_range == (1, 20)
    assert back.metadata == {"k": "v"} and back.source_turn_ids == ["a", "b"]
    # the hash ignores bookkeeping and is stable across a round trip
    later = build_payload(
        "t", back, created_at=T0, updated_at=datetime.now(UTC), embedding_model="m"
    )
    assert later["content_hash"] == payload["content_hash"]
    changed = back.model_copy(update={"superseded_by": "x"})
    superseded = build_payload("t", changed, created_at=T0, updated_at=T0, embedding_model="m")
    assert superseded["content_hash"] != payload["content_hash"]
    assert superseded["embed_hash"] == payload["embed_hash"]  # same text: vector reusable


def test_stored_hashes_stay_valid() -> None:
    """Pinned from the payloads written before the write path moved onto MemoryRecord: a
    change here makes every stored memory look changed (and re-embeds it)."""
    fact = build_payload("t", FACT, created_at=T0, updated_at=T0, embedding_model="m")
    assert fact["content_hash"] == (
        "40e2453d61f7f9c3821e59920792dc504e7d437ceba26262c5ea69324b57cd41"
    )
    assert fact["embed_hash"] == "d60741146740ac5da9e76797ad77a5becba9bf77d25ee3cb90c33f9bb347ca1a"
    turn = MemoryRecord(
        id="x",
        kind="turn",
        role="user",
        text="Caroline: I went.",
        metadata={"speaker": "Caroline"},
        conversation_id="c",
    )
    stored = build_payload("t", turn, created_at=T0, updated_at=T0, embedding_model="m")
    assert stored["content_hash"] == (
        "9e211cec5f276749626046318bd0484f79a8157bcf241e4221d5db674885d2bb"
    )
    assert stored["embed_hash"] == (
        "6fc2e8aa1ae65470d393949dc5037f19b32b03de9f5589bd9efa22ed489dd1b0"
    )


def test_a_stored_payload_reads_back_without_validation() -> None:
    """A point an older version wrote (a profile category today's model refuses) still
    reads: the store holds what was accepted then."""
    payload = build_payload("t", FACT, created_at=T0, updated_at=T0, embedding_model="m")
    payload["profile"] = {**payload["profile"], "category": "hobby"}
    back = record_from_payload("id-1", payload)
    assert back.profile is not None
    category: str = back.profile.category  # a value outside today's Literal
    assert category == "hobby"


def test_index_key_dates_a_turn_and_names_who_said_it() -> None:
    said = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    turn = MemoryRecord(
        id="x",
        kind="turn",
        role="user",
        text="Caroline: I went to a support group.",
        metadata={"speaker": "Caroline"},
    )
    assert index_key(turn, said) == '(8 May 2023) Caroline said "I went to a support group."'
    gateway_turn = MemoryRecord(id="x", kind="turn", role="assistant", text="Noted.")
    assert index_key(gateway_turn, said) == '(8 May 2023) assistant said "Noted."'
    fact = MemoryRecord(id="x", kind="fact", text="User's wife is Anne")
    assert index_key(fact, said) == "User's wife is Anne"  # statements stand alone
    profile = MemoryRecord(
        id="x",
        kind="profile",
        text="",
        profile=ProposedProfileFact(category="identity", key="name", value="Bob", confidence=0.9),
    )
    assert index_key(profile, said) == "identity name: Bob"


def test_the_embedding_is_reused_only_while_the_index_key_is_unchanged() -> None:
    memory = MemoryRecord(id="x", kind="turn", role="user", text="I like tea")

    def payload(created_at: datetime) -> dict[str, Any]:
        return build_payload("t", memory, created_at=created_at, updated_at=T0, embedding_model="m")

    first = payload(T0)
    same_day = payload(T0.replace(hour=23))
    next_day = payload(datetime(2025, 3, 5, tzinfo=UTC))
    assert first["embed_hash"] == same_day["embed_hash"] != next_day["embed_hash"]


def test_a_stored_point_encodes_as_its_record_would() -> None:
    # The servicer encodes search hits straight from the payload; a caller must get the
    # message the record would give, whatever a payload holds or lacks.
    from engram_core import codec
    from engram_retrieval.service import _memory
    from engram_retrieval.store import StoredPoint

    record = MemoryRecord(
        id=str(uuid.uuid4()),
        kind="fact",
        text="User is allergic to peanuts",
        user_id="u1",
        conversation_id="c1",
        created_at=datetime(2024, 5, 8, 13, 56, 1, 123456, tzinfo=UTC),
        valid_from=datetime(2024, 5, 8, tzinfo=UTC),
        source_turn_ids=["t1", "t2"],
        tags=["health"],
        superseded_by="other",
        metadata={"decision": "ADD"},
    )
    full = build_payload(
        "tenant-a", record, created_at=T0, updated_at=T0, embedding_model="model-x"
    )
    summary = build_payload(
        "t",
        record.model_copy(update={"kind": "summary", "turn_range": (3, 9)}),
        created_at=T0,
        updated_at=T0,
        embedding_model="m",
    )
    payloads: list[dict[str, Any]] = [
        full,
        summary,
        {**full, "valid_to": "2025-01-01T00:00:00.000000Z", "superseded_by": None},
        {**full, "metadata": None, "tags": None, "source_turn_ids": None, "turn_index": None},
        {"tenant": "a", "kind": "turn", "text": "an older payload", "created_at": "2024-01-01"},
        {"tenant": "a", "kind": "a kind from a newer version", "text": "x"},
        {
            "kind": "profile",
            "profile": {
                "category": "diet",
                "key": "allergy",
                "value": "nuts",
                "confidence": 0.9,
                "importance": 0.5,
            },
        },
    ]
    for payload in payloads:
        point = StoredPoint(record.id, payload)
        expected = codec.record_to_pb(
            record_from_payload(record.id, payload),
            tenant=payload.get("tenant", ""),
            embedding_model=payload.get("embedding_model", ""),
        )
        assert _memory(point) == expected, payload
        assert _memory(point) == expected  # a second read (its timestamps remembered)
