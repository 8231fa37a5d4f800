"""The memory lifecycle, in one place: how a memory is superseded, edited, kept as
history, marked as corrected, and how each change is announced.

Pure functions on :class:`~engram_core.memory.MemoryRecord` (no I/O). Every writer —
ingest, reconcile, summarize, evict, edits and the gateway's memory API — calls these
instead of writing its own rules, so a correction means the same thing whoever makes it:

- **supersede**: the old version keeps its text and gets ``superseded_by`` and
  ``valid_to``; it leaves default search and stays as history. Nothing is destroyed.
- **edit**: the edited id stays the current version (``valid_from`` = the edit); the
  state before the edit is kept as a **history version** under a new id derived from
  that state, superseded by the edited id.
- **correct**: when a fact or profile entry (:mod:`engram_core.kinds`:
  ``corrects_source_turns``) is superseded, deleted or its text edited,
  the turns it came from are marked ``corrected_by`` / ``corrected_at`` in their
  metadata. Search demotes such turns and the gateway injects them only as labelled
  history ("earlier, corrected on …"), so a statement that was corrected never
  outranks the fact that replaced it.
- **announce**: every applied change is one ``memory.changed`` event whose id derives
  from (tenant, memory id, op, the stored state), so a writer that repeats itself after a
  crash re-publishes the same id (JetStream drops the copy) and a new state is always a
  new event.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from engram_core import ids
from engram_core.events import MemoryChanged, MemoryChangeOp
from engram_core.kinds import kind_policy
from engram_core.memory import MemoryRecord

#: Metadata keys of a corrected turn.
CORRECTED_BY = "corrected_by"  # the memory that holds the corrected information ("" if none)
CORRECTED_AT = "corrected_at"  # ISO 8601, when the correction was made
#: Metadata key of a history version: the id it is an earlier version of.
HISTORY_OF = "history_of"

#: The CLI's ``engram migrate`` still names it here (the ids live in engram_core.ids).
summary_memory_id = ids.summary_memory_id


def _float32(value: float) -> float:
    # Profile scores travel as float32; compare them as the store gives them back.
    (as_float32,) = struct.unpack("f", struct.pack("f", value))
    return round(float(as_float32), 6)


def canonical(record: MemoryRecord) -> dict[str, object]:
    """The record as the store gives it back: UTC timestamps, tags sorted and unique,
    float32 scores. Two descriptions of one stored state compare equal in this form."""
    data: dict[str, object] = record.model_dump(mode="json")
    for name in ("created_at", "updated_at", "valid_from", "valid_to"):
        value = getattr(record, name)
        data[name] = (
            value.astimezone(UTC).isoformat(timespec="microseconds") if value is not None else None
        )
    data["tags"] = sorted(set(record.tags))
    if record.profile is not None:
        data["profile"] = {
            **record.profile.model_dump(),
            "confidence": _float32(record.profile.confidence),
            "importance": _float32(record.profile.importance),
        }
    return data


def state_digest(record: MemoryRecord) -> str:
    """A digest of everything the record says, bookkeeping included."""
    blob = json.dumps(canonical(record), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def superseded(record: MemoryRecord, *, by: str, at: datetime) -> MemoryRecord:
    """``record`` replaced by the memory ``by`` at ``at``: kept, out of default search."""
    return record.model_copy(
        update={
            "superseded_by": by,
            "valid_to": at,
            "valid_from": record.valid_from or record.created_at,
            "updated_at": None,
        }
    )


def history_version(tenant: str, current: MemoryRecord, *, at: datetime) -> MemoryRecord:
    """The state of ``current`` just before an edit, kept as a superseded copy under an id
    derived from that state (a repeated edit of the same state makes the same copy)."""
    return current.model_copy(
        update={
            "id": ids.history_version_id(tenant, current.id, state_digest(current)),
            "superseded_by": current.id,
            "valid_to": at,
            "valid_from": current.valid_from or current.created_at,
            "metadata": {**current.metadata, HISTORY_OF: current.id},
            "updated_at": None,
        }
    )


def edited(
    current: MemoryRecord,
    *,
    at: datetime,
    cause: str,
    text: str | None = None,
    tags: Sequence[str] | None = None,
) -> MemoryRecord:
    """``current`` with a new text and/or tags; still the current version."""
    update: dict[str, object] = {
        "valid_from": at,
        "valid_to": None,
        "metadata": {**current.metadata, "edited_by": cause},
        "updated_at": None,
    }
    if text is not None:
        update["text"] = text
    if tags is not None:
        update["tags"] = list(dict.fromkeys(tags))
    return current.model_copy(update=update)


def text_changed(before: MemoryRecord, after: MemoryRecord) -> bool:
    return " ".join(before.text.split()) != " ".join(after.text.split())


def corrects_its_turns(before: MemoryRecord, after: MemoryRecord | None) -> bool:
    """Whether changing ``before`` into ``after`` (None: deleted, or superseded) makes the
    turns it came from outdated: a fact or profile entry (a kind that
    ``corrects_source_turns``) that is gone or says something else now."""
    if not kind_policy(before.kind).corrects_source_turns or not before.source_turn_ids:
        return False
    return after is None or not after.is_current or text_changed(before, after)


def is_corrected(metadata: dict[str, str]) -> bool:
    return bool(metadata.get(CORRECTED_AT))


def corrected(turn: MemoryRecord, *, by: str, at: datetime) -> MemoryRecord | None:
    """``turn`` marked as corrected by ``by`` (the memory that now holds the information,
    "" when it was retracted), or None when it is already marked or no chat message."""
    if not kind_policy(turn.kind).chat_message or is_corrected(turn.metadata):
        return None
    stamp = at.isoformat().replace("+00:00", "Z")
    return turn.model_copy(
        update={
            "metadata": {**turn.metadata, CORRECTED_BY: by, CORRECTED_AT: stamp},
            "updated_at": None,
        }
    )


def source_turn_ids(records: Iterable[MemoryRecord]) -> list[str]:
    """The turns the records came from, each once, in order."""
    return list(dict.fromkeys(t for r in records for t in r.source_turn_ids))


def change_event_id(tenant: str, record: MemoryRecord, op: MemoryChangeOp) -> str:
    return ids.memory_changed_event_id(tenant, record.id, op, state_digest(record))


def change(
    tenant: str,
    record: MemoryRecord,
    op: MemoryChangeOp,
    *,
    cause: str,
    related: Iterable[str] = (),
) -> MemoryChanged:
    """The announcement of one applied change; ``record`` is the stored state (for
    ``deleted``/``evicted``: the state just before removal)."""
    return MemoryChanged(
        event_id=change_event_id(tenant, record, op),
        tenant=tenant,
        user_id=record.user_id,
        conversation_id=record.conversation_id,
        op=op,
        memory=record,
        cause=cause,
        related_ids=list(related),
    )
