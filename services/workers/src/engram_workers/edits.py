"""Edits worker: human edits of the mirror reach the index, under the same lifecycle
rules as every other writer.

Consumes ``engram.memory.edited.v1`` (durable consumer ``edits``), which the file
mirror's watcher publishes:

- ``upserted`` → the memory as the file states it is written through the retrieval
  port (re-embedded when the text changed). Editing the text or tags of a current memory
  keeps the previous version as history (:func:`engram_core.lifecycle.history_version`),
  exactly as ``PATCH /v1/memories/{id}`` does, and a fact whose text changed marks the
  turns it came from as corrected;
- ``deleted`` → the last state (for the tombstone), then the memory is removed from the
  index (an explicit user deletion); a deleted fact's turns are marked corrected.

Either way ``engram.memory.changed.v1`` follows (cause ``mirror-edit``) so the mirror
converges on the canonical file; writing identical content is a no-op there, so an edit
never loops. Event ids derive from the stored state (:mod:`engram_core.lifecycle`), so a
redelivered edit publishes nothing new.
"""

from __future__ import annotations

from pydantic import Field

from engram_core import lifecycle
from engram_core.events import MemoryChanged, MemoryChangeOp, MemoryEdited, utcnow
from engram_core.logging import get_logger
from engram_core.memory import MemoryRecord
from engram_core.memory_writes import Change, apply, correct_turns
from engram_workers.runtime import Delivery, WorkerSettings, WorkerSpec, run_worker

log = get_logger(__name__)

CAUSE = "mirror-edit"


class EditsSettings(WorkerSettings):
    health_port: int = Field(
        default=8206, ge=0, le=65535, description="Port of /healthz and /readyz; 0 disables."
    )
    worker_concurrency: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Edits applied at once. One keeps successive saves of a file in order.",
    )


#: The edits worker opens no resources of its own.
EditsDelivery = Delivery[EditsSettings, None]


async def apply_edit(event: MemoryEdited, delivery: EditsDelivery) -> None:
    if event.op == "upserted":
        events = await _upsert(event, delivery)
    else:
        events = await _delete(event, delivery)
    for changed in events:
        await delivery.worker.publish(changed)


def _content_changed(stored: MemoryRecord, edited: MemoryRecord) -> bool:
    return lifecycle.text_changed(stored, edited) or sorted(stored.tags) != sorted(edited.tags)


async def _upsert(event: MemoryEdited, delivery: EditsDelivery) -> list[MemoryChanged]:
    tenant, memories = event.tenant, delivery.memories
    edited = event.memory.model_copy(update={"updated_at": None})
    stored = await memories.get_one(tenant, edited.id)
    if stored is not None and stored.is_current and edited.is_current:
        if _content_changed(stored, edited):
            at = utcnow()
            old = lifecycle.history_version(tenant, stored, at=at)
            new = edited.model_copy(
                update={
                    "valid_from": at,
                    "valid_to": None,
                    "metadata": {**edited.metadata, "edited_by": CAUSE},
                }
            )
            changes = [
                Change(old, "superseded", CAUSE, (new.id,)),
                Change(new, "updated", CAUSE, (old.id,)),
            ]
        else:
            changes = [Change(edited, "updated", CAUSE)]
    else:
        op: MemoryChangeOp = (
            "superseded" if edited.superseded_by else "updated" if stored else "created"
        )
        changes = [Change(edited, op, CAUSE)]
    events = await apply(memories, tenant, changes)
    if stored is not None and lifecycle.corrects_its_turns(stored, edited):
        events += await correct_turns(
            memories, tenant, [stored], by=edited.id, at=utcnow(), cause=CAUSE
        )
    log.info(
        "edit.applied",
        op="upserted",
        memory_id=edited.id,
        kind=edited.kind,
        history=len(changes) > 1,
        path=event.path,
    )
    return events


async def _delete(event: MemoryEdited, delivery: EditsDelivery) -> list[MemoryChanged]:
    tenant, memories = event.tenant, delivery.memories
    memory_id = event.memory.id
    found = await memories.get_one(tenant, memory_id)
    deleted = await memories.delete(tenant, [memory_id])
    # The index's last state makes the tombstone; the file's last committed state is the
    # fallback (already deleted by an earlier delivery, or never indexed).
    state = found or event.memory
    events = [lifecycle.change(tenant, state, "deleted", cause=CAUSE)]
    if state.is_current and lifecycle.corrects_its_turns(state, None):
        events += await correct_turns(memories, tenant, [state], by="", at=utcnow(), cause=CAUSE)
    log.info(
        "edit.applied", op="deleted", memory_id=memory_id, deleted=bool(deleted), path=event.path
    )
    return events


EDITS = WorkerSpec(name="edits", event=MemoryEdited, handle=apply_edit)


def main() -> None:
    run_worker(EDITS, EditsSettings)


if __name__ == "__main__":
    main()
