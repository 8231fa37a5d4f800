"""Every event on the bus, its subject and the stream that holds it — defined once.

Events are pydantic models with a common envelope. The publisher sets
``Nats-Msg-Id = event_id`` so JetStream de-duplicates a re-publish, and handlers
derive memory ids deterministically from event content so a redelivery never
creates a duplicate.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from engram_core import ids
from engram_core.memory import (
    DEFAULT_CONVERSATION,
    KIND_NAMES,
    MemoryRecord,
    NonEmpty,
    ProposedProfileFact,
)

STREAM_NAME = "ENGRAM"
STREAM_SUBJECTS = ("engram.>",)
DLQ_PREFIX = "engram.dlq"


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_event_id() -> str:
    return str(uuid.uuid4())


class Event(BaseModel):
    """The envelope every event carries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The event's subject; for an event published on one subject per kind of content
    #: (:class:`MemoryChanged`), the subject its subjects extend, which names it in
    #: span names, logs and docs.
    subject: ClassVar[str]

    event_id: NonEmpty = Field(default_factory=new_event_id)
    type: str
    schema_version: int = 1
    occurred_at: datetime = Field(default_factory=utcnow)
    tenant: NonEmpty
    user_id: str = ""
    conversation_id: NonEmpty = DEFAULT_CONVERSATION

    @property
    def published_subject(self) -> str:
        """The subject this event is published on."""
        return self.subject

    @classmethod
    def consumed_subjects(cls) -> tuple[str, ...]:
        """Every subject that carries this event (a consumer of all of them filters on these)."""
        return (cls.subject,)

    @classmethod
    def subjects_wildcard(cls) -> str:
        """One subject filter matching every subject this event may be published on (for
        a reader of all of them; it may match a later version's too)."""
        return cls.subject


class TurnPersisted(Event):
    """A user or assistant message the gateway saw; published before the turn is used."""

    subject: ClassVar[str] = "engram.turn.persisted.v1"

    type: Literal["turn.persisted"] = "turn.persisted"
    turn_id: NonEmpty = Field(description="Stable id of this turn (the memory id derives from it).")
    role: Literal["user", "assistant"]
    text: str
    created_at: datetime = Field(default_factory=utcnow)
    model: str = Field(default="", description="The chat model that produced / received the turn.")
    request_id: str = Field(default="", description="The gateway request the turn belongs to.")
    source_id: str = Field(
        default="", description="External id of the turn, if the caller has one."
    )
    turn_index: int = Field(
        default=0,
        ge=0,
        description="Position of the turn in its conversation (user and assistant "
        "messages counted), as the client's history shows it; 0 when unknown.",
    )
    reextract: bool = Field(
        default=False,
        description="Learn from a turn that is already stored (engram reextract): extract "
        "its facts again instead of taking it for a repeat.",
    )
    memory_id: str = Field(
        default="",
        description="The stored turn this event is about (a re-extraction of a turn imported "
        "in bulk); empty: the id derives from turn_id.",
    )
    followed: bool | None = Field(
        default=None,
        description="Someone follows this event's status (POST /v1/memories/add registered "
        "it in ENGRAM_EVENTS): the worker updates it. False: nobody does, and the worker "
        "reads nothing there; None (an event from before this field): the worker checks.",
    )


def dlq_subject(worker: str) -> str:
    """Dead-letter subject for one worker: ``engram.dlq.<worker>``."""
    return f"{DLQ_PREFIX}.{worker}"


class DeadLetter(BaseModel):
    """What a worker writes to its dead-letter subject: the original bytes and why."""

    model_config = ConfigDict(extra="forbid")

    worker: str
    subject: str
    reason: str
    deliveries: int
    original_headers: dict[str, str] = Field(default_factory=dict)
    original_body: str = Field(description="The original payload, decoded as UTF-8 (replaced).")
    failed_at: datetime = Field(default_factory=utcnow)


# --- the learning write path ---------------------------------------------------------


class FactProposed(Event):
    """Facts the ingest worker extracted from one user turn, for reconcile to apply."""

    subject: ClassVar[str] = "engram.fact.proposed.v1"

    type: Literal["fact.proposed"] = "fact.proposed"
    source_turn_id: NonEmpty = Field(description="Memory id of the user turn.")
    source_id: str = Field(default="", description="The turn's external id, if any.")
    turn_created_at: datetime
    facts: list[NonEmpty] = Field(default_factory=list, max_length=3)
    profile: list[ProposedProfileFact] = Field(default_factory=list)
    model: str = Field(default="", description="The chat model of the turn (LLM fallback).")
    followed: bool | None = Field(
        default=None,
        description="Someone follows this proposal's status (its turn was followed, so "
        "ingest registered it in ENGRAM_EVENTS): the worker updates it. False: nobody does, "
        "and the worker reads nothing there; None (an event from before this field): the "
        "worker checks.",
    )


MemoryChangeOp = Literal["created", "updated", "superseded", "deleted", "evicted"]
MEMORY_CHANGE_OPS: tuple[MemoryChangeOp, ...] = get_args(MemoryChangeOp)


class MemoryChanged(Event):
    """One applied change to the index. ``memory`` is the state after the change
    (for ``deleted``/``evicted``: the state just before removal).

    Published on ``engram.memory.changed.v1.<kind>.<op>`` so a worker subscribes to the
    changes it acts on and is never delivered the rest (summarize and evict ignore most
    kinds and ops). Changes published before subjects per kind are on the bare
    ``engram.memory.changed.v1``, and so are changes published while a consumer from
    before still filters on it only (:class:`engram_core.bus.ChangeSubjects`); every
    consumer keeps that subject too, so neither is lost."""

    subject: ClassVar[str] = "engram.memory.changed.v1"

    type: Literal["memory.changed"] = "memory.changed"
    op: MemoryChangeOp
    memory: MemoryRecord
    cause: str = Field(
        default="", description="Who/why: ingest, reconcile:ADD, reconcile:UPDATE, evict, ..."
    )
    related_ids: list[str] = Field(
        default_factory=list,
        description="Other memories involved, e.g. the fact that superseded this one.",
    )

    @property
    def published_subject(self) -> str:
        return memory_changed_subject(self.memory.kind, self.op)

    @classmethod
    def consumed_subjects(cls) -> tuple[str, ...]:
        return (cls.subject, f"{cls.subject}.>")

    @classmethod
    def subjects_wildcard(cls) -> str:
        # the bare subject (while a consumer from before filters on it only) and the
        # kinds' subjects both
        return f"{cls.subject.rpartition('.')[0]}.>"

    @classmethod
    def subjects_where(cls, wanted: Callable[[str, MemoryChangeOp], bool]) -> tuple[str, ...]:
        """The subjects of the changes a consumer acts on (``wanted(kind, op)``), and the
        bare subject of changes published before subjects per kind."""
        return (
            cls.subject,
            *(
                memory_changed_subject(kind, op)
                for kind in KIND_NAMES
                for op in MEMORY_CHANGE_OPS
                if wanted(kind, op)
            ),
        )


def memory_changed_subject(kind: str, op: MemoryChangeOp) -> str:
    """``engram.memory.changed.v1.<kind>.<op>``: where a change of this kind is published."""
    return f"{MemoryChanged.subject}.{kind}.{op}"


MemoryEditOp = Literal["upserted", "deleted"]


class MemoryEdited(Event):
    """A human edited, created or deleted a memory's Markdown file in the mirror."""

    subject: ClassVar[str] = "engram.memory.edited.v1"

    type: Literal["memory.edited"] = "memory.edited"
    op: MemoryEditOp
    memory: MemoryRecord = Field(description="For 'deleted', the last known state.")
    path: str = Field(description="The file, relative to the mirror root.")


ALL_EVENTS: tuple[type[Event], ...] = (TurnPersisted, FactProposed, MemoryChanged, MemoryEdited)


def event_subject(subject: str) -> str:
    """The event subject a published subject belongs to (``engram.memory.changed.v1``
    for ``engram.memory.changed.v1.fact.created``); any other subject as it is. Span
    names and metrics say this, so they do not multiply by kind and op."""
    for event in ALL_EVENTS:
        if subject == event.subject or subject.startswith(f"{event.subject}."):
            return event.subject
    return subject


#: The CLI's ``engram reextract`` still names it here (the ids live in engram_core.ids).
deterministic_event_id = ids.event_id
