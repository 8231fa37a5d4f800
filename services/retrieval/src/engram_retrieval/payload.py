"""How a memory is stored: the Qdrant payload of a :class:`MemoryRecord`, its index
key and content hashes, and the record read back from a stored payload.

The payload schema is documented in docs/retrieval.md; every field below is written
for every point so filters never depend on a field's absence (except
``superseded_by``, ``valid_from``, ``valid_to``, ``profile``, ``turn_range``, which
are ``null`` when unset, so ``is_empty`` filters work on them). Point ids derived from
content are :func:`engram_core.ids.memory_id`.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from engram_core.memory import DEFAULT_CONVERSATION, MemoryRecord, ProposedProfileFact
from engram_core.timestamps import format_utc, spoken_day

# Fields that define a memory's content: a repeated Upsert with the same values is a
# no-op. Bookkeeping (updated_at, embedding_model, the hashes themselves) is left out.
CONTENT_FIELDS = (
    "user_id",
    "conversation_id",
    "kind",
    "text",
    "role",
    "created_at",
    "source_id",
    "turn_index",
    "source_turn_ids",
    "valid_from",
    "valid_to",
    "superseded_by",
    "tags",
    "profile",
    "turn_range",
    "metadata",
)


def format_ts(value: datetime) -> str:
    """UTC, fixed microsecond precision, ``Z`` suffix, four-digit year: sorts as text
    and as time, and reads back (years before 1000 included)."""
    return format_utc(value)


def parse_ts(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def index_key(record: MemoryRecord, created_at: datetime) -> str:
    """The text a memory is embedded and BM25-indexed under (never shown; the verbatim
    text is what search returns).

    A turn is keyed with when and by whom it was said:
    ``(8 May 2023) Caroline said "I went to a support group."`` — the speaker is the
    turn's ``metadata["speaker"]`` (a leading ``"<speaker>: "`` in the text is not
    repeated) or else its role. Measured on LoCoMo's development half: +2.2 R@10 over
    the bare text (docs/benchmarks.md); the date lets lexical search match "May" or
    "2023". Facts, profile entries and episodes are keyed by their text alone: they
    are already self-contained statements, and reconcile compares a new fact's text
    with stored facts by cosine, which a date prefix would blur.
    """
    if record.kind != "turn":
        return record.display_text
    who = record.speaker or record.role or "someone"
    return f'({spoken_day(created_at)}) {who} said "{record.spoken_text}"'


def _opt_ts(value: datetime | None) -> str | None:
    return format_ts(value) if value is not None else None


def build_payload(
    tenant: str,
    record: MemoryRecord,
    *,
    created_at: datetime,
    updated_at: datetime,
    embedding_model: str,
) -> dict[str, Any]:
    profile = record.profile
    payload: dict[str, Any] = {
        "tenant": tenant,
        "user_id": record.user_id,
        "conversation_id": record.conversation_id or DEFAULT_CONVERSATION,
        "kind": record.kind,
        "text": record.text,
        "role": record.role,
        "created_at": format_ts(created_at),
        "source_id": record.source_id,
        "turn_index": int(record.turn_index),
        "source_turn_ids": list(record.source_turn_ids),
        "valid_from": _opt_ts(record.valid_from),
        "valid_to": _opt_ts(record.valid_to),
        "superseded_by": record.superseded_by or None,
        "tags": sorted(set(record.tags)),
        "profile": (
            {
                "category": profile.category,
                "key": profile.key,
                "value": profile.value,
                "confidence": round(float(profile.confidence), 6),
                "importance": round(float(profile.importance), 6),
            }
            if profile is not None
            else None
        ),
        "turn_range": (
            {"first_turn": int(record.turn_range[0]), "last_turn": int(record.turn_range[1])}
            if record.turn_range is not None
            else None
        ),
        "metadata": dict(sorted(record.metadata.items())),
        "embedding_model": embedding_model,
        "updated_at": format_ts(updated_at),
    }
    payload["content_hash"] = content_hash(payload)
    payload["embed_hash"] = embed_hash(index_key(record, created_at), embedding_model)
    return payload


def content_hash(payload: dict[str, Any]) -> str:
    content = {name: payload.get(name) for name in CONTENT_FIELDS}
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def embed_hash(text: str, model_id: str) -> str:
    return hashlib.sha256(f"{model_id}\x1f{text}".encode()).hexdigest()


def _opt_parsed(value: str | None) -> datetime | None:
    return parse_ts(value) if value else None


def record_from_payload(point_id: str, payload: dict[str, Any]) -> MemoryRecord:
    """The memory a stored payload holds. Not validated again: Upsert validated it, and a
    point an older version wrote (a value today's model would refuse) still reads."""
    profile = payload.get("profile")
    turn_range = payload.get("turn_range")
    return MemoryRecord.model_construct(
        id=point_id,
        kind=payload.get("kind", ""),
        text=payload.get("text", ""),
        role=payload.get("role", ""),
        user_id=payload.get("user_id", ""),
        conversation_id=payload.get("conversation_id", ""),
        created_at=_opt_parsed(payload.get("created_at")),
        updated_at=_opt_parsed(payload.get("updated_at")),
        source_id=payload.get("source_id", ""),
        turn_index=int(payload.get("turn_index") or 0),
        source_turn_ids=list(payload.get("source_turn_ids") or []),
        valid_from=_opt_parsed(payload.get("valid_from")),
        valid_to=_opt_parsed(payload.get("valid_to")),
        superseded_by=payload.get("superseded_by") or "",
        tags=list(payload.get("tags") or []),
        profile=ProposedProfileFact.model_construct(**profile) if profile else None,
        turn_range=(
            (int(turn_range["first_turn"]), int(turn_range["last_turn"])) if turn_range else None
        ),
        metadata=dict(payload.get("metadata") or {}),
    )
