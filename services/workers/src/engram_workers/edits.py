"""Edits worker: human edits of the mirror reach the index, under the same lifecycle
rules as every other writer.

Consumes ``engram.memory.edited.v1`` (durable consumer ``edits``), which the file
mirror's watcher publishes, and applies it with :mod:`engram_core.memory_ops` — the
operations the memory API uses, serialised per memory with the API's changes across
processes (a lock on the bus; one still busy after ``ENGRAM_LOCK_WAIT_S``: retried):

- ``upserted`` → :meth:`~engram_core.memory_ops.MemoryOps.save`: the memory as the file
  states it is written (re-embedded when the text changed). Editing the text or tags of a
  current memory keeps the previous version as history, exactly as
  ``PATCH /v1/memories/{id}`` does, and a fact whose text changed marks the turns it came
  from as corrected;
- ``deleted`` → :meth:`~engram_core.memory_ops.MemoryOps.delete`, as
  ``DELETE /v1/memories/{id}``: the memory and its history leave the index (an explicit
  user deletion); the file's last committed state makes the tombstone when the index no
  longer has it; a deleted fact's turns are marked corrected.

Either way ``engram.memory.changed.v1`` follows (cause ``mirror-edit``), published under
the memory's lock, so the mirror converges on the canonical file; writing identical
content is a no-op there, so an edit never loops. Event ids derive from the stored state
(:mod:`engram_core.lifecycle`), so a redelivered edit publishes nothing new.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from pydantic import Field

from engram_core.events import MemoryChanged, MemoryEdited
from engram_core.locks import KeyLocks, LockSettingsMixin, LockTimeout
from engram_core.logging import get_logger
from engram_core.memory_ops import MemoryOps
from engram_core.worker_catalog import worker_entry
from engram_workers.runtime import (
    Delivery,
    RetryableError,
    Worker,
    WorkerSettings,
    WorkerSpec,
    run_worker,
)

log = get_logger(__name__)

CAUSE = "mirror-edit"


class EditsSettings(WorkerSettings, LockSettingsMixin):
    health_port: int = Field(
        default=worker_entry("edits").health_port,
        ge=0,
        le=65535,
        description="Port of /healthz and /readyz; 0 disables.",
    )
    worker_concurrency: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Edits applied at once. One keeps successive saves of a file in order.",
    )


EditsDelivery = Delivery[EditsSettings, KeyLocks]


@asynccontextmanager
async def edits_resources(
    worker: Worker[MemoryEdited, EditsSettings, KeyLocks],
) -> AsyncIterator[KeyLocks]:
    async with KeyLocks.from_settings(worker.settings, worker.settings.nats_url) as locks:
        yield locks


async def apply_edit(event: MemoryEdited, delivery: EditsDelivery) -> None:
    async def announce(events: Sequence[MemoryChanged]) -> bool:
        for changed in events:
            await delivery.worker.publish(changed)
        return True

    ops = MemoryOps(delivery.memories, delivery.resources, announce)
    try:
        if event.op == "upserted":
            outcome = await ops.save(event.tenant, event.memory, cause=CAUSE)
            history = any(
                e.op == "superseded" and e.memory.id != outcome.memory.id for e in outcome.events
            )
            log.info(
                "edit.applied",
                op="upserted",
                memory_id=outcome.memory.id,
                kind=outcome.memory.kind,
                history=history,
                path=event.path,
            )
        else:
            outcome = await ops.delete(
                event.tenant, event.memory.id, cause=CAUSE, last_known=event.memory
            )
            log.info(
                "edit.applied",
                op="deleted",
                memory_id=event.memory.id,
                deleted=len(outcome.deleted_ids),
                path=event.path,
            )
    except LockTimeout as exc:
        raise RetryableError(f"memory lock: {exc}") from exc


EDITS = WorkerSpec(name="edits", event=MemoryEdited, handle=apply_edit, resources=edits_resources)


def main() -> None:
    run_worker(EDITS, EditsSettings)


if __name__ == "__main__":
    main()
