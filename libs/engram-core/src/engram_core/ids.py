"""Every deterministic id in Engram: the uuid5 namespaces and the functions that derive
ids from what a thing is, so a redelivered event, a retried request or a re-sent turn
maps to the same memory or event instead of a duplicate.

The namespaces are fixed forever: every stored memory, history version and event id
was derived from them, and changing one would re-key what is stored (tests/unit/
test_ids.py pins each value and one id per function). Parts are joined with the ASCII
unit separator, which ids and names do not contain, so ("a.b", "c") and ("a", "b.c")
stay distinct. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence

from engram_core.memory import DEFAULT_CONVERSATION, MemoryRecord, ProposedProfileFact
from engram_core.near_duplicates import normalise_text
from engram_core.timestamps import format_utc

#: Point ids the retrieval service derives for memories written without one.
MEMORY_NAMESPACE = uuid.UUID("6f1c1d0e-3f5e-5a57-9d8e-656e6772616d")
#: History versions and ``memory.changed`` event ids (engram_core.lifecycle).
LIFECYCLE_NAMESPACE = uuid.UUID("3f0e7d1c-5a8b-4c2e-9f61-6c6966656379")
#: The rolling summary of a conversation.
SUMMARY_NAMESPACE = uuid.UUID("0b5c0a8e-6d1f-5f7a-9b2e-73756d6d6172")
#: Event ids derived from their content (a re-publish is de-duplicated).
EVENT_NAMESPACE = uuid.UUID("6f1d3c52-2b8e-4f0e-9a51-0c7e2f0d9a11")
#: The gateway's turns, their events, and memories created through the memory API.
GATEWAY_NAMESPACE = uuid.UUID("5b0f4d4e-7c1a-4a53-9c64-2a1f0e9d6c11")
#: Turn memories (the ingest worker).
TURN_NAMESPACE = uuid.UUID("6f1d3c52-8a57-4f55-9a0e-2f1e8a5b7c31")
#: Facts and profile entries (the reconcile worker).
FACT_NAMESPACE = uuid.UUID("0b7e3a56-5c2d-4f1e-8f43-7265636f6e63")
#: Episodes (the summarize worker).
EPISODE_NAMESPACE = uuid.UUID("0b5c0a8e-6d1f-5f7a-9b2e-657069736f64")


def _uuid5(namespace: uuid.UUID, *parts: str) -> str:
    return str(uuid.uuid5(namespace, "\x1f".join(parts)))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def normalize_id(raw: str) -> str | None:
    """The canonical form of a UUID id, or None when ``raw`` is not one."""
    try:
        return str(uuid.UUID(raw))
    except (ValueError, AttributeError, TypeError):
        return None


# --- memories written without an id (retrieval) ------------------------------------------


def identity_text(text: str, profile: ProposedProfileFact | None) -> str:
    """What a memory says, as its id sees it: its text, or ``category/key=value``. Not the
    display text (:attr:`MemoryRecord.display_text`): ids derived from this form are stored."""
    if text:
        return text
    if profile is not None:
        return f"{profile.category}/{profile.key}={profile.value}"
    return ""


def memory_id(tenant: str, record: MemoryRecord) -> str:
    """uuid5 over (tenant, conversation, kind, role, source_id or text[, created_at]);
    ``record.id`` takes no part.

    created_at takes part only when there is no source_id and the caller set it, so the
    same sentence said twice at different times is two memories, while a re-sent turn
    with the same source_id is the same memory.
    """
    parts = [tenant, record.conversation_id or DEFAULT_CONVERSATION, record.kind, record.role]
    if record.source_id:
        parts.append("source:" + record.source_id)
    else:
        parts.append("text:" + identity_text(record.text, record.profile))
        if record.created_at is not None:
            parts.append("at:" + format_utc(record.created_at))
    return _uuid5(MEMORY_NAMESPACE, *parts)


# --- the gateway --------------------------------------------------------------------------


def turn_id(tenant: str, user_id: str, conversation_id: str, key: str, role: str) -> str:
    """A chat turn: who said it where, and its key (engram_gateway.turns)."""
    return _uuid5(GATEWAY_NAMESPACE, "turn.v2", tenant, user_id, conversation_id, key, role)


def turn_event_id(turn: str, text: str) -> str:
    """The text takes part: a regenerated reply (same turn, new text) is a new event."""
    return str(uuid.uuid5(GATEWAY_NAMESPACE, f"turn.persisted/{turn}/{_digest(text)}"))


def created_memory_id(tenant: str, request_id: str) -> str:
    """A memory created through the API, from the request id: a retry with the same
    X-Request-Id creates nothing new."""
    return str(uuid.uuid5(GATEWAY_NAMESPACE, f"memory.create/{tenant}/{request_id}"))


# --- events and lifecycle ---------------------------------------------------------------


def event_id(*parts: str) -> str:
    """An event id derived from its content, so a re-publish is de-duplicated."""
    return _uuid5(EVENT_NAMESPACE, *parts)


def history_version_id(tenant: str, memory_id: str, state_digest: str) -> str:
    """The history version of one state of a memory (the same state, the same version)."""
    return _uuid5(LIFECYCLE_NAMESPACE, "history", tenant, memory_id, state_digest)


def memory_changed_event_id(tenant: str, memory_id: str, op: str, state_digest: str) -> str:
    return _uuid5(LIFECYCLE_NAMESPACE, "memory.changed", tenant, memory_id, op, state_digest)


def summary_memory_id(tenant: str, user_id: str, conversation_id: str) -> str:
    """The one rolling summary of a user's conversation. Without a user the id is the one
    summaries had before conversations belonged to users, so single-user stores keep
    their summary; a user's summary written before then is re-keyed by ``engram migrate
    scopes`` (search attaches only the summary with this id)."""
    parts = (tenant, conversation_id) if not user_id else (tenant, conversation_id, user_id)
    return _uuid5(SUMMARY_NAMESPACE, *parts)


# --- the workers --------------------------------------------------------------------------


def turn_memory_id(tenant: str, conversation_id: str, turn_id: str) -> str:
    """The point id of a turn: the same turn always maps to the same memory."""
    return _uuid5(TURN_NAMESPACE, tenant, conversation_id, turn_id)


def fact_memory_id(
    tenant: str, user_id: str, conversation_id: str, text: str, reasserted_in: str = ""
) -> str:
    """The id of a fact: the same statement in one user's conversation is one memory.

    ``reasserted_in`` (a turn memory id) gives a new version of a statement that was
    true, was superseded, and is true again; the old version keeps its history.
    """
    parts = [tenant, user_id, conversation_id or DEFAULT_CONVERSATION, "fact"]
    parts.append(normalise_text(text))
    if reasserted_in:
        parts.append(reasserted_in)
    return _uuid5(FACT_NAMESPACE, *parts)


def profile_memory_id(
    tenant: str, user_id: str, category: str, key: str, value: str, reasserted_in: str = ""
) -> str:
    parts = [tenant, user_id, "profile", category, key, normalise_text(value)]
    if reasserted_in:
        parts.append(reasserted_in)
    return _uuid5(FACT_NAMESPACE, *parts)


def episode_memory_id(tenant: str, conversation_id: str, turn_ids: Sequence[str]) -> str:
    """An episode is named by the turns it covers: the same window, the same point."""
    return _uuid5(EPISODE_NAMESPACE, tenant, conversation_id, ",".join(sorted(turn_ids)))
