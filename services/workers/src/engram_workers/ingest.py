"""Ingest worker: every persisted turn becomes an indexed ``turn`` memory.

Consumes ``engram.turn.persisted.v1`` (durable consumer ``ingest``) and upserts the
turn through the retrieval service. The memory id is derived from the turn itself, so
a redelivered or re-published turn overwrites the same point instead of adding one.

Fact extraction from user turns (DESIGN §7) comes after indexing, in
:func:`index_turn`: it will call the extraction model and publish
``engram.fact.proposed.v1`` through ``delivery.worker.publish``.
"""

from __future__ import annotations

import uuid

import grpc
from pydantic import Field

from engram_core.events import TurnPersisted
from engram_core.logging import get_logger
from engram_core.proto import pb, to_timestamp
from engram_workers.runtime import Delivery, WorkerSettings, WorkerSpec, rpc_failure, run_worker

log = get_logger(__name__)

#: Fixed forever: changing it would give every stored turn a new id.
TURN_ID_NAMESPACE = uuid.UUID("6f1d3c52-8a57-4f55-9a0e-2f1e8a5b7c31")


class IngestSettings(WorkerSettings):
    health_port: int = Field(
        default=8201, ge=0, le=65535, description="Port of /healthz and /readyz; 0 disables."
    )


def turn_memory_id(tenant: str, conversation_id: str, turn_id: str) -> str:
    """The point id of a turn: the same turn always maps to the same memory."""
    # Joined with the ASCII unit separator, which ids do not contain, so ("a.b", "c")
    # and ("a", "b.c") stay distinct.
    return str(uuid.uuid5(TURN_ID_NAMESPACE, "\x1f".join((tenant, conversation_id, turn_id))))


def turn_memory(event: TurnPersisted) -> pb.Memory:
    metadata = {"turn_id": event.turn_id, "event_id": event.event_id}
    if event.model:
        metadata["model"] = event.model
    if event.request_id:
        metadata["request_id"] = event.request_id
    return pb.Memory(
        id=turn_memory_id(event.tenant, event.conversation_id, event.turn_id),
        tenant=event.tenant,
        user_id=event.user_id,
        conversation_id=event.conversation_id,
        kind=pb.MEMORY_KIND_TURN,
        role=event.role,
        text=event.text,
        created_at=to_timestamp(event.created_at),
        source_id=event.source_id,
        metadata=metadata,
    )


async def index_turn(event: TurnPersisted, delivery: Delivery) -> None:
    if not event.text.strip():
        # Nothing to search for; a tool-call-only assistant turn, for example.
        log.info("turn.skipped", reason="empty text", turn_id=event.turn_id, role=event.role)
        return
    memory = turn_memory(event)
    try:
        reply = await delivery.retrieval.upsert(
            pb.UpsertRequest(tenant=event.tenant, memories=[memory])
        )
    except grpc.aio.AioRpcError as exc:
        raise rpc_failure("retrieval Upsert", exc) from exc
    status = pb.UpsertStatus.Name(reply.results[0].status) if reply.results else "UNREPORTED"
    log.info(
        "turn.indexed",
        memory_id=memory.id,
        turn_id=event.turn_id,
        role=event.role,
        status=status,
    )


INGEST = WorkerSpec(name="ingest", event=TurnPersisted, handle=index_turn)


def main() -> None:
    run_worker(INGEST, IngestSettings)


if __name__ == "__main__":
    main()
