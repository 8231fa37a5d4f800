"""The memory API: list, get, create, update, delete, history, search, add-from-text,
and the status of what was added. Tenant-scoped through ``deps.Tenant``;
retrieval enforces the tenant on every call, so another tenant's id is simply missing
(404, never 403: no existence oracle).

Scopes, as the chat uses them: ``user`` and ``conversation`` name a user's conversation.
Without a ``user``, what is created or added goes to the tenant-wide bucket
(conversation ``global``, recalled for every user of the tenant) unless a conversation
is named (then it is the conversation of "no user", where chats without ``user`` are
recorded).

Create, update and delete are :mod:`engram_core.memory_ops` (the one implementation the
mirror's edits worker shares): serialised per memory across gateway pods, so one DELETE
and any PATCHes of a memory sent together apply whole, one after the other; each change
is announced on ``engram.memory.changed.v1`` (cause ``api``) under that lock, so the
Markdown mirror follows in order. NATS must be connected before a write starts (503
otherwise); if the announcement itself then fails, the change stands, the response says
``X-Engram-Mirror: not-persisted`` and an error is logged.

Updates keep history: the previous version is kept as a superseded copy and the edited
id stays the current version. A delete removes the memory and its history. Rewriting or
deleting a fact marks the turns it came from as corrected, so they stop competing with
what replaced them. Creating a fact its scope already holds (the same text, or a near
duplicate) returns the existing one: 200 and ``duplicate_of``, instead of 201.

Optimistic concurrency: GET, PATCH and POST answer a strong ``ETag`` (the memory's
version); ``If-Match`` on PATCH and DELETE (one or more tags, or ``*``) makes the change
conditional, checked under the lock: another version → 412 ``precondition_failed``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import JSONResponse

from engram_core.api_models import (
    Accepted,
    AddMemories,
    CreatedMemory,
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
from engram_core.bus import publish_event
from engram_core.events import MemoryChanged, utcnow
from engram_core.ids import created_memory_id, normalize_id
from engram_core.kinds import kind_names
from engram_core.locks import LockTimeout
from engram_core.logging import get_logger
from engram_core.memory import (
    DEFAULT_CONVERSATION,
    GLOBAL_CONVERSATION,
    MemoryFilter,
    MemoryRecord,
)
from engram_core.memory_ops import (
    MemoryNotFound,
    MemoryOps,
    MemorySuperseded,
    Precondition,
    PreconditionFailed,
    history,
    version,
)
from engram_core.retry import retry_transient
from engram_gateway.bodies import check_text_size
from engram_gateway.controls import MemoryControls
from engram_gateway.deps import AppState, Tenant
from engram_gateway.errors import INVALID_REQUEST, SERVICE_UNAVAILABLE, GatewayError, bad_request
from engram_gateway.recall import hit_json, search_query
from engram_gateway.state import GatewayState, request_id
from engram_gateway.turns import TurnNotPersisted, TurnScope

log = get_logger(__name__)

CAUSE = "api"
#: The kind ``POST /v1/memories`` creates (the one row ``created_by_memory_api``).
(CREATED_KIND,) = kind_names(lambda k: k.created_by_memory_api)
MIRROR_HEADER = "X-Engram-Mirror"

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in (
        (400, "Invalid request (unknown field, bad value, text too long, bad id)"),
        (401, "Missing or invalid API key"),
        (404, "No such memory or event for this tenant"),
        (408, "The request body did not arrive in time"),
        (409, "Conflict (a superseded version, an X-Request-Id used for another memory)"),
        (412, "If-Match names another version of the memory"),
        (413, "The body, or a text, is too large (ENGRAM_MAX_TEXT_BYTES)"),
        (503, "Retrieval or the event bus is unavailable, or the memory stayed busy"),
    )
}
router = APIRouter(prefix="/v1", tags=["memories"], responses=_ERRORS)

MemoryIdPath = Annotated[str, Path(description="A memory id (UUID).", max_length=64)]
IfMatch = Annotated[
    str | None,
    Header(
        alias="If-Match",
        description="Apply only to this version: one or more ETags (comma-separated), or *.",
    ),
]


# --- helpers ---------------------------------------------------------------------------


def _uuid(value: str, what: str) -> str:
    canonical = normalize_id(value)
    if canonical is None:
        raise bad_request(f"{value[:64]!r} is not a valid {what} id (a UUID)", code="invalid_id")
    return canonical


def _not_found(memory_id: str) -> GatewayError:
    return GatewayError(
        404, f"No memory {memory_id}", type=INVALID_REQUEST, code="memory_not_found"
    )


def _check_text(text: str, limit: int, param: str = "text", *, max_bytes: int) -> str:
    if not text.strip():
        raise bad_request(f"{param} must not be empty", param=param, code="empty_text")
    check_text_size(text, max_bytes, param)
    if len(text) > limit:
        raise bad_request(
            f"{param} is longer than {limit} characters (ENGRAM_MAX_MEMORY_CHARS)",
            param=param,
            code="text_too_long",
        )
    return text


def _out(memory: MemoryRecord) -> MemoryOut:
    return MemoryOut(**memory.model_dump())


def _require_bus(state: GatewayState) -> None:
    if not state.publisher.is_connected():
        raise GatewayError(
            503,
            "The event bus is unavailable, so the change could not be mirrored; nothing was "
            "changed. Retry later.",
            type=SERVICE_UNAVAILABLE,
            code="event_bus_unavailable",
        )


def default_conversation(user: str, conversation: str | None) -> str:
    """Without a user the default is the tenant-wide bucket; with one, ``default``."""
    if conversation:
        return conversation
    return DEFAULT_CONVERSATION if user else GLOBAL_CONVERSATION


async def _get(state: GatewayState, tenant: str, memory_id: str) -> MemoryRecord:
    memory = await state.memories.get_one(tenant, memory_id)
    if memory is None:
        raise _not_found(memory_id)
    return memory


def _ops(state: GatewayState) -> MemoryOps:
    """The memory operations, serialised on the bus's locks, announced for the mirror."""

    async def announce(events: Sequence[MemoryChanged]) -> bool:
        try:
            for event in events:
                await publish_event(state.broker, event, retry_s=state.publisher.retry_s)
        except Exception as exc:
            log.error(
                "memory.change_not_announced",
                then="the mirror misses it",
                error=f"{type(exc).__name__}",
                memory_ids=[e.memory.id for e in events],
            )
            return False
        return True

    return MemoryOps(
        state.memories,
        state.bus.locks,
        announce,
        near_duplicate_cosine=state.settings.near_duplicate_cosine,
    )


@contextmanager
def _answering_for(memory_id: str) -> Iterator[None]:
    """The memory operations' refusals, as HTTP errors."""
    try:
        yield
    except MemoryNotFound:
        raise _not_found(memory_id) from None
    except PreconditionFailed as exc:
        raise GatewayError(
            412,
            f"Memory {memory_id} is not at the version If-Match names (it is now "
            f"{_etag(exc.memory)}); read it again and retry.",
            code="precondition_failed",
            param="If-Match",
            headers={"ETag": _etag(exc.memory)},
        ) from None
    except MemorySuperseded as exc:
        raise GatewayError(
            409,
            f"Memory {memory_id} is a superseded version; edit the current one "
            f"({exc.memory.superseded_by}).",
            code="memory_superseded",
        ) from None
    except LockTimeout:
        raise GatewayError(
            503,
            f"Memory {memory_id} is being changed by another request; retry later.",
            type=SERVICE_UNAVAILABLE,
            code="memory_busy",
            headers={"Retry-After": "1"},
        ) from None


def _etag(memory: MemoryRecord) -> str:
    return f'"{version(memory)}"'


_ENTITY_TAG = re.compile(r'\s*(W/)?"([\x21\x23-\x7e]*)"\s*')


def precondition(if_match: str | None) -> Precondition | None:
    """``If-Match`` as the versions a change may apply to (RFC 9110 strong comparison:
    a weak tag matches nothing). Malformed: 400."""
    if if_match is None:
        return None
    if if_match.strip() == "*":
        return Precondition(any_version=True)
    versions = set()
    for part in if_match.split(","):
        match = _ENTITY_TAG.fullmatch(part)
        if match is None:
            raise bad_request(
                'If-Match must be * or a list of entity tags ("...")',
                param="If-Match",
                code="invalid_if_match",
            )
        if not match.group(1):
            versions.add(match.group(2))
    return Precondition(versions=frozenset(versions))


def _headers(announced: bool, memory: MemoryRecord | None = None) -> dict[str, str]:
    """The mirror's state (when the announcement failed) and the memory's ETag."""
    headers = {} if announced else {MIRROR_HEADER: "not-persisted"}
    if memory is not None:
        headers["ETag"] = _etag(memory)
    return headers


def _json(model: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(model.model_dump(mode="json"), status_code=status, headers=headers)


# --- list cursors: the filters travel with the position --------------------------------

_FILTER_FIELDS = (
    "conversation",
    "user",
    "kind",
    "tag",
    "include_superseded",
    "created_after",
    "created_before",
)


def _filters_of(query: ListQuery) -> dict[str, Any]:
    return query.model_dump(mode="json", include=set(_FILTER_FIELDS))


def encode_cursor(token: str, filters: dict[str, Any]) -> str:
    raw = json.dumps({"t": token, "f": filters}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, dict[str, Any]]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        decoded = json.loads(raw)
        token, filters = decoded["t"], decoded["f"]
        if not isinstance(token, str) or not isinstance(filters, dict):
            raise ValueError("not a cursor")
        ListQuery.model_validate({k: v for k, v in filters.items() if v is not None})
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise bad_request(
            "cursor is not one this API issued (pass next_cursor as it came)",
            param="cursor",
            code="invalid_cursor",
        ) from None
    return token, filters


def resolve_list_query(query: ListQuery) -> tuple[ListQuery, str]:
    """The filters and the retrieval page token of a list request. A cursor carries the
    filters of the first page: page 2 may repeat them or leave them out, but a cursor
    sent with other filters is a 400 (it would page through another listing)."""
    if not query.cursor:
        return query, ""
    token, filters = decode_cursor(query.cursor)
    given = _filters_of(query)
    defaults = _filters_of(ListQuery())
    changed = {k for k, v in given.items() if v != defaults[k] and v != filters.get(k)}
    if changed:
        raise bad_request(
            f"cursor was issued for other filters ({', '.join(sorted(changed))} differ); "
            "send the same filters as the first page, or none",
            param="cursor",
            code="cursor_filters_mismatch",
        )
    return ListQuery.model_validate({**query.model_dump(), **filters}), token


# --- reading -----------------------------------------------------------------------------


@router.get("/memories", response_model=MemoryList, summary="List memories, newest first")
async def list_memories(
    state: AppState, tenant: Tenant, query: Annotated[ListQuery, Query()]
) -> JSONResponse:
    query, token = resolve_list_query(query)
    flt = MemoryFilter(
        user_id=query.user,
        conversation_id=query.conversation,
        kinds=tuple(query.kind),
        tags=tuple(query.tag),
        include_superseded=query.include_superseded,
        **_created_window(query),
    )
    page = await state.memories.list_page(tenant, flt, page_size=query.limit, page_token=token)
    cursor = encode_cursor(page.next_token, _filters_of(query)) if page.next_token else None
    return _json(
        MemoryList(data=[_out(m) for m in page.records], has_more=bool(cursor), next_cursor=cursor)
    )


def _created_window(query: ListQuery) -> dict[str, Any]:
    """The list's created_at window (``created_after`` inclusive, ``created_before`` not)."""
    after, before = query.created_after, query.created_before
    if after is not None and before is not None and after >= before:
        raise bad_request(
            "created_after must be earlier than created_before", param="created_after"
        )
    return {"created_after": after, "created_before": before}


@router.get("/memories/{memory_id}", response_model=MemoryOut, summary="Get one memory")
async def get_memory(state: AppState, tenant: Tenant, memory_id: MemoryIdPath) -> JSONResponse:
    memory = await _get(state, tenant, _uuid(memory_id, "memory"))
    return _json(_out(memory), headers={"ETag": _etag(memory)})


@router.get(
    "/memories/{memory_id}/history",
    response_model=MemoryHistory,
    summary="Superseded versions of a memory, oldest first",
)
async def memory_history(state: AppState, tenant: Tenant, memory_id: MemoryIdPath) -> JSONResponse:
    memory = await _get(state, tenant, _uuid(memory_id, "memory"))
    versions = await history(state.memories, tenant, memory)
    return _json(MemoryHistory(id=memory.id, data=[_out(m) for m in versions]))


@router.post("/memories/search", response_model=SearchResult, summary="Retrieval only, no LLM")
async def search_memories(state: AppState, tenant: Tenant, body: SearchMemories) -> JSONResponse:
    _check_text(
        body.query,
        state.settings.max_memory_chars,
        "query",
        max_bytes=state.settings.max_text_bytes,
    )
    controls = MemoryControls(
        memory_id=body.conversation,
        memory_top_k=body.memory_top_k,
        memory_recency_weight=body.memory_recency_weight,
        memory_score_threshold=body.memory_score_threshold,
        memory_mmr_lambda=body.memory_mmr_lambda,
    ).with_defaults(state.settings)
    query = replace(
        search_query(tenant=tenant, query=body.query, user_id=body.user, controls=controls),
        kinds=tuple(body.kinds),
        include_superseded=body.include_superseded,
    )
    result = await state.memories.search(query)
    hits = []
    for hit in result.hits:
        flat = hit_json(hit)
        hits.append(
            SearchHit(
                **_out(hit.memory).model_dump(),
                score=flat["score"],
                scope=hit.scope,
                scores=flat["scores"],
            )
        )
    return _json(
        SearchResult(
            outcome=result.outcome,
            hits=hits,
            summary=_out(result.summary) if result.summary is not None else None,
            profile=[_out(m) for m in result.profile],
        )
    )


# --- writing -----------------------------------------------------------------------------


@router.post(
    "/memories",
    status_code=201,
    response_model=CreatedMemory,
    summary="Create a fact memory (or get the one that already says it: 200)",
    responses={200: {"model": CreatedMemory, "description": "The fact was already stored"}},
)
async def create_memory(
    request: Request, state: AppState, tenant: Tenant, body: CreateMemory
) -> JSONResponse:
    text = _check_text(
        body.text, state.settings.max_memory_chars, max_bytes=state.settings.max_text_bytes
    )
    _require_bus(state)
    rid = request_id(request)
    memory_id = created_memory_id(tenant, rid)
    conversation = default_conversation(body.user, body.conversation)
    tags = list(dict.fromkeys(body.tags))
    existing = await state.memories.get_one(tenant, memory_id)
    if existing is not None:
        if (existing.text, existing.user_id, existing.conversation_id, existing.tags) != (
            text,
            body.user,
            conversation,
            tags,
        ):
            raise GatewayError(
                409,
                f"X-Request-Id {rid!r} already created another memory ({memory_id}); use a "
                "new request id for a new memory.",
                code="request_id_reused",
            )
        return _json(CreatedMemory(**existing.model_dump()), 201, _headers(True, existing))
    created_at = body.created_at or utcnow()
    memory = MemoryRecord(
        id=memory_id,
        kind=CREATED_KIND,
        text=text,
        user_id=body.user,
        conversation_id=conversation,
        tags=tags,
        created_at=created_at,
        valid_from=created_at,
        metadata={"created_by": CAUSE, "request_id": rid},
    )
    with _answering_for(memory_id):
        outcome = await _ops(state).create(tenant, memory, cause=CAUSE)
    stored = outcome.memory
    if outcome.duplicate_of:
        log.info("memory.duplicate_not_created", memory_id=stored.id)
        created = CreatedMemory(**stored.model_dump(), duplicate_of=outcome.duplicate_of)
        return _json(created, 200, _headers(True, stored))
    log.info("memory.created", memory_id=memory_id, conversation_id=conversation)
    return _json(CreatedMemory(**stored.model_dump()), 201, _headers(outcome.announced, stored))


@router.patch(
    "/memories/{memory_id}",
    response_model=MemoryOut,
    summary="Edit text and/or tags; the previous version is kept as history",
)
async def update_memory(
    state: AppState,
    tenant: Tenant,
    memory_id: MemoryIdPath,
    body: UpdateMemory,
    if_match: IfMatch = None,
) -> JSONResponse:
    if body.text is None and body.tags is None:
        raise bad_request("Send text and/or tags to change.", code="nothing_to_update")
    if body.text is not None:
        _check_text(
            body.text, state.settings.max_memory_chars, max_bytes=state.settings.max_text_bytes
        )
    memory_id = _uuid(memory_id, "memory")
    condition = precondition(if_match)
    _require_bus(state)
    with _answering_for(memory_id):
        outcome = await _ops(state).edit(
            tenant,
            memory_id,
            cause=CAUSE,
            text=body.text,
            tags=body.tags,
            precondition=condition,
        )
    if outcome.events:
        log.info("memory.updated", memory_id=memory_id, history_id=outcome.events[0].memory.id)
    return _json(_out(outcome.memory), 200, _headers(outcome.announced, outcome.memory))


@router.delete(
    "/memories/{memory_id}",
    response_model=DeletedMemory,
    summary="Delete a memory and its history (tombstoned in the mirror)",
)
async def delete_memory(
    state: AppState, tenant: Tenant, memory_id: MemoryIdPath, if_match: IfMatch = None
) -> JSONResponse:
    memory_id = _uuid(memory_id, "memory")
    condition = precondition(if_match)
    _require_bus(state)
    with _answering_for(memory_id):
        outcome = await _ops(state).delete(tenant, memory_id, cause=CAUSE, precondition=condition)
    log.info("memory.deleted", memory_id=memory_id, with_history=len(outcome.deleted_ids) - 1)
    return _json(
        DeletedMemory(id=outcome.memory.id, deleted_ids=outcome.deleted_ids),
        200,
        _headers(outcome.announced),
    )


# --- learning from text -------------------------------------------------------------------


@router.post(
    "/memories/add",
    status_code=202,
    response_model=Accepted,
    summary="Learn from text: extraction and reconcile, asynchronously",
)
async def add_memories(
    request: Request, state: AppState, tenant: Tenant, body: AddMemories
) -> JSONResponse:
    texts = [body.text] if isinstance(body.text, str) else body.text
    for index, text in enumerate(texts):
        _check_text(
            text,
            state.settings.max_memory_chars,
            "text" if len(texts) == 1 else f"text[{index}]",
            max_bytes=state.settings.max_text_bytes,
        )
    rid = request_id(request)
    conversation = default_conversation(body.user, body.conversation)
    event_ids = []
    try:
        for index, text in enumerate(texts):
            scope = TurnScope(
                tenant=tenant,
                user_id=body.user,
                conversation_id=conversation,
                request_id=rid,
                model=body.model,
                # From the request id: a retry with the same X-Request-Id is de-duplicated.
                key=f"add/{rid}/{index}",
            )
            event = scope.event("user", text, created_at=body.created_at, followed=True)
            if not state.publisher.may_reconnect():
                raise TurnNotPersisted("not connected to NATS")
            await _register(state, tenant, event.event_id)  # before ingest can see it
            await state.publisher.publish(event)
            event_ids.append(event.event_id)
    except (TurnNotPersisted, OSError, TimeoutError) as exc:
        log.error(
            "memory_add.turn_not_persisted", error=type(exc).__name__, published=len(event_ids)
        )
        raise GatewayError(
            503,
            f"The event bus did not accept the text ({len(event_ids)} of {len(texts)} accepted"
            f"{': ' + ', '.join(event_ids) if event_ids else ''}). Retry with the same "
            "X-Request-Id: accepted ones are not learned twice.",
            type=SERVICE_UNAVAILABLE,
            code="turn_not_persisted",
        ) from None
    log.info("memory_add.accepted", turns=len(event_ids), conversation_id=conversation)
    return _json(Accepted(event_ids=event_ids), 202)


async def _register(state: GatewayState, tenant: str, event_id: str) -> None:
    statuses = state.statuses
    try:
        await retry_transient(
            lambda: statuses.register(tenant, event_id), budget_s=state.publisher.retry_s
        )
    except Exception as exc:
        raise TurnNotPersisted(f"event status: {type(exc).__name__}") from exc


@router.get(
    "/events/{event_id}", response_model=EventOut, summary="Has an added text been applied?"
)
async def event_status(
    state: AppState, tenant: Tenant, event_id: Annotated[str, Path(max_length=64)]
) -> JSONResponse:
    event_id = _uuid(event_id, "event")
    try:
        status = await state.statuses.get(tenant, event_id)
        follow_up = (
            await state.statuses.get(tenant, status.follow_up)
            if status is not None and status.follow_up
            else None
        )
    except Exception as exc:
        log.warning("event_status.unavailable", error=type(exc).__name__)
        raise GatewayError(
            503,
            "Event status is unavailable; retry later.",
            type=SERVICE_UNAVAILABLE,
            code="event_status_unavailable",
        ) from None
    if status is None:
        raise GatewayError(404, f"No event {event_id}", code="event_not_found")
    if follow_up is not None and follow_up.status != "pending":
        status = follow_up
    return _json(
        EventOut(
            id=event_id,
            status=status.status,
            stage=status.stage if status.status == "pending" else None,
            reason=status.reason or None,
            fallback=status.fallback or None,
            accepted_at=status.accepted_at,
            applied_at=status.applied_at,
        )
    )
