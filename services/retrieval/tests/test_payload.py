"""Payload schema, deterministic ids and content hashes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from engram_core.proto import pb, to_timestamp
from engram_retrieval.payload import (
    build_payload,
    derive_id,
    format_ts,
    index_key,
    normalize_id,
    parse_ts,
    payload_to_memory,
)

T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


def test_ids_are_uuid5_and_stable() -> None:
    memory = pb.Memory(kind=pb.MEMORY_KIND_TURN, role="user", text="hi", source_id="d1:3")
    first = derive_id("t", memory)
    assert uuid.UUID(first).version == 5
    assert derive_id("t", memory) == first
    # conversation "" means "default"
    assert (
        derive_id(
            "t",
            pb.Memory(
                kind=pb.MEMORY_KIND_TURN,
                role="user",
                text="hi",
                source_id="d1:3",
                conversation_id="default",
            ),
        )
        == first
    )


def test_id_inputs() -> None:
    base = pb.Memory(kind=pb.MEMORY_KIND_FACT, text="likes tea", conversation_id="c")
    ids = {
        derive_id("t", base),
        derive_id("other", base),
        derive_id("t", pb.Memory(kind=pb.MEMORY_KIND_TURN, text="likes tea", conversation_id="c")),
        derive_id("t", pb.Memory(kind=pb.MEMORY_KIND_FACT, text="likes tea", conversation_id="d")),
        derive_id(
            "t",
            pb.Memory(
                kind=pb.MEMORY_KIND_FACT,
                text="likes tea",
                conversation_id="c",
                created_at=to_timestamp(T0),
            ),
        ),
    }
    assert len(ids) == 5
    # with a source_id, the text and created_at do not matter: a re-sent turn is the same one
    a = pb.Memory(kind=pb.MEMORY_KIND_TURN, text="v1", source_id="s", created_at=to_timestamp(T0))
    b = pb.Memory(kind=pb.MEMORY_KIND_TURN, text="v2", source_id="s")
    assert derive_id("t", a) == derive_id("t", b)


def test_timestamps_sort_as_text() -> None:
    assert format_ts(T0) == "2025-03-04T05:06:07.890123Z"
    assert format_ts(datetime(2025, 3, 4, tzinfo=UTC)) == "2025-03-04T00:00:00.000000Z"
    assert parse_ts(format_ts(T0)) == T0
    assert normalize_id("6F1C1D0E-3F5E-5A57-9D8E-656E6772616D") == (
        "6f1c1d0e-3f5e-5a57-9d8e-656e6772616d"
    )
    assert normalize_id("nope") is None


def test_payload_round_trip_and_hash() -> None:
    memory = pb.Memory(
        user_id="u",
        conversation_id="c",
        kind=pb.MEMORY_KIND_FACT,
        text="likes tea",
        source_id="s1",
        turn_index=4,
        source_turn_ids=["a", "b"],
        valid_from=to_timestamp(T0),
        tags=["b", "a", "b"],
        metadata={"k": "v"},
        profile=pb.ProfileEntry(
            category="preference", key="drink", value="tea", confidence=0.9, importance=0.5
        ),
        turn_range=pb.TurnRange(first_turn=1, last_turn=20),
    )
    payload = build_payload("t", memory, created_at=T0, updated_at=T0, embedding_model="m")
    assert payload["tags"] == ["a", "b"] and payload["superseded_by"] is None
    assert payload["valid_from"] == format_ts(T0) and payload["valid_to"] is None
    back = payload_to_memory("id-1", payload)
    assert back.id == "id-1" and back.tenant == "t" and back.text == "likes tea"
    assert back.created_at.ToDatetime(tzinfo=UTC) == T0
    assert back.profile.value == "tea" and back.turn_range.last_turn == 20
    assert back.metadata == {"k": "v"} and list(back.source_turn_ids) == ["a", "b"]
    # the hash ignores bookkeeping and is stable across a round trip
    later = build_payload(
        "t", back, created_at=T0, updated_at=datetime.now(UTC), embedding_model="m"
    )
    assert later["content_hash"] == payload["content_hash"]
    changed = pb.Memory()
    changed.CopyFrom(back)
    changed.superseded_by = "x"
    superseded = build_payload("t", changed, created_at=T0, updated_at=T0, embedding_model="m")
    assert superseded["content_hash"] != payload["content_hash"]
    assert superseded["embed_hash"] == payload["embed_hash"]  # same text: vector reusable


def test_index_key_dates_a_turn_and_names_who_said_it() -> None:
    said = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    turn = pb.Memory(
        kind=pb.MEMORY_KIND_TURN,
        role="user",
        text="Caroline: I went to a support group.",
        metadata={"speaker": "Caroline"},
    )
    assert index_key(turn, said) == '(8 May 2023) Caroline said "I went to a support group."'
    gateway_turn = pb.Memory(kind=pb.MEMORY_KIND_TURN, role="assistant", text="Noted.")
    assert index_key(gateway_turn, said) == '(8 May 2023) assistant said "Noted."'
    fact = pb.Memory(kind=pb.MEMORY_KIND_FACT, text="User's wife is Anne")
    assert index_key(fact, said) == "User's wife is Anne"  # statements stand alone
    profile = pb.Memory(
        kind=pb.MEMORY_KIND_PROFILE,
        profile=pb.ProfileEntry(category="identity", key="name", value="Bob", confidence=0.9),
    )
    assert index_key(profile, said) == "identity name: Bob"


def test_the_embedding_is_reused_only_while_the_index_key_is_unchanged() -> None:
    memory = pb.Memory(kind=pb.MEMORY_KIND_TURN, role="user", text="I like tea")
    kwargs = {"updated_at": T0, "embedding_model": "m"}
    first = build_payload("t", memory, created_at=T0, **kwargs)
    same_day = build_payload("t", memory, created_at=T0.replace(hour=23), **kwargs)
    next_day = build_payload("t", memory, created_at=datetime(2025, 3, 5, tzinfo=UTC), **kwargs)
    assert first["embed_hash"] == same_day["embed_hash"] != next_day["embed_hash"]
