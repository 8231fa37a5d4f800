"""One memory pipeline for a chat turn, whatever API the client speaks.

controls → recall → inject → forward → relay → record:

1. **controls**: the memory controls (``memory_*`` body fields, ``X-Engram-Memory-*``
   headers) are validated and removed; the rest of the body is forwarded as is. The
   API's adapter reads the turn (:class:`Turn`): the person's latest words, where they
   sit in the client's history, the API's user field.
2. **recall**: unless memory is bypassed, memory is searched with the same scopes,
   rules and budget for every API, and the adapter **injects** what it found where its
   API carries instructions.
3. **forward**: a failed upstream call records nothing.
4. The upstream accepted: the user turn is published and acknowledged by JetStream
   before any of the reply is relayed. No ack → 503 (a retry records the same turn
   once, see turns.py).
5. **relay**: the reply, streamed in the API's own framing as it arrives or whole,
   with the recalled hits where the adapter puts them; once it is complete, the
   assistant turn is **recorded**.

The upstream call's span (gen_ai) is ended in one place: the ``finally`` of
:meth:`_Exchange.run`, whether the call failed, the turn was not recorded, the reply
was whole or the stream ended, broke or lost its client.

An adapter (:class:`ChatApi`, one per API under ``engram_gateway.apis``) knows its API's
wire format and nothing about memory; this module knows memory and nothing about wire
formats.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import httpx2
from opentelemetry import trace
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from engram_core import semconv
from engram_core.genai import LlmCall
from engram_core.logging import get_logger
from engram_core.memory import GLOBAL_CONVERSATION, is_tenant_wide
from engram_gateway.bodies import check_text_size, parse_json_object, read_body
from engram_gateway.client_hints import Bypass, apply_client_hints
from engram_gateway.controls import (
    BODY_PREFIX,
    HEADER_FOR_FIELD,
    MemoryControls,
    chat_user,
    split_memory_controls,
)
from engram_gateway.errors import SERVICE_UNAVAILABLE, GatewayError, bad_request
from engram_gateway.recall import MEMORY_HEADER, MemoryStatus, Recall, recall, search_query
from engram_gateway.server_timing import HEADER as SERVER_TIMING_HEADER
from engram_gateway.server_timing import ServerTiming
from engram_gateway.settings import GatewaySettings
from engram_gateway.state import GatewayState, request_id
from engram_gateway.turns import TurnNotPersisted, TurnScope
from engram_gateway.upstream import Upstream, response_headers

log = get_logger(__name__)

TURN_HEADER = "X-Engram-Assistant-Turn"
HITS_HEADER = "X-Engram-Memory-Hits"


@dataclass(frozen=True)
class Turn:
    """What one request of an API says about the turn it takes."""

    model: str
    stream: bool
    #: The person's latest words ("" when the turn has none: an image only, or a tool's
    #: result handed back, which is not the person speaking).
    text: str
    #: Where the person's words sit in the client's history (user/assistant messages
    #: before them): part of the turn's identity.
    position: int
    #: Where ``text`` is in the body, for an error naming it (``messages[3]``).
    param: str
    #: The request's earlier texts (the short-term window): hits repeating them are not
    #: injected. Chat-shaped: anything :func:`engram_gateway.recall.message_text` reads.
    window: Sequence[Any] = ()
    #: The API's own user field (``user``, ``metadata.user_id``), before Engram's header.
    user: str | None = None
    #: The turn's identity when position and text do not make it (a Responses turn
    #: chained with ``previous_response_id``); None: :func:`~engram_gateway.turns.chat_turn_key`.
    key: str | None = None
    #: The adapter's own note of where to inject (a message index, say).
    anchor: int | None = None
    #: Tools the model called since the person's words and what they returned, each
    #: labelled as such (:func:`tool_exchange_text`): recorded as the model's turns,
    #: never as the person speaking.
    tool_exchanges: tuple[ToolExchange, ...] = ()


@dataclass(frozen=True)
class ToolExchange:
    call_id: str
    text: str


def tool_exchange_text(name: str, arguments: Any, result: Any) -> str:
    """A tool call and its result as the text recorded for them."""

    def shown(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    return f"[tool call] {name or 'a tool'}({shown(arguments)}) returned: {shown(result)}"


class StreamReader(Protocol):
    """Watches a relayed stream to collect the reply's text; never changes a byte."""

    def feed(self, chunk: bytes) -> None: ...

    def text(self) -> str: ...

    @property
    def complete(self) -> bool:
        """The reply ended normally (its API's end event, no in-stream error)."""
        ...

    @property
    def done(self) -> bool: ...

    @property
    def error(self) -> Any: ...

    @property
    def usage(self) -> Mapping[str, Any] | None:
        """What :meth:`ChatApi.record_usage` reads (the event that carried the usage)."""
        ...


class ChatApi(Protocol):
    """What the pipeline needs to know of one API (``engram_gateway.apis``)."""

    #: Short name, in logs and the upstream call's span (``chat``, ``responses``, ...).
    name: str
    #: The API has a free-form ``metadata`` object where callers may put Engram's
    #: controls (:func:`metadata_controls`).
    controls_in_metadata: bool
    #: The stream's content type when the upstream does not say.
    stream_media_type: str

    def read_turn(self, body: dict[str, Any]) -> Turn:
        """The turn, after checking what the gateway relies on (400 otherwise)."""
        ...

    def inject(self, body: dict[str, Any], turn: Turn, memory: str) -> dict[str, Any]:
        """The body with the recalled ``memory`` text where this API carries instructions."""
        ...

    async def forward(
        self, upstream: Upstream, body: dict[str, Any], headers: Mapping[str, str], *, stream: bool
    ) -> httpx2.Response:
        """POST the body to this API's upstream URL (unread when ``stream``)."""
        ...

    def reply_text(self, payload: dict[str, Any]) -> str:
        """The assistant's text in a whole (non-streamed) reply."""
        ...

    def record_usage(self, call: LlmCall, payload: Mapping[str, Any] | None) -> None: ...

    def add_hits(self, payload: dict[str, Any], hits: list[dict[str, Any]]) -> None:
        """Put ``memory_hits`` into a whole reply."""
        ...

    def stream_with_hits(
        self, chunks: AsyncIterator[bytes], hits: list[dict[str, Any]]
    ) -> AsyncIterator[bytes]:
        """The stream with ``memory_hits`` in its first event; the rest byte for byte."""
        ...

    def stream_reader(self) -> StreamReader: ...

    def stream_error(self, message: str, code: str) -> bytes:
        """An in-stream error event, in this API's framing."""
        ...

    def error_response(self, error: GatewayError) -> Response:
        """The gateway's own error in this API's error shape."""
        ...


def metadata_controls(body: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """Engram's controls in the body's ``metadata`` object (``memory``, ``memory_*``: the
    clients of APIs with a free-form metadata field set them there), as the headers
    that carry the same controls, and the body without them (its other metadata kept;
    an emptied ``metadata`` stays, empty). Values are read as header values are:
    metadata holds strings. They come after the headers and before the body's own
    top-level fields (:func:`~engram_gateway.controls.split_memory_controls`)."""
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        return {}, body
    found: dict[str, str] = {}
    kept: dict[str, Any] = {}
    for key, value in metadata.items():
        if key != "memory" and not key.startswith(BODY_PREFIX):
            kept[key] = value
            continue
        header = HEADER_FOR_FIELD.get(key)
        if header is None:
            raise bad_request(
                f"Unknown memory control metadata.{key}; known: {', '.join(HEADER_FOR_FIELD)}",
                param=f"metadata.{key}",
                code="unknown_memory_control",
            )
        found[header] = value if isinstance(value, str) else json.dumps(value)
    if not found:
        return {}, body
    return found, {**body, "metadata": kept}


def not_recorded(what: str) -> GatewayError:
    return GatewayError(
        503,
        f"Engram could not record this turn (the event bus did not acknowledge it), so {what}. "
        "Retry (the turn is recorded once), or send memory=false to bypass memory.",
        type=SERVICE_UNAVAILABLE,
        code="turn_not_persisted",
    )


async def run_turn(api: ChatApi, request: Request, state: GatewayState, tenant: str) -> Response:
    """One chat turn of ``api``, from the request to the response (see the module)."""
    timing = ServerTiming.of(request)
    prepared = await _prepare(api, request, state.settings, tenant)
    memory = await _recall(api, prepared, state, timing)
    _log_request(api, prepared, memory)
    if prepared.record and not await state.publisher.wait_connected():
        # Known before forwarding: do not spend the upstream's work on a reply that
        # would be withheld. A client that is reconnecting (a NATS node lost) is given
        # the publish retries' time to get there first.
        log.error("turn.user_not_recordable", reason="NATS not connected", then="request refused")
        raise not_recorded("the request was not sent to the model")

    reply_headers = {MEMORY_HEADER: memory.status.value}
    if memory.status is not MemoryStatus.BYPASSED:
        reply_headers[HITS_HEADER] = str(len(memory.injected))
    exchange = _Exchange(
        api=api,
        state=state,
        request=request,
        scope=prepared.scope,
        body=prepared.body,
        timing=timing,
        record=prepared.record,
        stream=prepared.turn.stream,
        headers=reply_headers,
        recall=memory if memory.status is not MemoryStatus.BYPASSED else None,
        prompt=prepared.query,
        user_hint=prepared.turn.user,
        tool_exchanges=prepared.turn.tool_exchanges,
    )
    chunks = exchange.run()
    await anext(chunks)  # forwarded, the user turn recorded: the response's head is known
    head = exchange.head
    if not prepared.turn.stream:
        with suppress(StopAsyncIteration):
            await anext(chunks)  # ends the span
        return Response(
            head.body, status_code=head.status, headers=head.headers, media_type=head.media_type
        )
    return StreamingResponse(
        chunks, status_code=head.status, headers=head.headers, media_type=head.media_type
    )


@dataclass
class _Prepared:
    """A request read: its controls applied, its turn and whose it is."""

    body: dict[str, Any]  # what goes upstream (the controls removed; memory not yet added)
    turn: Turn
    query: str  # the person's words, trimmed
    controls: MemoryControls
    bypass: Bypass | None
    scope: TurnScope

    @property
    def record(self) -> bool:
        return self.controls.enabled and bool(self.query)


async def _prepare(
    api: ChatApi, request: Request, settings: GatewaySettings, tenant: str
) -> _Prepared:
    """Controls: the body read, the memory controls validated and removed, the turn read
    by the API's adapter, and the checks that refuse a turn before anything is sent."""
    body = parse_json_object(await read_body(request, settings.gateway_max_body_bytes))
    headers: Mapping[str, str] = request.headers
    if api.controls_in_metadata:
        from_metadata, body = metadata_controls(body)
        headers = {**request.headers, **from_metadata} if from_metadata else headers
    controls, forwarded = split_memory_controls(body, headers)
    turn = api.read_turn(forwarded)
    query = turn.text.strip()
    controls, bypass = apply_client_hints(controls, request.headers, query, settings)
    controls = controls.with_defaults(settings)
    scope = TurnScope.chat(
        tenant=tenant,
        user_id=chat_user({"user": turn.user}, request.headers, settings.gateway_user_header),
        conversation_id=controls.conversation_id,
        request_id=request_id(request),
        model=turn.model,
        turn_index=turn.position,
        prompt=query,
        key=turn.key,
    )
    if controls.enabled and query:
        # Too large to record: refused before anything is forwarded or published.
        check_text_size(query, settings.max_text_bytes, turn.param)

    if controls.enabled and query and is_tenant_wide(scope.user_id, scope.conversation_id):
        raise bad_request(
            f"memory_id {GLOBAL_CONVERSATION!r} without a user is the tenant-wide bucket, "
            "recalled for every user of the tenant; chats are recorded in a user's "
            "conversation. Send `user`, choose another memory_id, or add tenant-wide "
            "memories with POST /v1/memories.",
            param="memory_id",
            code="invalid_memory_control",
        )
    return _Prepared(forwarded, turn, query, controls, bypass, scope)


async def _recall(
    api: ChatApi, prepared: _Prepared, state: GatewayState, timing: ServerTiming
) -> Recall:
    """Recall and inject: what memory holds for the turn, placed by the adapter into
    ``prepared.body``."""
    if not prepared.controls.enabled:
        return Recall(MemoryStatus.BYPASSED)
    if not prepared.query:
        # Nothing to search for and nothing to record (no user text: an image only, say).
        return Recall(MemoryStatus.EMPTY)
    scope = prepared.scope
    search = search_query(
        tenant=scope.tenant, query=prepared.query, user_id=scope.user_id, controls=prepared.controls
    )
    # The request's own messages are the short-term window: hits repeating them are
    # dropped.
    with timing.measure("recall"):
        memory = await recall(state.memories, search, messages=prepared.turn.window)
    if memory.search_ms:
        timing.add("search", memory.search_ms / 1e3)
    if memory.system_message is not None:
        prepared.body = api.inject(prepared.body, prepared.turn, memory.system_message["content"])
    return memory


def _log_request(api: ChatApi, prepared: _Prepared, memory: Recall) -> None:
    log.info(
        "chat.request",
        api=api.name,
        model=prepared.scope.model,
        stream=prepared.turn.stream,
        memory=memory.status.value,
        hits=len(memory.injected),
        conversation_id=prepared.scope.conversation_id,
        **({"bypass": prepared.bypass.value} if prepared.bypass else {}),
    )
    trace.get_current_span().set_attributes(
        {
            semconv.ENGRAM_MEMORY_STATUS: memory.status.value,
            semconv.ENGRAM_MEMORY_HITS: len(memory.injected),
        }
    )


@dataclass
class _Head:
    status: int
    headers: dict[str, str]
    media_type: str | None
    body: bytes = b""


@dataclass
class _Exchange:
    """The upstream call and the relay of its reply, as one generator of the reply's
    bytes, so that the call's span has one place to end."""

    api: ChatApi
    state: GatewayState
    request: Request
    scope: TurnScope
    body: dict[str, Any]
    timing: ServerTiming
    record: bool
    stream: bool
    headers: dict[str, str]
    #: What memory gave the request (its ``memory_hits`` go out with the reply); None when
    #: memory was bypassed.
    recall: Recall | None
    #: The person's words (recorded as the user turn) and the API's user field.
    prompt: str
    user_hint: str | None
    tool_exchanges: tuple[ToolExchange, ...] = ()
    head: _Head = field(default_factory=lambda: _Head(0, {}, None))

    async def run(self) -> AsyncIterator[bytes]:
        """First an empty chunk once :attr:`head` is set (whole replies: with the body),
        then, when streaming, the stream's chunks. Failures before the head raise."""
        call = LlmCall(self.scope.model, task="chat", tracer=self.state.tracer)
        upstream: httpx2.Response | None = None
        reader = self.api.stream_reader()
        completed = False
        try:
            self.timing.since_arrival("pre-upstream")
            try:
                with call.current(), self.timing.measure("upstream"):
                    upstream = await self.api.forward(
                        self.state.upstream, self.body, self.request.headers, stream=self.stream
                    )
            except BaseException as exc:
                call.fail(str(getattr(exc, "status", "")) or type(exc).__name__)
                raise
            if self.record:
                try:
                    with self.timing.measure("record"):
                        await self._record_user_turn()
                except GatewayError:
                    call.fail("turn_not_persisted")
                    raise
                self._record_tool_exchanges()
                self.state.user_names.remember_from(
                    self.request.headers,
                    self.scope.tenant,
                    self.scope.user_id,
                    body_user=self.user_hint,
                )
            self.headers[SERVER_TIMING_HEADER] = self.timing.header()
            if not self.stream:
                self.head = await self._whole_reply(upstream, call)
                yield b""
                return
            self.head = self._stream_head(upstream)
            yield b""
            chunks: AsyncIterator[bytes] = upstream.aiter_bytes()
            if self.recall is not None:
                chunks = self.api.stream_with_hits(chunks, self.recall.hits)
            try:
                async for chunk in chunks:
                    reader.feed(chunk)
                    yield chunk
                completed = True
            except httpx2.TimeoutException:
                call.fail("timeout")
                log.warning("upstream.stream_timeout", timeout_s=self.state.settings.llm_timeout_s)
                yield self.api.stream_error(
                    "Upstream LLM stopped sending before the reply was complete.",
                    "upstream_timeout",
                )
            except httpx2.HTTPError as exc:
                call.fail(type(exc).__name__)
                log.warning("upstream.stream_broken", error=str(exc) or type(exc).__name__)
                yield self.api.stream_error(f"Upstream LLM stream broke: {exc}", "upstream_error")
            except (asyncio.CancelledError, GeneratorExit):
                call.fail("cancelled", "client went away mid-stream")
                log.warning("chat.client_gone_mid_stream", then="assistant turn not recorded")
                raise
        finally:
            if upstream is not None:
                with suppress(Exception):
                    await upstream.aclose()
            if self.stream:
                self.api.record_usage(call, reader.usage)
            call.end()
        if self.record:
            await self._record_streamed_reply(reader, completed=completed)

    def _record_tool_exchanges(self) -> None:
        """Each tool call and its result, labelled, as a turn of the model's (its identity:
        the person's turn and the call's id, so a retry records it once). Best effort,
        like the reply: a failure is logged, the chat goes on."""
        for exchange in self.tool_exchanges:
            scope = replace(self.scope, key=f"{self.scope.key}/tool/{exchange.call_id}")
            self.state.publisher.publish_detached(scope.event("assistant", exchange.text))

    async def _record_user_turn(self) -> None:
        """Publish the user turn and wait for the ack; 503 if it does not come."""
        try:
            await self.state.publisher.publish(self.scope.event("user", self.prompt))
        except TurnNotPersisted as exc:
            log.error("turn.user_not_persisted", then="reply withheld", error=str(exc))
            raise not_recorded("the reply was withheld") from None

    def _relayed_headers(self, upstream: httpx2.Response) -> dict[str, str]:
        relayed = response_headers(upstream.headers)
        for name in ("content-type", "content-encoding"):
            relayed.pop(name, None)
        return relayed

    async def _whole_reply(self, upstream: httpx2.Response, call: LlmCall) -> _Head:
        relayed = self._relayed_headers(upstream)
        try:
            payload = upstream.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            log.warning("upstream.reply_not_json", then="relayed as is")
            return _Head(
                upstream.status_code,
                {**relayed, **self.headers},
                upstream.headers.get("content-type"),
                upstream.content,
            )
        self.api.record_usage(call, payload)
        if self.recall is not None:
            self.api.add_hits(payload, self.recall.hits)
        text = self.api.reply_text(payload)
        if self.record and text:
            task = self.state.publisher.publish_detached(self.scope.event("assistant", text))
            if not await asyncio.shield(task):
                self.headers[TURN_HEADER] = "not-persisted"
        return _Head(
            upstream.status_code,
            {**relayed, **self.headers},
            "application/json",
            json_bytes(payload),
        )

    def _stream_head(self, upstream: httpx2.Response) -> _Head:
        relayed = self._relayed_headers(upstream)
        relayed.setdefault("cache-control", "no-cache")
        relayed["x-accel-buffering"] = "no"  # nginx & co: do not buffer the stream
        return _Head(
            upstream.status_code,
            {**relayed, **self.headers},
            upstream.headers.get("content-type", self.api.stream_media_type),
        )

    async def _record_streamed_reply(self, reader: StreamReader, *, completed: bool) -> None:
        if not (completed and reader.complete):
            log.warning(
                "chat.stream_incomplete",
                then="assistant turn not recorded",
                done=reader.done,
                error=reader.error,
            )
            return
        text = reader.text()
        if text:
            # Shielded: a client that hangs up right after the end must not cancel it.
            await asyncio.shield(
                self.state.publisher.publish_detached(self.scope.event("assistant", text))
            )


def json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False).encode()
