"""Ingest worker: every persisted turn becomes an indexed ``turn`` memory, and every
user turn is mined for facts.

Consumes ``engram.turn.persisted.v1`` (durable consumer ``ingest``) and upserts the
turn through the retrieval service. The memory id is derived from the turn itself, so
a redelivered or re-published turn overwrites the same point instead of adding one.
A new turn is announced on ``engram.memory.changed.v1``.

User turns (never assistant ones) then go through one ``extract_facts`` LLM call
(:mod:`engram_workers.extraction`); when it finds facts or profile facts, they are
published as ``engram.fact.proposed.v1`` for the reconcile worker. Both follow-up
events have ids derived from the turn, so a retry publishes nothing twice.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from pydantic import Field

from engram_core.event_status import EventStatusStore
from engram_core.event_status import record_status as record_event_status
from engram_core.events import MemoryChanged, TurnPersisted, deterministic_event_id
from engram_core.logging import get_logger
from engram_core.memory_record import record_from_pb
from engram_core.proto import pb, to_timestamp
from engram_workers import extraction
from engram_workers.llm import (
    LlmClient,
    LlmOutputError,
    LlmRequestError,
    LlmSettingsMixin,
    LlmUnavailable,
)
from engram_workers.runtime import (
    Delivery,
    PermanentError,
    RetryableError,
    Worker,
    WorkerSettings,
    WorkerSpec,
    rpc_failure,
    run_worker,
)

log = get_logger(__name__)

#: Fixed forever: changing it would give every stored turn a new id.
TURN_ID_NAMESPACE = uuid.UUID("6f1d3c52-8a57-4f55-9a0e-2f1e8a5b7c31")


class IngestSettings(WorkerSettings, LlmSettingsMixin):
    health_port: int = Field(
        default=8201, ge=0, le=65535, description="Port of /healthz and /readyz; 0 disables."
    )
    extraction_enabled: bool = Field(
        default=True, description="Extract facts from user turns (one LLM call per turn)."
    )
    extraction_model: str = Field(
        default="",
        description="Model for fact extraction; empty: the turn's chat model, then "
        "ENGRAM_LLM_MODEL.",
    )
    extraction_context_turns: int = Field(
        default=4,
        ge=0,
        le=20,
        description="Earlier turns shown to the extraction model to resolve references.",
    )


@dataclass(frozen=True)
class IngestResources:
    settings: IngestSettings
    llm: LlmClient | None  # None when extraction is disabled
    statuses: EventStatusStore | None = None  # followed events (POST /v1/memories/add)


@asynccontextmanager
async def ingest_resources(worker: Worker[Any]) -> AsyncIterator[IngestResources]:
    settings: IngestSettings = worker.settings  # type: ignore[assignment]
    llm = LlmClient(settings) if settings.extraction_enabled else None
    try:
        async with EventStatusStore.connect(
            settings.nats_url, replicas=settings.stream_replicas
        ) as statuses:
            yield IngestResources(settings=settings, llm=llm, statuses=statuses)
    finally:
        if llm is not None:
            await llm.close()


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
        turn_index=event.turn_index,
        metadata=metadata,
    )


def turn_changed(
    event: TurnPersisted, memory: pb.Memory, status: int, attempt: int
) -> MemoryChanged | None:
    """The ``memory.changed`` announcement of an indexed turn, or None when there is
    nothing new to say.

    CREATED → ``created``; UPDATED (the same turn re-published under another event id)
    → ``updated``. UNCHANGED on a redelivery → ``created`` again: the earlier attempt
    may have stopped before publishing, and the deterministic event id lets JetStream
    drop the copy if it did not.
    """
    if status == pb.UPSERT_STATUS_UPDATED:
        op, event_id = "updated", deterministic_event_id(memory.id, "updated", event.event_id)
    elif status == pb.UPSERT_STATUS_CREATED or attempt > 1:
        op, event_id = "created", deterministic_event_id(memory.id, "created")
    else:
        return None
    return MemoryChanged(
        event_id=event_id,
        tenant=event.tenant,
        user_id=event.user_id,
        conversation_id=event.conversation_id,
        op=op,
        memory=record_from_pb(memory),
        cause="ingest",
    )


async def index_turn(event: TurnPersisted, delivery: Delivery) -> None:
    if not event.text.strip():
        # Nothing to search for; a tool-call-only assistant turn, for example.
        log.info("turn.skipped", reason="empty text", turn_id=event.turn_id, role=event.role)
        await record_status(event, delivery)
        return
    memory = turn_memory(event)
    try:
        reply = await delivery.retrieval.upsert(
            pb.UpsertRequest(tenant=event.tenant, memories=[memory])
        )
    except grpc.aio.AioRpcError as exc:
        raise rpc_failure("retrieval Upsert", exc) from exc
    status = reply.results[0].status if reply.results else pb.UPSERT_STATUS_UNSPECIFIED
    log.info(
        "turn.indexed",
        memory_id=memory.id,
        turn_id=event.turn_id,
        role=event.role,
        status=pb.UpsertStatus.Name(status),
    )
    changed = turn_changed(event, memory, status, delivery.attempt)
    if changed is not None:
        await delivery.worker.publish(changed)

    resources: IngestResources | None = delivery.resources
    proposed = False
    if event.role == "user" and resources is not None and resources.llm is not None:
        proposed = await extract_and_propose(event, memory.id, delivery, resources)
    if not proposed:
        await record_status(event, delivery)


async def record_status(event: TurnPersisted, delivery: Delivery, follow_up: str = "") -> None:
    """A followed turn (``POST /v1/memories/add``) is applied, or waits for ``follow_up``.
    Best effort: a status store that stays unreachable never holds back the facts."""
    statuses = getattr(delivery.resources, "statuses", None)
    if statuses is None:
        return
    await record_event_status(
        statuses,
        event.tenant,
        event.event_id,
        follow_up=follow_up,
        budget_s=delivery.worker.retry_policy.publish_retry_s,
    )


async def extract_and_propose(
    event: TurnPersisted, memory_id: str, delivery: Delivery, resources: IngestResources
) -> bool:
    """Extract facts from a user turn and publish them (True when something was
    proposed); the turn is indexed already, so a retry (LLM unavailable) only repeats
    this part in effect."""
    llm = resources.llm
    assert llm is not None
    settings = resources.settings
    model = settings.extraction_model or event.model or llm.default_model
    if not model:
        log.warning("extraction.skipped", reason="no model configured", memory_id=memory_id)
        return False
    context = await extraction.recent_context(
        delivery.retrieval, event, memory_id, settings.extraction_context_turns
    )
    try:
        facts, profile = await extraction.extract(
            llm, model=model, message=event.text, date=event.created_at, context=context
        )
    except LlmUnavailable as exc:
        raise RetryableError(f"extraction: {exc}") from exc
    except LlmOutputError as exc:
        # The client already re-asked; the raw turn stays searchable.
        log.warning("extraction.gave_up", memory_id=memory_id, model=model, error=str(exc))
        return False
    except LlmRequestError as exc:
        # A refused request (bad key, unknown model) will not pass next time either:
        # dead-letter so the turn can be re-driven once the configuration is fixed.
        raise PermanentError(f"extraction: {exc}") from exc
    log.info("extraction.done", memory_id=memory_id, facts=len(facts), profile=len(profile))
    if not facts and not profile:
        return False
    proposal = extraction.fact_proposed(event, memory_id, facts, profile)
    # Followed before it is published, so reconcile never finishes an unfollowed one.
    await record_status(event, delivery, follow_up=proposal.event_id)
    await delivery.worker.publish(proposal)
    return True


INGEST = WorkerSpec(
    name="ingest", event=TurnPersisted, handle=index_turn, resources=ingest_resources
)


def main() -> None:
    run_worker(INGEST, IngestSettings)


if __name__ == "__main__":
    main()
