"""``POST /v1/chat/completions``: recall, forward, record, relay.

1. Validate and strip the memory controls; the rest of the body is forwarded as is.
2. Unless memory is bypassed: search memory, and inject one system message (what memory
   found) right before the latest user message.
3. Forward upstream. A failed upstream call records nothing.
4. The upstream accepted: publish the user turn and wait for JetStream's ack before any
   of the reply is relayed. No ack → 503 (the reply is dropped; a retry records the same
   turn once, see turns.py).
5. Relay the reply (SSE chunks as they arrive when streaming; the first chunk carries
   ``memory_hits``); once it is complete, publish the assistant turn.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any

import httpx2
from fastapi import APIRouter, Request
from opentelemetry import trace
from starlette.responses import Response, StreamingResponse

from engram_core import semconv
from engram_core.genai import LlmCall
from engram_core.logging import get_logger
from engram_core.memory import GLOBAL_CONVERSATION, is_tenant_wide
from engram_gateway.bodies import check_text_size, parse_json_object, read_body
from engram_gateway.chat_schema import chat_openapi
from engram_gateway.client_hints import apply_client_hints
from engram_gateway.controls import chat_user, split_memory_controls
from engram_gateway.errors import SERVICE_UNAVAILABLE, UPSTREAM_ERROR, GatewayError, bad_request
from engram_gateway.recall import (
    MEMORY_HEADER,
    MemoryStatus,
    Recall,
    conversation_position,
    inject,
    latest_user_index,
    message_text,
    recall,
    search_query,
)
from engram_gateway.server_timing import HEADER as SERVER_TIMING_HEADER
from engram_gateway.server_timing import ServerTiming
from engram_gateway.sse import ChatStreamReader, with_first_event_field
from engram_gateway.state import GatewayState, gateway_state, request_id
from engram_gateway.tenancy import resolve_tenant
from engram_gateway.turns import TurnNotPersisted, TurnScope
from engram_gateway.upstream import response_headers

log = get_logger(__name__)

router = APIRouter()

TURN_HEADER = "X-Engram-Assistant-Turn"


def validate_chat_body(body: dict[str, Any]) -> None:
    """Only what the gateway itself relies on; the upstream judges the rest."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(
            "You must provide a model parameter (a non-empty string).",
            param="model",
            code="missing_required_parameter",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request(
            "You must provide messages (a non-empty array).",
            param="messages",
            code="missing_required_parameter",
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(
                f"messages[{index}] must be an object with a string role.",
                param=f"messages[{index}]",
            )
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad_request("user must be a string.", param="user")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise bad_request("stream must be a boolean.", param="stream")


def assistant_text(payload: dict[str, Any]) -> str:
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        return ""
    first = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), choices[0])
    return message_text(first.get("message")) if isinstance(first, dict) else ""


def _not_recorded(what: str) -> GatewayError:
    return GatewayError(
        503,
        f"Engram could not record this turn (the event bus did not acknowledge it), so {what}. "
        "Retry (the turn is recorded once), or send memory=false to bypass memory.",
        type=SERVICE_UNAVAILABLE,
        code="turn_not_persisted",
    )


async def _record_user_turn(state: GatewayState, scope: TurnScope, text: str) -> None:
    """Publish the user turn and wait for the ack; 503 if it does not come."""
    try:
        await state.publisher.publish(scope.event("user", text))
    except TurnNotPersisted as exc:
        log.error("turn.user_not_persisted", then="reply withheld", error=str(exc))
        raise _not_recorded("the reply was withheld") from None


_CHAT_RESPONSES, _CHAT_REQUEST = chat_openapi()


@router.post(
    "/v1/chat/completions",
    summary="Chat with memory (OpenAI Chat Completions)",
    responses=_CHAT_RESPONSES,
    openapi_extra=_CHAT_REQUEST,
)
async def chat_completions(request: Request) -> Response:
    state = gateway_state(request)
    settings = state.settings
    timing = ServerTiming.of(request)
    body = parse_json_object(await read_body(request, settings.gateway_max_body_bytes))
    controls, forwarded = split_memory_controls(body, request.headers)
    validate_chat_body(forwarded)

    messages: list[Any] = forwarded["messages"]
    user_index = latest_user_index(messages)
    query = message_text(messages[user_index]).strip() if user_index is not None else ""
    controls, bypass = apply_client_hints(controls, request.headers, query, settings)
    controls = controls.with_defaults(settings)
    scope = TurnScope.chat(
        tenant=resolve_tenant(request),
        user_id=chat_user(forwarded, request.headers, settings.gateway_user_header),
        conversation_id=controls.conversation_id,
        request_id=request_id(request),
        model=forwarded["model"],
        turn_index=conversation_position(messages, user_index),
        prompt=query,
    )
    if controls.enabled and query:
        # Too large to record: refused before anything is forwarded or published.
        check_text_size(query, settings.max_text_bytes, f"messages[{user_index}]")

    if controls.enabled and query and is_tenant_wide(scope.user_id, scope.conversation_id):
        raise bad_request(
            f"memory_id {GLOBAL_CONVERSATION!r} without a user is the tenant-wide bucket, "
            "recalled for every user of the tenant; chats are recorded in a user's "
            "conversation. Send `user`, choose another memory_id, or add tenant-wide "
            "memories with POST /v1/memories.",
            param="memory_id",
            code="invalid_memory_control",
        )
    if not controls.enabled:
        memory = Recall(MemoryStatus.BYPASSED)
    elif not query:
        # Nothing to search for and nothing to record (no user text: an image only, say).
        memory = Recall(MemoryStatus.EMPTY)
    else:
        search = search_query(
            tenant=scope.tenant, query=query, user_id=scope.user_id, controls=controls
        )
        # The request's own messages are the short-term window: hits repeating them are
        # dropped.
        with timing.measure("recall"):
            memory = await recall(state.memories, search, messages=messages)
        if memory.system_message is not None and user_index is not None:
            forwarded["messages"] = inject(messages, user_index, memory.system_message)

    headers = {MEMORY_HEADER: memory.status.value}
    if memory.status is not MemoryStatus.BYPASSED:
        headers["X-Engram-Memory-Hits"] = str(len(memory.hits))
    stream = forwarded.get("stream") is True
    log.info(
        "chat.request",
        model=scope.model,
        stream=stream,
        memory=memory.status.value,
        hits=len(memory.hits),
        conversation_id=scope.conversation_id,
        **({"bypass": bypass.value} if bypass else {}),
    )
    trace.get_current_span().set_attributes(
        {
            semconv.ENGRAM_MEMORY_STATUS: memory.status.value,
            semconv.ENGRAM_MEMORY_HITS: len(memory.hits),
        }
    )

    record = controls.enabled and bool(query)
    if record and not await state.publisher.wait_connected():
        # Known before forwarding: do not spend the upstream's work on a reply that
        # would be withheld. A client that is reconnecting (a NATS node lost) is given
        # the publish retries' time to get there first.
        log.error("turn.user_not_recordable", reason="NATS not connected", then="request refused")
        raise _not_recorded("the request was not sent to the model")

    # The upstream call's span (gen_ai) ends when the reply is complete, streamed or not.
    call = LlmCall(scope.model, task="chat", tracer=state.tracer)
    timing.since_arrival("pre-upstream")
    try:
        with call.current(), timing.measure("upstream"):
            upstream = await state.upstream.chat(forwarded, request.headers, stream=stream)
    except BaseException as exc:
        call.fail(str(getattr(exc, "status", "")) or type(exc).__name__)
        call.end()
        raise
    if record:
        try:
            with timing.measure("record"):
                await _record_user_turn(state, scope, query)
        except GatewayError:
            call.fail("turn_not_persisted")
            call.end()
            with suppress(Exception):
                await upstream.aclose()
            raise
        state.user_names.remember_from(
            request.headers, scope.tenant, scope.user_id, body_user=forwarded.get("user")
        )
    headers[SERVER_TIMING_HEADER] = timing.header()
    if stream:
        hits = memory.hits if memory.status is not MemoryStatus.BYPASSED else None
        return _relay_stream(
            state, upstream, scope, call, record=record, headers=headers, hits=hits
        )
    try:
        return await _complete(state, upstream, scope, memory, call, record=record, headers=headers)
    finally:
        call.end()


async def _complete(
    state: GatewayState,
    upstream: httpx2.Response,
    scope: TurnScope,
    memory: Recall,
    call: LlmCall,
    *,
    record: bool,
    headers: dict[str, str],
) -> Response:
    relayed = response_headers(upstream.headers)
    for name in ("content-type", "content-encoding"):
        relayed.pop(name, None)
    try:
        payload = upstream.json()
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        log.warning("upstream.reply_not_json", then="relayed as is")
        return Response(
            upstream.content,
            status_code=upstream.status_code,
            headers={**relayed, **headers},
            media_type=upstream.headers.get("content-type"),
        )
    call.record_reply(payload)
    if memory.status is not MemoryStatus.BYPASSED:
        payload["memory_hits"] = memory.hits
    text = assistant_text(payload)
    if record and text:
        task = state.publisher.publish_detached(scope.event("assistant", text))
        if not await asyncio.shield(task):
            headers[TURN_HEADER] = "not-persisted"
    return Response(
        json.dumps(payload, ensure_ascii=False).encode(),
        status_code=upstream.status_code,
        headers={**relayed, **headers},
        media_type="application/json",
    )


def _sse_error(message: str, code: str) -> bytes:
    body = {"error": {"message": message, "type": UPSTREAM_ERROR, "param": None, "code": code}}
    return f"data: {json.dumps(body)}\n\n".encode()


def _relay_stream(
    state: GatewayState,
    upstream: httpx2.Response,
    scope: TurnScope,
    call: LlmCall,
    *,
    record: bool,
    headers: dict[str, str],
    hits: list[dict[str, Any]] | None,
) -> StreamingResponse:
    reader = ChatStreamReader()
    chunks: AsyncIterator[bytes] = upstream.aiter_bytes()
    if hits is not None:
        chunks = with_first_event_field(chunks, "memory_hits", hits)

    async def relay() -> AsyncIterator[bytes]:
        completed = False
        try:
            async for chunk in chunks:
                reader.feed(chunk)
                yield chunk
            completed = True
        except httpx2.TimeoutException:
            call.fail("timeout")
            log.warning("upstream.stream_timeout", timeout_s=state.settings.llm_timeout_s)
            yield _sse_error(
                "Upstream LLM stopped sending before the reply was complete.", "upstream_timeout"
            )
        except httpx2.HTTPError as exc:
            call.fail(type(exc).__name__)
            log.warning("upstream.stream_broken", error=str(exc) or type(exc).__name__)
            yield _sse_error(f"Upstream LLM stream broke: {exc}", "upstream_error")
        except (asyncio.CancelledError, GeneratorExit):
            call.fail("cancelled", "client went away mid-stream")
            log.warning("chat.client_gone_mid_stream", then="assistant turn not recorded")
            raise
        finally:
            with suppress(Exception):
                await upstream.aclose()
            call.record_reply(reader.usage_chunk)
            call.end()
        if not record:
            return
        if not (completed and reader.complete):
            log.warning(
                "chat.stream_incomplete",
                then="assistant turn not recorded",
                done=reader.done,
                error=reader.error,
            )
            return
        text = reader.text(0)
        if text:
            # Shielded: a client that hangs up right after [DONE] must not cancel it.
            await asyncio.shield(state.publisher.publish_detached(scope.event("assistant", text)))

    relayed = response_headers(upstream.headers)
    for name in ("content-type", "content-encoding"):
        relayed.pop(name, None)
    relayed.setdefault("cache-control", "no-cache")
    relayed["x-accel-buffering"] = "no"  # nginx & co: do not buffer the stream
    return StreamingResponse(
        relay(),
        status_code=upstream.status_code,
        headers={**relayed, **headers},
        media_type=upstream.headers.get("content-type", "text/event-stream"),
    )
