"""How a ``Memory`` is stored: the Qdrant payload, deterministic ids, content hashes.

The payload schema is documented in docs/retrieval.md; every field below is written
for every point so filters never depend on a field's absence (except
``superseded_by``, ``valid_from``, ``valid_to``, ``profile``, ``turn_range``, which
are ``null`` when unset, so ``is_empty`` filters work on them).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from engram_core.proto import KIND_BY_NAME, KIND_NAMES, from_timestamp, pb, to_timestamp
from engram_core.timestamps import format_utc

DEFAULT_CONVERSATION = "default"
GLOBAL_CONVERSATION = "global"
# Fixed namespace for uuid5 point ids; changing it would re-key every stored memory.
ID_NAMESPACE = uuid.UUID("6f1c1d0e-3f5e-5a57-9d8e-656e6772616d")

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


def normalize_id(raw: str) -> str | None:
    """The canonical form of a UUID point id, or None when ``raw`` is not one."""
    try:
        return str(uuid.UUID(raw))
    except (ValueError, AttributeError, TypeError):
        return None


def identity_text(memory: pb.Memory) -> str:
    """What a memory says, for ids and embedding: its text, or ``category/key=value``."""
    if memory.text:
        return memory.text
    if memory.HasField("profile"):
        p = memory.profile
        return f"{p.category}/{p.key}={p.value}"
    return ""


def memory_text(memory: pb.Memory) -> str:
    """What a memory says, as a reader sees it: its text, or ``category key: value``."""
    if memory.text:
        return memory.text
    if memory.HasField("profile"):
        p = memory.profile
        return f"{p.category} {p.key}: {p.value}".strip()
    return ""


def index_key(memory: pb.Memory, created_at: datetime) -> str:
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
    text = memory_text(memory)
    if memory.kind != pb.MEMORY_KIND_TURN:
        return text
    created = created_at.astimezone(UTC)
    speaker = memory.metadata.get("speaker", "").strip()
    if speaker:
        text = text.removeprefix(f"{speaker}: ")
    return f'({created.day} {created:%B %Y}) {speaker or memory.role or "someone"} said "{text}"'


def derive_id(tenant: str, memory: pb.Memory) -> str:
    """uuid5 over (tenant, conversation, kind, role, source_id or text[, created_at]).

    created_at takes part only when there is no source_id and the caller set it, so the
    same sentence said twice at different times is two memories, while a re-sent turn
    with the same source_id is the same memory.
    """
    conversation = memory.conversation_id or DEFAULT_CONVERSATION
    parts = [tenant, conversation, KIND_NAMES.get(memory.kind, ""), memory.role]
    if memory.source_id:
        parts.append("source:" + memory.source_id)
    else:
        parts.append("text:" + identity_text(memory))
        created = from_timestamp(memory.created_at)
        if created is not None:
            parts.append("at:" + format_ts(created))
    return str(uuid.uuid5(ID_NAMESPACE, "\x1f".join(parts)))


def _opt_ts(memory: pb.Memory, name: str) -> str | None:
    if not memory.HasField(name):
        return None
    value = from_timestamp(getattr(memory, name))
    return format_ts(value) if value is not None else None


def build_payload(
    tenant: str,
    memory: pb.Memory,
    *,
    created_at: datetime,
    updated_at: datetime,
    embedding_model: str,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "tenant": tenant,
        "user_id": memory.user_id,
        "conversation_id": memory.conversation_id or DEFAULT_CONVERSATION,
        "kind": KIND_NAMES[memory.kind],
        "text": memory.text,
        "role": memory.role,
        "created_at": format_ts(created_at),
        "source_id": memory.source_id,
        "turn_index": int(memory.turn_index),
        "source_turn_ids": list(memory.source_turn_ids),
        "valid_from": _opt_ts(memory, "valid_from"),
        "valid_to": _opt_ts(memory, "valid_to"),
        "superseded_by": memory.superseded_by or None,
        "tags": sorted(set(memory.tags)),
        "profile": (
            {
                "category": memory.profile.category,
                "key": memory.profile.key,
                "value": memory.profile.value,
                "confidence": round(float(memory.profile.confidence), 6),
                "importance": round(float(memory.profile.importance), 6),
            }
            if memory.HasField("profile")
            else None
        ),
        "turn_range": (
            {
                "first_turn": int(memory.turn_range.first_turn),
                "last_turn": int(memory.turn_range.last_turn),
            }
            if memory.HasField("turn_range")
            else None
        ),
        "metadata": dict(sorted(memory.metadata.items())),
        "embedding_model": embedding_model,
        "updated_at": format_ts(updated_at),
    }
    payload["content_hash"] = content_hash(payload)
    payload["embed_hash"] = embed_hash(index_key(memory, created_at), embedding_model)
    return payload


def content_hash(payload: dict[str, Any]) -> str:
    content = {name: payload.get(name) for name in CONTENT_FIELDS}
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def embed_hash(text: str, model_id: str) -> str:
    return hashlib.sha256(f"{model_id}\x1f{text}".encode()).hexdigest()


def payload_to_memory(point_id: str, payload: dict[str, Any]) -> pb.Memory:
    memory = pb.Memory(
        id=point_id,
        tenant=payload.get("tenant", ""),
        user_id=payload.get("user_id", ""),
        conversation_id=payload.get("conversation_id", ""),
        kind=KIND_BY_NAME.get(payload.get("kind", ""), pb.MEMORY_KIND_UNSPECIFIED),
        text=payload.get("text", ""),
        role=payload.get("role", ""),
        source_id=payload.get("source_id", ""),
        turn_index=int(payload.get("turn_index") or 0),
        source_turn_ids=list(payload.get("source_turn_ids") or []),
        superseded_by=payload.get("superseded_by") or "",
        tags=list(payload.get("tags") or []),
        embedding_model=payload.get("embedding_model", ""),
        metadata=dict(payload.get("metadata") or {}),
    )
    for name in ("created_at", "valid_from", "valid_to", "updated_at"):
        value = payload.get(name)
        if value:
            getattr(memory, name).CopyFrom(to_timestamp(parse_ts(value)))
    profile = payload.get("profile")
    if profile:
        memory.profile.CopyFrom(pb.ProfileEntry(**profile))
    turn_range = payload.get("turn_range")
    if turn_range:
        memory.turn_range.CopyFrom(pb.TurnRange(**turn_range))
    return memory
