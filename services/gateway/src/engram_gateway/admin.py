"""Read-only operator views of the write path, for the memory browser's operator panel:
the workers' queues (``GET /v1/admin/consumers``) and the dead letters
(``GET /v1/admin/dead-letters``).

Both show what every tenant shares: queue numbers (pending, awaiting an ack,
redelivered) are the JetStream consumers' own, and dead letters are every tenant's
(each names its tenant, read from the letter's original body; ``?tenant=`` selects
one). So every route here needs an admin key (403 otherwise; engram_gateway.tenancy);
a tenant's ordinary key learns nothing about the others, not even how busy they are.
Replaying and dropping dead letters is an operator's job (``engram dlq``), not an API
call.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict, Field

from engram_core.api_models import ErrorResponse
from engram_core.bus import consumer_filters
from engram_core.dead_letters import (
    DeadLetterFilter,
    StoredDeadLetter,
    dead_letter_depth,
    iter_dead_letters,
)
from engram_core.events import STREAM_NAME, event_subject
from engram_core.logging import get_logger
from engram_gateway.deps import AppState
from engram_gateway.errors import SERVICE_UNAVAILABLE, GatewayError
from engram_gateway.keys import TENANT_PATTERN
from engram_gateway.state import GatewayState
from engram_gateway.tenancy import require_admin

log = get_logger(__name__)

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "Invalid query parameter"),
        (401, "Missing or invalid API key"),
        (403, "The key is not an admin key"),
        (408, "The request did not arrive in time"),
        (503, "The event bus is unavailable"),
    )
}
router = APIRouter(
    prefix="/v1/admin", tags=["admin"], responses=_ERRORS, dependencies=[Depends(require_admin)]
)

WorkerName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
TenantName = Annotated[str, Field(min_length=1, max_length=64, pattern=TENANT_PATTERN.pattern)]


class ConsumerOut(BaseModel):
    worker: str = Field(description="The durable consumer (= worker) name.")
    subject: str = Field(
        description="The event it consumes, by its subject (engram.memory.changed.v1 for a "
        "worker of memory changes, whichever kinds and changes it takes)."
    )
    subjects: list[str] = Field(
        default_factory=list, description="The subjects its consumer filters on, exactly."
    )
    pending: int = Field(description="Messages not yet delivered to it (its lag).")
    ack_pending: int = Field(description="Delivered, not yet acknowledged (in work or retry).")
    redelivered: int = Field(description="Messages delivered more than once, now pending.")
    dead_letters: int = Field(description="This worker's dead letters (every tenant's).")


class ConsumerList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ConsumerOut]


class DeadLetterOut(BaseModel):
    id: int = Field(description="The dead letter's stream sequence (engram dlq takes it).")
    worker: str
    tenant: str | None = Field(description="Whose event it was (None: the body does not parse).")
    subject: str = Field(description="The subject of the message that failed.")
    reason: str
    deliveries: int
    failed_at: datetime
    event_id: str | None
    conversation_id: str | None


class DeadLetterList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DeadLetterOut] = Field(description="Oldest first.")


class DeadLetterQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker: WorkerName | None = None
    tenant: TenantName | None = Field(default=None, description="Only this tenant's.")
    limit: int = Field(default=100, ge=1, le=1000)


def _bus_unavailable() -> GatewayError:
    return GatewayError(
        503,
        "The event bus is unavailable; retry later.",
        type=SERVICE_UNAVAILABLE,
        code="event_bus_unavailable",
    )


def _jetstream(state: GatewayState) -> JetStreamContext:
    if not state.publisher.is_connected():
        raise _bus_unavailable()
    return state.broker.connection.jetstream(timeout=5.0)


async def _letters(
    js: JetStreamContext,
    tenant: str | None = None,
    worker: str | None = None,
    limit: int | None = None,
) -> list[StoredDeadLetter]:
    found: list[StoredDeadLetter] = []
    async for stored in iter_dead_letters(js, DeadLetterFilter(worker=worker, tenant=tenant)):
        found.append(stored)
        if limit is not None and len(found) >= limit:
            break
    return found


def _consumer_out(info: ConsumerInfo, dead: int) -> ConsumerOut:
    subjects = consumer_filters(info.config)
    return ConsumerOut(
        worker=info.name,
        subject=event_subject(subjects[0]) if subjects else "",
        subjects=subjects,
        pending=int(info.num_pending or 0),
        ack_pending=int(info.num_ack_pending or 0),
        redelivered=int(info.num_redelivered or 0),
        dead_letters=dead,
    )


@router.get("/consumers", response_model=ConsumerList, summary="The workers' queues")
async def consumers(state: AppState) -> JSONResponse:
    js = _jetstream(state)
    try:
        infos = await js.consumers_info(STREAM_NAME)
        per_worker = await dead_letter_depth(js)
    except NotFoundError:  # no stream yet: no workers either
        infos, per_worker = [], {}
    except Exception as exc:
        log.warning("admin.consumers_unavailable", error=type(exc).__name__)
        raise _bus_unavailable() from None
    # Durable consumers only: ephemeral readers (a CLI listing, a test) are not workers.
    durable = sorted((i for i in infos if i.config.durable_name), key=lambda i: i.name)
    data = [_consumer_out(info, per_worker.get(info.name, 0)) for info in durable]
    return JSONResponse(ConsumerList(data=data).model_dump(mode="json"))


@router.get("/dead-letters", response_model=DeadLetterList, summary="Every tenant's dead letters")
async def dead_letters(state: AppState, query: Annotated[DeadLetterQuery, Query()]) -> JSONResponse:
    js = _jetstream(state)
    try:
        letters = await _letters(js, query.tenant, query.worker, query.limit)
    except NotFoundError:
        letters = []
    except Exception as exc:
        log.warning("admin.dead_letters_unavailable", error=type(exc).__name__)
        raise _bus_unavailable() from None
    data = [
        DeadLetterOut(
            id=stored.id,
            worker=stored.worker,
            tenant=stored.tenant,
            subject=stored.letter.subject,
            reason=stored.letter.reason,
            deliveries=stored.letter.deliveries,
            failed_at=stored.letter.failed_at,
            event_id=stored.event_id,
            conversation_id=stored.conversation_id,
        )
        for stored in letters
    ]
    return JSONResponse(DeadLetterList(data=data).model_dump(mode="json"))
