"""The Anthropic Messages API (``POST /v1/messages``) as a turn adapter.

- The turn: the latest ``user`` message that says something (a string content, or its
  ``text`` blocks); a user message holding only ``tool_result`` blocks is a tool's
  answer handed back, never read as the person speaking. Its position counts the
  messages before it. The user: ``metadata.user_id``.
- Memory: appended to ``system``: a new paragraph of a string ``system``, a ``text``
  block after the blocks of a list (the caller's ``cache_control`` breakpoints stay
  where they were), or the whole ``system`` when there is none.
- The reply: the ``text`` blocks of the message, whole or from the stream's
  ``text_delta`` events (complete at ``message_stop`` without an ``error`` event).
  ``memory_hits`` on the message's top level, and in the ``message_start`` event's
  message when streamed.
- Errors: Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``.
- The upstream's key, when the operator configures one, goes in ``x-api-key``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2
from starlette.responses import JSONResponse, Response

from engram_core.genai import LlmCall
from engram_gateway.apis.chat_completions import (
    optional_string,
    require_messages,
    require_model,
    require_stream_flag,
)
from engram_gateway.errors import GatewayError, bad_request
from engram_gateway.recall import message_text
from engram_gateway.sse import SseEvents, json_object, with_first_event_field
from engram_gateway.turn_pipeline import ToolExchange, Turn, tool_exchange_text
from engram_gateway.upstream import API_KEY_HEADER, Upstream

#: HTTP status → Anthropic's error type.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def _says_something(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    if isinstance(content, str):
        return True
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") != "tool_result" for block in content
    )


def _blocks(message: Any, kind: str) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict) and block.get("type") == kind]


def tool_exchanges(messages: list[Any]) -> tuple[ToolExchange, ...]:
    """The ``tool_result`` blocks, each with the ``tool_use`` block it answers."""
    calls = {block.get("id"): block for m in messages for block in _blocks(m, "tool_use")}
    return tuple(
        ToolExchange(
            str(result.get("tool_use_id")),
            tool_exchange_text(
                calls.get(result.get("tool_use_id"), {}).get("name", ""),
                calls.get(result.get("tool_use_id"), {}).get("input", {}),
                message_text(result) or result.get("content", ""),
            ),
        )
        for m in messages
        for result in _blocks(m, "tool_result")
    )


def reply_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if not isinstance(content, list):
        return ""
    return "".join(
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class MessagesStreamReader:
    """``message_start … message_stop``: text from ``text_delta``s, usage from
    ``message_start`` and ``message_delta``."""

    def __init__(self) -> None:
        self._events = SseEvents()
        self._texts: list[str] = []
        self._usage: dict[str, Any] = {}
        self._model: str | None = None
        self.done = False
        self.error: Any = None

    def feed(self, chunk: bytes) -> None:
        for _, data in self._events.feed(chunk):
            event = json_object(data)
            if event is None:
                continue
            kind = event.get("type")
            if kind == "message_start" and isinstance(event.get("message"), dict):
                message = event["message"]
                self._model = message.get("model")
                self._usage.update(message.get("usage") or {})
            elif kind == "content_block_delta":
                delta = event.get("delta") or {}
                if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                    self._texts.append(delta["text"])
            elif kind == "message_delta" and isinstance(event.get("usage"), dict):
                self._usage.update(event["usage"])
            elif kind == "message_stop":
                self.done = True
            elif kind == "error":
                self.error = event.get("error") or kind

    def text(self) -> str:
        return "".join(self._texts)

    @property
    def complete(self) -> bool:
        return self.done and self.error is None

    @property
    def usage(self) -> Mapping[str, Any] | None:
        return {"usage": self._usage, "model": self._model}


def _into_message_start(hits: list[dict[str, Any]]) -> Any:
    def add(payload: dict[str, Any]) -> bool:
        if payload.get("type") != "message_start" or not isinstance(payload.get("message"), dict):
            return False
        payload["message"]["memory_hits"] = hits
        return True

    return add


class AnthropicMessages:
    name = "messages"
    controls_in_metadata = True
    stream_media_type = "text/event-stream"

    def read_turn(self, body: dict[str, Any]) -> Turn:
        model = require_model(body)
        messages = require_messages(body)
        stream = require_stream_flag(body)
        system = body.get("system")
        if system is not None and not isinstance(system, str | list):
            raise bad_request("system must be a string or an array of blocks.", param="system")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise bad_request("metadata must be an object.", param="metadata")
        user = optional_string((metadata or {}).get("user_id"), "metadata.user_id")
        index = next(
            (
                i
                for i in range(len(messages) - 1, -1, -1)
                if messages[i].get("role") == "user" and _says_something(messages[i])
            ),
            None,
        )
        return Turn(
            model=model,
            stream=stream,
            text=message_text(messages[index]) if index is not None else "",
            position=index or 0,
            param=f"messages[{index}]",
            window=[m for m in messages if m.get("role") in ("user", "assistant")],
            user=user,
            anchor=index,
            tool_exchanges=tool_exchanges(messages[index + 1 :]) if index is not None else (),
        )

    def inject(self, body: dict[str, Any], turn: Turn, memory: str) -> dict[str, Any]:
        system = body.get("system")
        if isinstance(system, list):
            return {**body, "system": [*system, {"type": "text", "text": memory}]}
        if isinstance(system, str) and system.strip():
            return {**body, "system": f"{system}\n\n{memory}"}
        return {**body, "system": memory}

    async def forward(
        self, upstream: Upstream, body: dict[str, Any], headers: Mapping[str, str], *, stream: bool
    ) -> httpx2.Response:
        url = upstream.settings.llm_messages_url or "/messages"
        return await upstream.post_json(
            url, body, headers, stream=stream, credential=API_KEY_HEADER
        )

    def reply_text(self, payload: dict[str, Any]) -> str:
        return reply_text(payload)

    def record_usage(self, call: LlmCall, payload: Mapping[str, Any] | None) -> None:
        if not isinstance(payload, Mapping):
            return
        usage = payload.get("usage")
        usage = usage if isinstance(usage, Mapping) else {}
        model = payload.get("model")
        call.record_usage(
            _count(usage.get("input_tokens")),
            _count(usage.get("output_tokens")),
            model if isinstance(model, str) else None,
        )

    def add_hits(self, payload: dict[str, Any], hits: list[dict[str, Any]]) -> None:
        payload["memory_hits"] = hits

    def stream_with_hits(
        self, chunks: AsyncIterator[bytes], hits: list[dict[str, Any]]
    ) -> AsyncIterator[bytes]:
        return with_first_event_field(chunks, "memory_hits", hits, add=_into_message_start(hits))

    def stream_reader(self) -> MessagesStreamReader:
        return MessagesStreamReader()

    def stream_error(self, message: str, code: str) -> bytes:
        event = {"type": "error", "error": {"type": "api_error", "message": message, "code": code}}
        return f"event: error\ndata: {json.dumps(event)}\n\n".encode()

    def error_response(self, error: GatewayError) -> Response:
        kind = _ERROR_TYPES.get(error.status, "api_error")
        body = {
            "type": "error",
            "error": {
                "type": kind,
                "message": error.message,
                "code": error.code,
                "param": error.param,
            },
        }
        return JSONResponse(body, status_code=error.status, headers=error.headers)
