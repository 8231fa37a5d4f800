"""The memory domain: what a memory is, who it belongs to, how a read selects memories and
what a search returns. Plain pydantic models and dataclasses: no I/O and no protobuf
(:mod:`engram_core.memory_port` converts at the gRPC edge), so every service and the
pure rules in :mod:`engram_core.lifecycle` work on these types.

Scopes. Every memory belongs to a tenant and carries ``user_id`` and ``conversation_id``.
A conversation belongs to one user: the pair (user, conversation) is the conversation
scope, so two users who pick the same conversation id (or send none: ``default``) never
recall each other's memories. ``user_id == ""`` is "no user": chats that send no ``user``
are recorded there. The one exception is the tenant-wide bucket: memories with no user in
the ``global`` conversation are recalled for every user of the tenant; the memory API and
the mirror put memories there when they are created without a user.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

DEFAULT_CONVERSATION = "default"
#: With no user: the tenant-wide bucket, recalled for every user of the tenant.
GLOBAL_CONVERSATION = "global"

NonEmpty = Annotated[str, StringConstraints(min_length=1)]
MemoryKindName = Literal["turn", "fact", "profile", "summary", "episode"]
KIND_NAMES: tuple[MemoryKindName, ...] = ("turn", "fact", "profile", "summary", "episode")
ProfileCategory = Literal["identity", "preference", "constraint", "instruction"]
ScopeName = Literal["conversation", "user", "global"]


class ProposedProfileFact(BaseModel):
    """A structured ``category/key = value`` about the user (a profile entry)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    category: ProfileCategory
    key: NonEmpty
    value: NonEmpty
    confidence: float = Field(ge=0.0, le=1.0)
    importance: float = Field(default=0.5, ge=0.0, le=1.0)


class MemoryRecord(BaseModel):
    """One memory, as every service works with it (events carry it too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: NonEmpty
    kind: MemoryKindName
    text: str
    role: str = ""
    user_id: str = ""
    conversation_id: NonEmpty = DEFAULT_CONVERSATION
    created_at: datetime | None = None
    updated_at: datetime | None = None
    source_id: str = ""
    turn_index: int = 0
    source_turn_ids: list[str] = Field(default_factory=list)
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    superseded_by: str = ""
    tags: list[str] = Field(default_factory=list)
    profile: ProposedProfileFact | None = None
    turn_range: tuple[int, int] | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    @property
    def is_current(self) -> bool:
        """Not replaced by a newer version (superseded ones are history)."""
        return not self.superseded_by

    @property
    def is_tenant_wide(self) -> bool:
        return is_tenant_wide(self.user_id, self.conversation_id)

    @property
    def display_text(self) -> str:
        """What it says, as a reader sees it (and as it is embedded): its text, or
        ``category key: value`` for a profile entry without one."""
        if self.text:
            return self.text
        if self.profile is not None:
            return profile_display_text(self.profile.category, self.profile.key, self.profile.value)
        return ""

    @property
    def speaker(self) -> str:
        """Who said a chat message when an import named them (``metadata["speaker"]``,
        a LoCoMo transcript's ``Gina``); "" otherwise, and the role says who."""
        return self.metadata.get("speaker", "").strip()

    @property
    def spoken_text(self) -> str:
        """Its words without the leading ``"<speaker>: "`` an imported turn repeats: what
        retrieval indexes after the speaker's name and the memory message quotes after
        ``<speaker> said:``."""
        speaker = self.speaker
        text = self.display_text
        return text.removeprefix(f"{speaker}: ") if speaker else text


def profile_display_text(category: str, key: str, value: str) -> str:
    """A profile entry as a reader sees it (the one form: search, the index, the API)."""
    return f"{category} {key}: {value}".strip()


def is_tenant_wide(user_id: str, conversation_id: str) -> bool:
    """Whether (user, conversation) is the tenant-wide bucket."""
    return not user_id and conversation_id == GLOBAL_CONVERSATION


@dataclass(frozen=True)
class MemoryFilter:
    """Which memories a List or Count sees. Unset fields (None, empty) do not constrain.

    ``user_id``: None is any user; ``""`` is exactly the memories with no user.
    """

    user_id: str | None = None
    conversation_id: str | None = None
    kinds: tuple[MemoryKindName, ...] = ()
    tags: tuple[str, ...] = ()  # any of
    source_ids: tuple[str, ...] = ()  # any of
    role: str | None = None
    include_superseded: bool = False
    # created_at window (browsing by date): created_after <= created_at < created_before.
    created_after: datetime | None = None
    created_before: datetime | None = None


@dataclass
class Page:
    records: list[MemoryRecord]
    next_token: str = ""  # empty on the last page
    #: The embedding model of each record, by id (the service's, not the record's).
    embedding_models: dict[str, str] = field(default_factory=dict)


class UpsertStatus(enum.StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"  # same id, same content: a no-op


@dataclass(frozen=True)
class Stored:
    """A written memory as it now stands (the store's timestamps filled in)."""

    record: MemoryRecord
    status: UpsertStatus


@dataclass(frozen=True)
class KindCounts:
    total: int
    by_kind: dict[str, int]


# --- search ---------------------------------------------------------------------------


SearchOutcome = Literal["ranked", "small_store", "nothing_relevant", "empty", "overview"]


@dataclass(frozen=True)
class SearchQuery:
    """One recall. Unset knobs (None) take the retrieval service's defaults."""

    tenant: str
    text: str
    user_id: str = ""
    conversation_id: str = DEFAULT_CONVERSATION
    top_k: int | None = None
    recency_weight: float | None = None
    score_threshold: float | None = None
    mmr_lambda: float | None = None
    scopes: tuple[ScopeName, ...] = ()  # empty: conversation, user, global
    kinds: tuple[MemoryKindName, ...] = ()  # empty: turn, fact, episode
    now: datetime | None = None
    include_superseded: bool = False
    # False: the hits only, without the conversation's summary and the user's profile
    # (two more store reads), for callers that only rank, like reconcile's duplicate check
    attachments: bool = True


@dataclass(frozen=True)
class Scores:
    dense: float
    sparse: float | None
    relevance: float
    recency: float
    total: float
    mmr: float


@dataclass(frozen=True)
class SearchHit:
    memory: MemoryRecord
    scores: Scores
    scope: ScopeName | None


@dataclass
class SearchResult:
    outcome: SearchOutcome
    hits: list[SearchHit] = field(default_factory=list)
    summary: MemoryRecord | None = None  # the conversation's rolling summary
    profile: list[MemoryRecord] = field(default_factory=list)  # the user's active entries
    candidates_considered: int = 0
    #: the retrieval service's own time for the search, ms (0: not reported)
    search_ms: float = 0.0


@dataclass(frozen=True)
class ScopeCount:
    """A user (``conversation_id`` empty) or one of a user's conversations, with how
    many memories it holds."""

    user_id: str
    conversation_id: str
    memories: int


@dataclass(frozen=True)
class ScopeList:
    scopes: list[ScopeCount]
    truncated: bool  # more scopes exist than were asked for (the largest come first)
