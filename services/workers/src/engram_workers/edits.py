"""Edits worker: human edits of the mirror reach the index.

Consumes ``engram.memory.edited.v1`` (durable consumer ``edits``), which the file
mirror's watcher publishes:

- ``upserted`` → retrieval ``Upsert`` of the memory as the file states it (retrieval
  re-embeds when the text changed), then ``Get`` for the stored state;
- ``deleted`` → ``Get`` (the last state, for the tombstone), then ``Delete``: an
  explicit user deletion removes the data from the index; the mirror keeps the
  tombstone.

Either way it publishes ``engram.memory.changed.v1`` (cause ``mirror-edit``) so the
mirror converges on the canonical file; writing identical content is a no-op there,
so an edit never loops. The follow-up event's id derives from the edit's, so a
redelivered edit publishes nothing new.
"""

from __future__ import annotations

import grpc
from pydantic import Field

from engram_core.events import MemoryChanged, MemoryEdited, deterministic_event_id
from engram_core.logging import get_logger
from engram_core.memory import MemoryRecord
from engram_core.memory_record import record_from_pb, record_to_pb
from engram_core.proto import pb
from engram_workers.runtime import Delivery, WorkerSettings, WorkerSpec, rpc_failure, run_worker

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


async def apply_edit(event: MemoryEdited, delivery: Delivery) -> None:
    if event.op == "upserted":
        op, state = await _upsert(event, delivery)
    else:
        op, state = "deleted", await _delete(event, delivery)
    changed = MemoryChanged(
        event_id=deterministic_event_id("memory.changed", CAUSE, event.event_id),
        tenant=event.tenant,
        user_id=state.user_id,
        conversation_id=state.conversation_id,
        op=op,  # type: ignore[arg-type]
        memory=state,
        cause=CAUSE,
    )
    await delivery.worker.publish(changed)


async def _upsert(event: MemoryEdited, delivery: Delivery) -> tuple[str, MemoryRecord]:
    memory = record_to_pb(event.memory, tenant=event.tenant)
    memory.ClearField("updated_at")  # the service's to set
    memory.ClearField("embedding_model")
    try:
        reply = await delivery.retrieval.upsert(
            pb.UpsertRequest(tenant=event.tenant, memories=[memory])
        )
        stored = await delivery.retrieval.get(pb.GetRequest(tenant=event.tenant, ids=[memory.id]))
    except grpc.aio.AioRpcError as exc:
        raise rpc_failure("retrieval Upsert", exc) from exc
    status = reply.results[0].status if reply.results else pb.UPSERT_STATUS_UNSPECIFIED
    state = record_from_pb(stored.memories[0]) if stored.memories else event.memory
    if state.superseded_by:
        op = "superseded"
    elif status == pb.UPSERT_STATUS_CREATED:
        op = "created"
    else:
        op = "updated"
    log.info(
        "edit.applied",
        op="upserted",
        memory_id=memory.id,
        kind=event.memory.kind,
        status=pb.UpsertStatus.Name(status),
        path=event.path,
    )
    return op, state


async def _delete(event: MemoryEdited, delivery: Delivery) -> MemoryRecord:
    memory_id = event.memory.id
    try:
        found = await delivery.retrieval.get(pb.GetRequest(tenant=event.tenant, ids=[memory_id]))
        reply = await delivery.retrieval.delete(
            pb.DeleteRequest(tenant=event.tenant, ids=[memory_id])
        )
    except grpc.aio.AioRpcError as exc:
        raise rpc_failure("retrieval Delete", exc) from exc
    # The index's last state makes the tombstone; the file's last committed state is the
    # fallback (already deleted by an earlier delivery, or never indexed).
    state = record_from_pb(found.memories[0]) if found.memories else event.memory
    log.info(
        "edit.applied",
        op="deleted",
        memory_id=memory_id,
        deleted=bool(reply.deleted_ids),
        path=event.path,
    )
    return state


EDITS = WorkerSpec(name="edits", event=MemoryEdited, handle=apply_edit)


def main() -> None:
    run_worker(EDITS, EditsSettings)


if __name__ == "__main__":
    main()
