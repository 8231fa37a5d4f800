"""Dead letters on the ``ENGRAM`` stream: list them, count them, replay them, drop them.

A worker that gives up on a message publishes a :class:`~engram_core.events.DeadLetter`
to ``engram.dlq.<worker>`` (the original subject, headers and bytes, and why) and
terminates the original. This module is what an operator (``engram dlq``) and the
gateway's read-only admin endpoints use to see and re-drive them.

- **Listing** walks the dead-letter subjects with JetStream's "next message by subject"
  lookups: no consumer is created, so a read leaves nothing behind on the server.
  Filters: worker, original subject, reason (substring), age, tenant (read from the
  original body; a body that does not parse has no tenant and matches no tenant filter).
- **Replay** publishes the original bytes to the original subject with the original
  headers, ``Nats-Msg-Id`` = the original event id, then deletes the dead letter. A
  replay is idempotent: a second replay of the same letter is dropped by JetStream as a
  duplicate, and one that lands after the duplicate window is handled idempotently by
  the worker (its ids derive from the event). While the *original* message is still
  inside the duplicate window, JetStream would drop the replay as a copy of it; the
  replay is then published as ``<event id>:replay:<dead letter id>`` so the worker
  does get it (still once, whoever replays it how often).
- **Drop** deletes dead letters from the stream.

A dead letter's id is its stream sequence number.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from nats.js import JetStreamContext
from nats.js.api import PubAck, RawStreamMsg
from nats.js.errors import APIError, NotFoundError
from pydantic import ValidationError

from engram_core.events import (
    DLQ_PREFIX,
    STREAM_NAME,
    DeadLetter,
    dlq_subject,
    event_subject,
    utcnow,
)
from engram_core.retry import retry_transient

ALL_DEAD_LETTERS = f"{DLQ_PREFIX}.>"
#: Header a replayed message carries: the id of the dead letter it came from.
REPLAY_HEADER = "Engram-Replay-Of"
MSG_ID_HEADER = "Nats-Msg-Id"


@dataclass(frozen=True)
class StoredDeadLetter:
    """One dead letter as stored: its id (stream sequence), the letter, and what the
    original body says about whose it is."""

    id: int
    letter: DeadLetter
    #: Nats-Msg-Id of the dead letter itself, ``<worker>:<stream seq of the original>``.
    letter_msg_id: str = ""

    @property
    def worker(self) -> str:
        return self.letter.worker

    @property
    def original(self) -> dict[str, object]:
        """The original body as JSON (empty when it is not a JSON object)."""
        try:
            value = json.loads(self.letter.original_body)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    @property
    def tenant(self) -> str | None:
        tenant = self.original.get("tenant")
        return tenant if isinstance(tenant, str) and tenant else None

    @property
    def conversation_id(self) -> str | None:
        value = self.original.get("conversation_id")
        return value if isinstance(value, str) and value else None

    @property
    def event_id(self) -> str | None:
        """The original event id: its ``Nats-Msg-Id``, else the body's ``event_id``."""
        header = self.letter.original_headers.get(MSG_ID_HEADER)
        if header:
            return header
        value = self.original.get("event_id")
        return value if isinstance(value, str) and value else None

    @property
    def original_seq(self) -> int | None:
        """Stream sequence of the message that was dead-lettered, when known."""
        _, _, seq = self.letter_msg_id.rpartition(":")
        return int(seq) if seq.isdigit() else None

    def age(self, now: datetime) -> timedelta:
        return now - self.letter.failed_at


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters to select; every field left ``None`` matches everything."""

    worker: str | None = None
    #: The original subject (``engram.turn.persisted.v1``), or the event subject it
    #: extends (``engram.memory.changed.v1`` matches ``engram.memory.changed.v1.fact.created``).
    subject: str | None = None
    #: A substring of the reason, case-insensitive.
    reason: str | None = None
    #: At least / at most this old (from ``failed_at``).
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    tenant: str | None = None

    def matches(self, stored: StoredDeadLetter, now: datetime) -> bool:
        letter = stored.letter
        if self.worker is not None and letter.worker != self.worker:
            return False
        if self.subject is not None and self.subject not in (
            letter.subject,
            event_subject(letter.subject),
        ):
            return False
        if self.reason is not None and self.reason.lower() not in letter.reason.lower():
            return False
        age = stored.age(now)
        if self.older_than is not None and age < self.older_than:
            return False
        if self.newer_than is not None and age > self.newer_than:
            return False
        return self.tenant is None or stored.tenant == self.tenant

    @property
    def stream_subject(self) -> str:
        return dlq_subject(self.worker) if self.worker else ALL_DEAD_LETTERS


class ReplayOutcome(StrEnum):
    REPLAYED = "replayed"  # published: the worker will handle it
    ALREADY_REPLAYED = "already_replayed"  # an earlier replay landed; dropped as a duplicate


def _parse(raw: RawStreamMsg) -> StoredDeadLetter | None:
    try:
        letter = DeadLetter.model_validate_json(raw.data or b"")
    except ValidationError:
        return None  # not written by a worker; listing skips it, drop by id still works
    headers = raw.headers or {}
    return StoredDeadLetter(
        id=int(raw.seq or 0), letter=letter, letter_msg_id=str(headers.get(MSG_ID_HEADER, ""))
    )


async def _next(js: JetStreamContext, subject: str, seq: int) -> RawStreamMsg | None:
    try:
        return await js.get_msg(STREAM_NAME, seq=seq, subject=subject, next=True)
    except NotFoundError:
        return None


async def iter_dead_letters(
    js: JetStreamContext, flt: DeadLetterFilter | None = None, *, now: datetime | None = None
) -> AsyncIterator[StoredDeadLetter]:
    """Matching dead letters, oldest first."""
    flt = flt or DeadLetterFilter()
    now = now or utcnow()
    seq = 1
    while (raw := await _next(js, flt.stream_subject, seq)) is not None:
        seq = int(raw.seq or seq) + 1
        stored = _parse(raw)
        if stored is not None and flt.matches(stored, now):
            yield stored


async def list_dead_letters(
    js: JetStreamContext, flt: DeadLetterFilter | None = None, *, limit: int | None = None
) -> list[StoredDeadLetter]:
    """Up to ``limit`` matching dead letters, oldest first."""
    found: list[StoredDeadLetter] = []
    async for stored in iter_dead_letters(js, flt):
        found.append(stored)
        if limit is not None and len(found) >= limit:
            break
    return found


async def get_dead_letter(js: JetStreamContext, letter_id: int) -> StoredDeadLetter | None:
    try:
        raw = await js.get_msg(STREAM_NAME, seq=letter_id)
    except NotFoundError:
        return None
    if not (raw.subject or "").startswith(f"{DLQ_PREFIX}."):
        return None
    return _parse(raw)


async def dead_letter_depth(js: JetStreamContext) -> dict[str, int]:
    """Dead letters stored per worker (every tenant), from the stream's subject counts."""
    try:
        info = await js.stream_info(STREAM_NAME, subjects_filter=ALL_DEAD_LETTERS)
    except NotFoundError:
        return {}
    prefix = f"{DLQ_PREFIX}."
    return {
        subject.removeprefix(prefix): int(count)
        for subject, count in (info.state.subjects or {}).items()
    }


def _replay_headers(stored: StoredDeadLetter, msg_id: str) -> dict[str, str]:
    # Nats-* headers are instructions to the server (expected sequence, TTL, ...) that
    # were meant for the original publish; only the id is carried over, deliberately.
    headers = {
        name: value
        for name, value in stored.letter.original_headers.items()
        if not name.lower().startswith("nats-")
    }
    headers[MSG_ID_HEADER] = msg_id
    headers[REPLAY_HEADER] = str(stored.id)
    return headers


async def _publish_copy(
    js: JetStreamContext, stored: StoredDeadLetter, msg_id: str, retry_s: float
) -> tuple[bool, int]:
    """Publish the original bytes (retried like every publish, with the same id);
    (stored as new, the stream sequence it has)."""

    async def once() -> PubAck:
        return await js.publish(
            stored.letter.subject,
            stored.letter.original_body.encode("utf-8"),
            stream=STREAM_NAME,
            headers=_replay_headers(stored, msg_id),
        )

    ack = await retry_transient(once, budget_s=retry_s)
    return (not ack.duplicate, int(ack.seq))


async def replay_dead_letter(
    js: JetStreamContext, stored: StoredDeadLetter, *, retry_s: float = 0.0
) -> ReplayOutcome:
    """Re-publish the original message, then delete the dead letter. ``retry_s``:
    ``ENGRAM_PUBLISH_RETRY_S``."""
    msg_id = stored.event_id or f"dlq:{stored.id}"
    fresh, seq = await _publish_copy(js, stored, msg_id, retry_s)
    if not fresh and seq == stored.original_seq:
        # JetStream still remembers the original itself (inside the duplicate window),
        # which the worker already gave up on: publish under an id of this replay.
        fresh, seq = await _publish_copy(js, stored, f"{msg_id}:replay:{stored.id}", retry_s)
    await drop_dead_letter(js, stored.id)
    return ReplayOutcome.REPLAYED if fresh else ReplayOutcome.ALREADY_REPLAYED


async def drop_dead_letter(js: JetStreamContext, letter_id: int) -> bool:
    """Delete one dead letter; False when it was already gone."""
    try:
        return bool(await js.delete_msg(STREAM_NAME, letter_id))
    except NotFoundError:
        return False
    except APIError:
        # The server answers a missing sequence with one of several errors
        # ("sequence n not found", "stream store EOF"): look before deciding.
        if await _exists(js, letter_id):
            raise
        return False


async def _exists(js: JetStreamContext, seq: int) -> bool:
    try:
        await js.get_msg(STREAM_NAME, seq=seq)
    except NotFoundError:
        return False
    return True


def summary_counts(letters: list[StoredDeadLetter]) -> Mapping[str, int]:
    """Dead letters per worker."""
    counts: dict[str, int] = {}
    for stored in letters:
        counts[stored.worker] = counts.get(stored.worker, 0) + 1
    return counts
