"""The memory API: list, get, create, update, delete, history, search, add-from-text,
and the status of what was added. Tenant-scoped through :func:`resolve_tenant`;
retrieval enforces the tenant on every call, so another tenant's id is simply missing
(404, never 403: no existence oracle).

Writes change the index first and then announce the change on
``engram.memory.changed.v1`` (cause ``api``) so the Markdown mirror follows. NATS must
be connected before a write starts (503 otherwise); if the announcement itself then
fails, the change stands, the response says ``X-Engram-Mirror: not-persisted`` and an
error is logged.

Updates keep history: the previous version is copied to a new memory with
``superseded_by`` = the edited id and ``valid_to`` = now, as reconcile does when a
fact replaces another; the edited id stays the current version.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import defaultdict
from typing import Annotated, Any

import grpc
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse

from engram_core.bus import publish_event
from engram_core.events import MemoryChanged, MemoryChangeOp, deterministic_event_id, utcnow
from engram_core.logging import get_logger
from engram_core.memory_record import record_from_pb
from engram_core.proto import KIND_BY_NAME, SCOPE_NAMES, from_timestamp, pb, to_timestamp
from engram_gateway.controls import MemoryControls
from engram_gateway.errors import INVALID_REQUEST, SERVICE_UNAVAILABLE, GatewayError, bad_request
from engram_gateway.memory import hit_json, search_request
from engram_gateway.memory_models import (
    Accepted,
    AddMemories,
    CreateMemory,
    DeletedMemory,
    ErrorResponse,
    EventOut,
    ListQuery,
    MemoryHistory,
    MemoryList,
    MemoryOut,
    SearchHit,
    SearchMemories,
    SearchResult,
    UpdateMemory,
)
from engram_gateway.state import GatewayState, gateway_state, request_id
from engram_gateway.tenancy import resolve_tenant
from engram_gateway.turns import ID_NAMESPACE, TurnNotPersisted, TurnScope

log = get_logger(__name__)

CAUSE = "api"
MIRROR_HEADER = "X-Engram-Mirror"
#: History is gathered from List pages of the memory's conversation and user.
HISTORY_PAGE_SIZE = 500
MAX_HISTORY_PAGES = 20

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "Invalid request (unknown field, bad value, text too long, bad id)"),
        (401, "Missing or invalid API key"),
        (404, "No such memory or event for this tenant"),
        (503, "Retrieval or the event bus is unavailable"),
    )
}
router = APIRouter(prefix="/v1", tags=["memories"], responses=_ERRORS)

MemoryIdPath = Annotated[str, Path(description="A memory id (UUID).", max_length=64)]


# --- helpers ---------------------------------------------------------------------------


def _uuid(value: str, what: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise bad_request(
            f"{value[:64]!r} is not a valid {what} id (a UUID)", code="invalid_id"
        ) from None


def _not_found(memory_id: str) -> GatewayError:
    return GatewayError(
        404, f"No memory {memory_id}", type=INVALID_REQUEST, code="memory_not_found"
    )


def _rpc_error(call: str, exc: grpc.aio.AioRpcError) -> GatewayError:
    code = exc.code()
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return bad_request(exc.details() or f"{call}: invalid argument")
    if code == grpc.StatusCode.NOT_FOUND:
        return GatewayError(404, exc.details() or "not found", code="not_found")
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return GatewayError(409, exc.details() or "conflict", code="conflict")
    log.warning("retrieval call failed", call=call, code=code.name)
    return GatewayError(
        503,
        f"The memory store is unavailable ({call}: {code.name}); retry later.",
        type=SERVICE_UNAVAILABLE,
        code="retrieval_unavailable",
    )


async def _rpc(call: str, awaitable: Any) -> Any:
    try:
        return await awaitable
    except grpc.aio.AioRpcError as exc:
        raise _rpc_error(call, exc) from None


def _check_text(text: str, limit: int, param: str = "text") -> str:
    if not text.strip():
        raise bad_request(f"{param} must not be empty", param=param, code="empty_text")
    if len(text) > limit:
        raise bad_request(
            f"{param} is longer than {limit} characters (ENGRAM_MAX_MEMORY_CHARS)",
            param=param,
            code="text_too_long",
        )
    return text


def _out(memory: pb.Memory) -> MemoryOut:
    return MemoryOut(**record_from_pb(memory).model_dump())


def _require_bus(state: GatewayState) -> None:
    if not state.publisher.is_connected():
        raise GatewayError(
            503,
            "The event bus is unavailable, so the change could not be mirrored; nothing was "
            "changed. Retry later.",
            type=SERVICE_UNAVAILABLE,
            code="event_bus_unavailable",
        )


async def _get(state: GatewayState, tenant: str, memory_id: str) -> pb.Memory:
    reply = await _rpc("Get", state.retrieval.get(pb.GetRequest(tenant=tenant, ids=[memory_id])))
    if not reply.memories:
        raise _not_found(memory_id)
    memory: pb.Memory = reply.memories[0]
    return memory


def _changed(
    tenant: str, memory: pb.Memory, op: MemoryChangeOp, event_id: str, related: list[str]
) -> MemoryChanged:
    record = record_from_pb(memory)
    return MemoryChanged(
        event_id=event_id,
        tenant=tenant,
        user_id=record.user_id,
        conversation_id=record.conversation_id,
        op=op,
        memory=record,
        cause=CAUSE,
        related_ids=related,
    )


async def _announce(state: GatewayState, events: list[MemoryChanged]) -> dict[str, str]:
    """Publish the changes for the mirror; the response headers to add."""
    try:
        for event in events:
            await publish_event(state.broker, event)
    except Exception as exc:
        log.error(
            "memory change not announced; the mirror misses it",
            error=f"{type(exc).__name__}",
            memory_ids=[e.memory.id for e in events],
        )
        return {MIRROR_HEADER: "not-persisted"}
    return {}


def _json(model: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(model.model_dump(mode="json"), status_code=status, headers=headers)


async def _history(state: GatewayState, tenant: str, memory: pb.Memory) -> list[pb.Memory]:
    """Every superseded version that leads to ``memory`` (``superseded_by`` chains),
    oldest first. Candidates: superseded memories of the same kind in its conversation
    and of its user — where reconcile and this API put them."""
    filters = [pb.MemoryFilter(conversation_id=memory.conversation_id, kinds=[memory.kind])]
    if memory.user_id:
        filters.append(pb.MemoryFilter(user_id=memory.user_id, kinds=[memory.kind]))
    by_successor: dict[str, list[pb.Memory]] = defaultdict(list)
    seen: set[str] = set()
    for flt in filters:
        flt.include_superseded = True
        token = ""
        for _ in range(MAX_HISTORY_PAGES):
            reply = await _rpc(
                "List",
                state.retrieval.list(
                    pb.ListRequest(
                        tenant=tenant, filter=flt, page_size=HISTORY_PAGE_SIZE, page_token=token
                    )
                ),
            )
            for candidate in reply.memories:
                if candidate.superseded_by and candidate.id not in seen:
                    seen.add(candidate.id)
                    by_successor[candidate.superseded_by].append(candidate)
            token = reply.next_page_token
            if not token:
                break
    versions: list[pb.Memory] = []
    frontier, visited = [memory.id], {memory.id}
    while frontier:
        for older in by_successor.get(frontier.pop(), []):
            if older.id not in visited:
                visited.add(older.id)
                versions.append(older)
                frontier.append(older.id)

    def order(m: pb.Memory) -> tuple[str, str]:
        end = from_timestamp(m.valid_to) or from_timestamp(m.updated_at)
        start = from_timestamp(m.valid_from) or from_timestamp(m.created_at)
        return (end.isoformat() if end else "", start.isoformat() if start else "")

    return sorted(versions, key=order)


# --- reading -----------------------------------------------------------------------------


@router.get("/memories", response_model=MemoryList, summary="List memories, newest first")
async def list_memories(request: Request, query: Annotated[ListQuery, Query()]) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    flt = pb.MemoryFilter(
        user_id=query.user or "",
        conversation_id=query.conversation or "",
        kinds=[KIND_BY_NAME[k] for k in query.kind],  # type: ignore[misc]
        tags=query.tag,
        include_superseded=query.include_superseded,
    )
    _bound_created(flt, query)
    reply = await _rpc(
        "List",
        state.retrieval.list(
            pb.ListRequest(
                tenant=tenant, filter=flt, page_size=query.limit, page_token=query.cursor or ""
            )
        ),
    )
    token = reply.next_page_token or None
    return _json(
        MemoryList(data=[_out(m) for m in reply.memories], has_more=bool(token), next_cursor=token)
    )


def _bound_created(flt: pb.MemoryFilter, query: ListQuery) -> None:
    """The list's created_at window (``created_after`` inclusive, ``created_before`` not)."""
    after, before = query.created_after, query.created_before
    if after is not None and before is not None and after >= before:
        raise bad_request(
            "created_after must be earlier than created_before", param="created_after"
        )
    if query.created_after is not None:
        flt.created_after.CopyFrom(to_timestamp(query.created_after))
    if query.created_before is not None:
        flt.created_before.CopyFrom(to_timestamp(query.created_before))


@router.get("/memories/{memory_id}", response_model=MemoryOut, summary="Get one memory")
async def get_memory(request: Request, memory_id: MemoryIdPath) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    return _json(_out(await _get(state, tenant, _uuid(memory_id, "memory"))))


@router.get(
    "/memories/{memory_id}/history",
    response_model=MemoryHistory,
    summary="Superseded versions of a memory, oldest first",
)
async def memory_history(request: Request, memory_id: MemoryIdPath) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    memory = await _get(state, tenant, _uuid(memory_id, "memory"))
    versions = await _history(state, tenant, memory)
    return _json(MemoryHistory(id=memory.id, data=[_out(m) for m in versions]))


@router.post("/memories/search", response_model=SearchResult, summary="Retrieval only, no LLM")
async def search_memories(request: Request, body: SearchMemories) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    _check_text(body.query, state.settings.max_memory_chars, "query")
    controls = MemoryControls(
        memory_id=body.conversation,
        memory_top_k=body.memory_top_k,
        memory_recency_weight=body.memory_recency_weight,
        memory_score_threshold=body.memory_score_threshold,
        memory_mmr_lambda=body.memory_mmr_lambda,
    ).with_defaults(state.settings)
    search = search_request(tenant=tenant, query=body.query, user_id=body.user, controls=controls)
    search.kinds.extend(KIND_BY_NAME[k] for k in body.kinds)  # type: ignore[misc]
    search.include_superseded = body.include_superseded
    reply = await _rpc("Search", state.retrieval.search(search))
    hits = []
    for hit in reply.hits:
        flat = hit_json(hit)
        hits.append(
            SearchHit(
                **_out(hit.memory).model_dump(),
                score=flat["score"],
                scope=SCOPE_NAMES.get(hit.scope),
                scores=flat["scores"],
            )
        )
    summary = _out(reply.summary) if reply.HasField("summary") and reply.summary.id else None
    return _json(
        SearchResult(
            outcome=pb.SearchOutcome.Name(reply.outcome).removeprefix("SEARCH_OUTCOME_").lower(),
            hits=hits,
            summary=summary,
            profile=[_out(m) for m in reply.profile],
        )
    )


# --- writing -----------------------------------------------------------------------------


@router.post("/memories", status_code=201, response_model=MemoryOut, summary="Create a fact memory")
async def create_memory(request: Request, body: CreateMemory) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    text = _check_text(body.text, state.settings.max_memory_chars)
    _require_bus(state)
    created_at = body.created_at or utcnow()
    memory = pb.Memory(
        id=str(uuid.uuid4()),
        tenant=tenant,
        user_id=body.user,
        conversation_id=body.conversation,
        kind=pb.MEMORY_KIND_FACT,
        text=text,
        tags=list(dict.fromkeys(body.tags)),
        created_at=to_timestamp(created_at),
        valid_from=to_timestamp(created_at),
        metadata={"created_by": CAUSE, "request_id": request_id(request)},
    )
    await _rpc("Upsert", state.retrieval.upsert(pb.UpsertRequest(tenant=tenant, memories=[memory])))
    stored = await _get(state, tenant, memory.id)
    headers = await _announce(
        state,
        [_changed(tenant, stored, "created", deterministic_event_id(stored.id, "created"), [])],
    )
    log.info("memory created", memory_id=stored.id, conversation_id=stored.conversation_id)
    return _json(_out(stored), 201, headers)


def _history_id(tenant: str, current: pb.Memory) -> str:
    version = hashlib.sha256(current.SerializeToString(deterministic=True)).hexdigest()
    return str(uuid.uuid5(ID_NAMESPACE, f"memory.history/{tenant}/{current.id}/{version}"))


@router.patch(
    "/memories/{memory_id}",
    response_model=MemoryOut,
    summary="Edit text and/or tags; the previous version is kept as history",
)
async def update_memory(
    request: Request, memory_id: MemoryIdPath, body: UpdateMemory
) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    if body.text is None and body.tags is None:
        raise bad_request("Send text and/or tags to change.", code="nothing_to_update")
    if body.text is not None:
        _check_text(body.text, state.settings.max_memory_chars)
    current = await _get(state, tenant, _uuid(memory_id, "memory"))
    if current.superseded_by:
        raise GatewayError(
            409,
            f"Memory {current.id} is a superseded version; edit the current one "
            f"({current.superseded_by}).",
            code="memory_superseded",
        )
    text = body.text if body.text is not None else current.text
    tags = list(dict.fromkeys(body.tags)) if body.tags is not None else list(current.tags)
    if text == current.text and tags == list(current.tags):
        return _json(_out(current))
    _require_bus(state)

    now = to_timestamp(utcnow())
    old = pb.Memory()
    old.CopyFrom(current)
    old.id = _history_id(tenant, current)
    old.superseded_by = current.id
    old.valid_to.CopyFrom(now)
    if not old.HasField("valid_from"):
        old.valid_from.CopyFrom(current.created_at)
    old.metadata["history_of"] = current.id
    new = pb.Memory()
    new.CopyFrom(current)
    new.text = text
    del new.tags[:]
    new.tags.extend(tags)
    new.valid_from.CopyFrom(now)
    new.ClearField("valid_to")
    new.metadata["edited_by"] = CAUSE
    for memory in (old, new):
        memory.tenant = tenant
        memory.ClearField("updated_at")  # the service's to set
        memory.ClearField("embedding_model")
    await _rpc(
        "Upsert", state.retrieval.upsert(pb.UpsertRequest(tenant=tenant, memories=[old, new]))
    )
    reply = await _rpc(
        "Get", state.retrieval.get(pb.GetRequest(tenant=tenant, ids=[old.id, new.id]))
    )
    stored = {m.id: m for m in reply.memories}
    old, new = stored.get(old.id, old), stored.get(new.id, new)
    headers = await _announce(
        state,
        [
            _changed(
                tenant,
                old,
                "superseded",
                deterministic_event_id(old.id, "superseded", new.id),
                [new.id],
            ),
            _changed(
                tenant, new, "updated", deterministic_event_id(new.id, "updated", old.id), [old.id]
            ),
        ],
    )
    log.info("memory updated", memory_id=new.id, history_id=old.id)
    return _json(_out(new), 200, headers)


@router.delete(
    "/memories/{memory_id}",
    response_model=DeletedMemory,
    summary="Delete a memory and its history (tombstoned in the mirror)",
)
async def delete_memory(request: Request, memory_id: MemoryIdPath) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    memory = await _get(state, tenant, _uuid(memory_id, "memory"))
    _require_bus(state)
    doomed = [memory, *await _history(state, tenant, memory)]
    reply = await _rpc(
        "Delete",
        state.retrieval.delete(pb.DeleteRequest(tenant=tenant, ids=[m.id for m in doomed])),
    )
    gone = set(reply.deleted_ids)
    headers = await _announce(
        state,
        [
            _changed(tenant, m, "deleted", deterministic_event_id(m.id, "deleted", CAUSE), [])
            for m in doomed
            if m.id in gone
        ],
    )
    log.info("memory deleted", memory_id=memory.id, with_history=len(doomed) - 1)
    return _json(
        DeletedMemory(id=memory.id, deleted_ids=[m.id for m in doomed if m.id in gone]),
        200,
        headers,
    )


# --- learning from text -------------------------------------------------------------------


@router.post(
    "/memories/add",
    status_code=202,
    response_model=Accepted,
    summary="Learn from text: extraction and reconcile, asynchronously",
)
async def add_memories(request: Request, body: AddMemories) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    texts = [body.text] if isinstance(body.text, str) else body.text
    for index, text in enumerate(texts):
        _check_text(
            text, state.settings.max_memory_chars, "text" if len(texts) == 1 else f"text[{index}]"
        )
    rid = request_id(request)
    event_ids = []
    try:
        for index, text in enumerate(texts):
            scope = TurnScope(
                tenant=tenant,
                user_id=body.user,
                conversation_id=body.conversation,
                # From the request id: a retry with the same X-Request-Id is de-duplicated.
                request_id=f"add/{rid}/{index}",
                model=body.model,
            )
            event = scope.event("user", text, created_at=body.created_at)
            if not state.publisher.is_connected():
                raise TurnNotPersisted("not connected to NATS")
            await state.statuses.register(tenant, event.event_id)  # before ingest can see it
            await state.publisher.publish(event)
            event_ids.append(event.event_id)
    except (TurnNotPersisted, OSError, TimeoutError) as exc:
        log.error("add: turn not persisted", error=type(exc).__name__, published=len(event_ids))
        raise GatewayError(
            503,
            f"The event bus did not accept the text ({len(event_ids)} of {len(texts)} accepted"
            f"{': ' + ', '.join(event_ids) if event_ids else ''}). Retry with the same "
            "X-Request-Id: accepted ones are not learned twice.",
            type=SERVICE_UNAVAILABLE,
            code="turn_not_persisted",
        ) from None
    log.info("memory add accepted", turns=len(event_ids), conversation_id=body.conversation)
    return _json(Accepted(event_ids=event_ids), 202)


@router.get(
    "/events/{event_id}", response_model=EventOut, summary="Has an added text been applied?"
)
async def event_status(
    request: Request, event_id: Annotated[str, Path(max_length=64)]
) -> JSONResponse:
    state, tenant = gateway_state(request), resolve_tenant(request)
    event_id = _uuid(event_id, "event")
    try:
        status = await state.statuses.get(tenant, event_id)
        follow_up = (
            await state.statuses.get(tenant, status.follow_up)
            if status is not None and status.follow_up
            else None
        )
    except Exception as exc:
        log.warning("event status unavailable", error=type(exc).__name__)
        raise GatewayError(
            503,
            "Event status is unavailable; retry later.",
            type=SERVICE_UNAVAILABLE,
            code="event_status_unavailable",
        ) from None
    if status is None:
        raise GatewayError(404, f"No event {event_id}", code="event_not_found")
    if follow_up is not None and follow_up.status == "applied":
        status = follow_up
    return _json(
        EventOut(
            id=event_id,
            status=status.status,
            stage=status.stage if status.status == "pending" else None,
            accepted_at=status.accepted_at,
            applied_at=status.applied_at,
        )
    )
