"""Every event on the bus, its subject and the stream that holds it — defined once.

Events are pydantic models with a common envelope. The publisher sets
``Nats-Msg-Id = event_id`` so JetStream de-duplicates a re-publish, and handlers
derive memory ids deterministically from event content so a redelivery never
creates a duplicate.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

STREAM_NAME = "ENGRAM"
STREAM_SUBJECTS = ("engram.>",)
#: JetStream de-duplicates messages with the same Nats-Msg-Id inside this window.
DUPLICATE_WINDOW_S = 120.0
DLQ_PREFIX = "engram.dlq"

DEFAULT_CONVERSATION = "default"

NonEmpty = Annotated[str, StringConstraints(min_length=1)]


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_event_id() -> str:
    return str(uuid.uuid4())


class Event(BaseModel):
    """The envelope every event carries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subject: ClassVar[str]

    event_id: NonEmpty = Field(default_factory=new_event_id)
    type: str
    schema_version: int = 1
    occurred_at: datetime = Field(default_factory=utcnow)
    tenant: NonEmpty
    user_id: str = ""
    conversation_id: NonEmpty = DEFAULT_CONVERSATION


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


ALL_EVENTS: tuple[type[Event], ...] = (TurnPersisted,)


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
