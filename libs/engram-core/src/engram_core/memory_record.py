"""Conversions between ``pb.Memory`` (the gRPC contract) and ``MemoryRecord`` (events)."""

from __future__ import annotations

from engram_core.memory import MemoryRecord, ProposedProfileFact
from engram_core.proto import KIND_BY_NAME, from_timestamp, kind_name, pb, to_timestamp


def record_from_pb(memory: pb.Memory) -> MemoryRecord:
    profile = None
    if memory.HasField("profile") and memory.profile.key:
        profile = ProposedProfileFact(
            category=memory.profile.category,
            key=memory.profile.key,
            value=memory.profile.value,
            confidence=round(float(memory.profile.confidence), 6),
            importance=round(float(memory.profile.importance), 6),
        )
    turn_range = None
    if memory.HasField("turn_range"):
        turn_range = (int(memory.turn_range.first_turn), int(memory.turn_range.last_turn))
    return MemoryRecord(
        id=memory.id,
        kind=kind_name(memory.kind),
        text=memory.text,
        role=memory.role,
        user_id=memory.user_id,
        conversation_id=memory.conversation_id or "default",
        created_at=from_timestamp(memory.created_at),
        updated_at=from_timestamp(memory.updated_at),
        source_id=memory.source_id,
        turn_index=int(memory.turn_index),
        source_turn_ids=list(memory.source_turn_ids),
        valid_from=from_timestamp(memory.valid_from),
        valid_to=from_timestamp(memory.valid_to),
        superseded_by=memory.superseded_by,
        tags=list(memory.tags),
        profile=profile,
        turn_range=turn_range,
        metadata=dict(memory.metadata),
    )


def record_to_pb(record: MemoryRecord, tenant: str = "") -> pb.Memory:
    memory = pb.Memory(
        id=record.id,
        tenant=tenant,
        user_id=record.user_id,
        conversation_id=record.conversation_id,
        kind=KIND_BY_NAME[record.kind],
        text=record.text,
        role=record.role,
        source_id=record.source_id,
        turn_index=record.turn_index,
        source_turn_ids=record.source_turn_ids,
        superseded_by=record.superseded_by,
        tags=record.tags,
        metadata=record.metadata,
    )
    for name in ("created_at", "updated_at", "valid_from", "valid_to"):
        value = getattr(record, name)
        if value is not None:
            getattr(memory, name).CopyFrom(to_timestamp(value))
    if record.profile is not None:
        memory.profile.CopyFrom(pb.ProfileEntry(**record.profile.model_dump()))
    if record.turn_range is not None:
        memory.turn_range.CopyFrom(
            pb.TurnRange(first_turn=record.turn_range[0], last_turn=record.turn_range[1])
        )
    return memory
