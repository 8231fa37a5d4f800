"""The memory API's request and response bodies (JSON, in the OpenAPI schema), shared by
the gateway, which validates requests and builds answers with them, and the Python
client (engram_client), which sends and parses them: one definition, so the two cannot
drift.

Requests forbid unknown fields, so a typo is a 400 naming the field instead of a
silently ignored knob. Inputs name scopes ``user`` and ``conversation`` (as the chat
uses ``user`` and ``memory_id``); memories come back as stored, with ``user_id`` and
``conversation_id``. The scalar types of the scopes and the memory knobs (a user id's
one spelling, a conversation id fit for a directory name, strict numbers) are defined
here too; the gateway's chat controls use the same ones.
"""

from __future__ import annotations

import unicodedata
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    WithJsonSchema,
)

from engram_core.kinds import kind_names
from engram_core.memory import DEFAULT_CONVERSATION, MemoryKindName, MemoryRecord
from engram_core.timestamps import RANGE_TEXT, StorableDatetime


def _conversation_id(value: str) -> str:
    # It names a directory in the Markdown mirror: no separators, dot-files or controls.
    if any(ch in value for ch in "/\\") or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("must not contain '/', '\\' or control characters")
    if value.startswith("."):
        raise ValueError("must not start with '.'")
    return value


ConversationId = Annotated[
    str, Field(min_length=1, max_length=200), AfterValidator(_conversation_id)
]
# The memory knobs' types, for the chat's controls and the memory API's search alike:
# strict, so "5", true or false are refused rather than read as 5, 1 or 0.
TopK = Annotated[int, Strict(), Field(ge=1, le=100)]
# Tokens of the memory message a chat may be given; 0: no budget (top_k hits).
MaxTokens = Annotated[int, Strict(), Field(ge=0, le=100_000)]
Fraction = Annotated[float, Strict(), Field(ge=0, le=1)]
Switch = Annotated[bool, Strict()]

MAX_USER_CHARS = 256


def normalize_user_id(value: str) -> str:
    """The one spelling of a user id: NFC, trimmed; ``""`` (no user) stays ``""``.

    ``ValueError`` for a blank (whitespace-only) id, one over :data:`MAX_USER_CHARS`
    characters, or one holding control characters."""
    if not value:
        return ""
    if len(value) > 4 * MAX_USER_CHARS:  # before normalising: bounded work for any input
        raise ValueError(f"must be at most {MAX_USER_CHARS} characters")
    user = unicodedata.normalize("NFC", value).strip()
    if not user:
        raise ValueError("must not be blank: omit it, or send '' for no user")
    if len(user) > MAX_USER_CHARS:
        raise ValueError(f"must be at most {MAX_USER_CHARS} characters")
    if any(unicodedata.category(ch) == "Cc" for ch in user):
        raise ValueError("must not contain control characters")
    return user


#: What the OpenAPI schema says of a user id (the validator says the rest).
USER_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "maxLength": MAX_USER_CHARS,
    "description": "A user id, compared after Unicode NFC and trimming; '' is no user, a "
    "blank one is refused.",
}
UserId = Annotated[str, AfterValidator(normalize_user_id), WithJsonSchema(USER_ID_SCHEMA)]


def canonical_uuid(value: str, what: str = "memory") -> str:
    """``value`` as a lower-case hyphenated UUID; ``ValueError`` (in the memory API's
    words) when it is not one. Whatever builds a URL from an id (the MCP tools) checks it
    first, so no id can carry a ``/``, ``..`` or ``?`` into a path."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ValueError(f"{value[:64]!r} is not a valid {what} id (a UUID)") from None


MemoryId = Annotated[
    str,
    Field(min_length=1, max_length=64, description="The memory's id (a UUID)."),
    AfterValidator(canonical_uuid),
]


Tag = Annotated[
    str,
    StringConstraints(
        strip_whitespace=True, min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]+$"
    ),
]
Tags = Annotated[list[Tag], Field(max_length=32)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


_CONVERSATION_DEFAULT = (
    "With a user: 'default'. Without one: 'global', the tenant-wide bucket recalled for "
    "every user of the tenant."
)


class CreateMemory(_Request):
    text: str = Field(description="The fact, as it should be recalled.")
    tags: Tags = Field(default_factory=list)
    user: UserId = Field(
        default="", description="The user it belongs to (empty: no user, tenant-wide)."
    )
    conversation: ConversationId | None = Field(default=None, description=_CONVERSATION_DEFAULT)
    created_at: StorableDatetime | None = Field(
        default=None, description=f"Default: now. From {RANGE_TEXT}."
    )


class UpdateMemory(_Request):
    text: str | None = Field(default=None, description="New text (re-embedded).")
    tags: Tags | None = Field(default=None, description="Replaces the tags.")


class SearchMemories(_Request):
    query: str = Field(min_length=1)
    user: UserId = Field(
        default="", description="Whose memories (empty: no user); recall as that user's chat."
    )
    conversation: ConversationId = DEFAULT_CONVERSATION
    # The chat's memory knobs, validated by the same (strict) types.
    memory_top_k: TopK | None = None
    memory_recency_weight: Fraction | None = None
    memory_score_threshold: Fraction | None = None
    memory_mmr_lambda: Fraction | None = None
    kinds: list[MemoryKindName] = Field(
        default_factory=list,
        description="Empty: " + ", ".join(kind_names(lambda k: k.searched_by_default)) + ".",
    )
    include_superseded: Switch = False


class AddMemories(_Request):
    text: str | Annotated[list[str], Field(min_length=1, max_length=100)] = Field(
        description="One text, or several (each becomes one user turn, in order)."
    )
    user: UserId = Field(
        default="", description="The user it belongs to (empty: no user, tenant-wide)."
    )
    conversation: ConversationId | None = Field(default=None, description=_CONVERSATION_DEFAULT)
    created_at: StorableDatetime | None = Field(
        default=None, description=f"Default: now. From {RANGE_TEXT}."
    )
    model: str = Field(
        default="",
        max_length=200,
        description="Model for extraction when the workers have none configured.",
    )


class ListQuery(_Request):
    conversation: ConversationId | None = None
    user: UserId | None = Field(
        default=None, description="Only this user's memories ('' selects those with no user)."
    )
    kind: list[MemoryKindName] = Field(default_factory=list, description="Any of these kinds.")
    tag: list[Tag] = Field(default_factory=list, description="Any of these tags.")
    include_superseded: bool = False
    limit: int = Field(default=50, ge=1, le=500)
    cursor: str | None = Field(
        default=None,
        max_length=4000,
        description="next_cursor of the previous page; it carries that page's filters.",
    )
    created_after: StorableDatetime | None = Field(
        default=None, description="Only memories created at or after this instant."
    )
    created_before: StorableDatetime | None = Field(
        default=None, description="Only memories created before this instant."
    )


# --- responses -------------------------------------------------------------------------


class MemoryOut(MemoryRecord):
    object: Literal["memory"] = "memory"


class CreatedMemory(MemoryOut):
    duplicate_of: str | None = Field(
        default=None,
        description="Set (to this memory's id) when the fact was already stored in this "
        "scope: the existing memory is returned (200) and nothing new is created.",
    )


class MemoryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[MemoryOut]
    has_more: bool
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page.")


class MemoryHistory(BaseModel):
    object: Literal["list"] = "list"
    id: str
    data: list[MemoryOut] = Field(description="Superseded versions, oldest first.")


class DeletedMemory(BaseModel):
    object: Literal["memory.deleted"] = "memory.deleted"
    id: str
    deleted: bool = True
    deleted_ids: list[str] = Field(description="The memory and its history versions.")


class Scores(BaseModel):
    dense: float
    sparse: float | None
    relevance: float
    recency: float
    total: float
    mmr: float


class SearchHit(MemoryOut):
    score: float
    scope: str | None
    scores: Scores


class SearchResult(BaseModel):
    object: Literal["memory.search"] = "memory.search"
    outcome: str
    hits: list[SearchHit]
    summary: MemoryOut | None = Field(description="The conversation's rolling summary.")
    profile: list[MemoryOut] = Field(description="The user's active profile entries.")


class Accepted(BaseModel):
    object: Literal["memory.add"] = "memory.add"
    status: Literal["pending"] = "pending"
    event_ids: list[str] = Field(description="Follow each with GET /v1/events/{id}.")


class EventOut(BaseModel):
    object: Literal["event"] = "event"
    id: str
    status: Literal["pending", "applied", "skipped"] = Field(
        description="skipped: the text was stored, but no facts were learned from it (reason)."
    )
    stage: Literal["ingest", "reconcile"] | None = Field(
        description="While pending: indexing + extraction, or reconciling the facts found."
    )
    reason: str | None = Field(default=None, description="Why it was skipped.")
    fallback: str | None = Field(
        default=None,
        description="Set when a worker task took its documented fallback instead of the "
        "model's answer (which task, and why): reconcile's adds the facts as they were.",
    )
    accepted_at: datetime | None
    applied_at: datetime | None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail
