"""Read-only admin views of the write path, for the memory browser: the workers' queues
(``GET /v1/admin/consumers``) and the caller's dead letters (``GET /v1/admin/dead-letters``).

Queue numbers (pending, awaiting an ack, redelivered) are the JetStream consumers' own
and shared by every tenant; they carry no memory content. Dead letters are the
caller's only: a letter's original body names its tenant, and a letter of another
tenant (or one whose body does not parse) is never shown nor counted. Replaying and
dropping dead letters is an operator's job (``engram dlq``), not an API call.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict, Field

from engram_core.dead_letters import DeadLetterFilter, StoredDeadLetter, iter_dead_letters
from engram_core.events import STREAM_NAME
from engram_core.logging import get_logger
from engram_gateway.errors import SERVICE_UNAVAILABLE, GatewayError
from engram_gateway.memory_models import ErrorResponse
from engram_gateway.state import GatewayState, gateway_state
from engram_gateway.tenancy import resolve_tenant

log = get_logger(__name__)

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "Invalid query parameter"),
        (401, "Missing or invalid API key"),
        (408, "The request did not arrive in time"),
        (503, "The event bus is unavailable"),
    )
}
router = APIRouter(prefix="/v1/admin", tags=["admin"], responses=_ERRORS)

WorkerName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class ConsumerOut(BaseModel):
    worker: str = Field(description="The durable consumer (= worker) name.")
    subject: str = Field(description="The subject it consumes.")
    pending: int = Field(description="Messages not yet delivered to it (its lag).")
    ack_pending: int = Field(description="Delivered, not yet acknowledged (in work or retry).")
    redelivered: int = Field(description="Messages delivered more than once, now pending.")
    dead_letters: int = Field(description="The caller's dead letters of this worker.")


class ConsumerList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ConsumerOut]


class DeadLetterOut(BaseModel):
    id: int = Field(description="The dead letter's stream sequence (engram dlq takes it).")
    worker: str
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


async def _tenant_letters(
    js: JetStreamContext, tenant: str, worker: str | None = None, limit: int | None = None
) -> list[StoredDeadLetter]:
    found: list[StoredDeadLetter] = []
    async for stored in iter_dead_letters(js, DeadLetterFilter(worker=worker, tenant=tenant)):
        found.append(stored)
        if limit is not None and len(found) >= limit:
            break
    return found


def _consumer_out(info: ConsumerInfo, dead: int) -> ConsumerOut:
    return ConsumerOut(
        worker=info.name,
        subject=info.config.filter_subject or "",
        pending=int(info.num_pending or 0),
        ack_pending=int(info.num_ack_pending or 0),
        redelivered=int(info.num_redelivered or 0),
        dead_letters=dead,
    )


@router.get("/consumers", response_model=ConsumerList, summary="The workers' queues")
async def consumers(request: Request) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    js = _jetstream(state)
    try:
        infos = await js.consumers_info(STREAM_NAME)
        letters = await _tenant_letters(js, tenant)
    except NotFoundError:  # no stream yet: no workers either
        infos, letters = [], []
    except Exception as exc:
        log.warning("admin.consumers_unavailable", error=type(exc).__name__)
        raise _bus_unavailable() from None
    per_worker: dict[str, int] = {}
    for stored in letters:
        per_worker[stored.worker] = per_worker.get(stored.worker, 0) + 1
    # Durable consumers only: ephemeral readers (a CLI listing, a test) are not workers.
    durable = sorted((i for i in infos if i.config.durable_name), key=lambda i: i.name)
    data = [_consumer_out(info, per_worker.get(info.name, 0)) for info in durable]
    return JSONResponse(ConsumerList(data=data).model_dump(mode="json"))


@router.get("/dead-letters", response_model=DeadLetterList, summary="The caller's dead letters")
async def dead_letters(
    request: Request, query: Annotated[DeadLetterQuery, Query()]
) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    js = _jetstream(state)
    try:
        letters = await _tenant_letters(js, tenant, query.worker, query.limit)
    except NotFoundError:
        letters = []
    except Exception as exc:
        log.warning("admin.dead_letters_unavailable", error=type(exc).__name__)
        raise _bus_unavailable() from None
    data = [
        DeadLetterOut(
            id=stored.id,
            worker=stored.worker,
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
