"""The OpenAI Chat Completions API (``POST /v1/chat/completions``) as a turn adapter.

- The turn: the latest ``user`` message's text (a string content, or the text parts of
  a content array); its position counts the user/assistant messages before it. The
  user: the body's ``user``.
- Memory: one system message right before the latest user message (a prefix the
  upstream can cache stays as it was).
- The reply: ``choices[0].message`` whole; the ``delta.content`` of choice 0 streamed
  (complete at ``[DONE]`` or a finish_reason). ``memory_hits`` on the reply's top
  level, and on the first chunk when streamed.
- Errors: the gateway's own, OpenAI-shaped.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2
from starlette.responses import Response

from engram_core.genai import LlmCall
from engram_gateway.errors import UPSTREAM_ERROR, GatewayError, bad_request
from engram_gateway.recall import conversation_position, inject, latest_user_index, message_text
from engram_gateway.sse import ChatStreamReader, with_first_event_field
from engram_gateway.turn_pipeline import Turn
from engram_gateway.upstream import Upstream


def require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(
            "You must provide a model parameter (a non-empty string).",
            param="model",
            code="missing_required_parameter",
        )
    return model


def require_stream_flag(body: dict[str, Any], *, default: bool = False) -> bool:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("stream must be a boolean.", param="stream")
    return default if stream is None else stream


def require_messages(body: dict[str, Any]) -> list[Any]:
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
    return messages


def optional_string(value: Any, param: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise bad_request(f"{param} must be a string.", param=param)
    return value


def system_message_before_question(body: dict[str, Any], turn: Turn, memory: str) -> dict[str, Any]:
    """The body with one system message right before ``messages[turn.anchor]`` (a prefix
    the upstream can cache stays as it was)."""
    if turn.anchor is None:
        return body
    message = {"role": "system", "content": memory}
    return {**body, "messages": inject(body["messages"], turn.anchor, message)}


def assistant_text(payload: dict[str, Any]) -> str:
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices:
        return ""
    first = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), choices[0])
    return message_text(first.get("message")) if isinstance(first, dict) else ""


class ChatCompletions:
    name = "chat"
    controls_in_metadata = False
    stream_media_type = "text/event-stream"

    def read_turn(self, body: dict[str, Any]) -> Turn:
        """Only what the gateway itself relies on; the upstream judges the rest."""
        model = require_model(body)
        messages = require_messages(body)
        user = optional_string(body.get("user"), "user")
        stream = require_stream_flag(body)
        index = latest_user_index(messages)
        return Turn(
            model=model,
            stream=stream,
            text=message_text(messages[index]) if index is not None else "",
            position=conversation_position(messages, index),
            param=f"messages[{index}]",
            window=messages,
            user=user,
            anchor=index,
        )

    def inject(self, body: dict[str, Any], turn: Turn, memory: str) -> dict[str, Any]:
        return system_message_before_question(body, turn, memory)

    async def forward(
        self, upstream: Upstream, body: dict[str, Any], headers: Mapping[str, str], *, stream: bool
    ) -> httpx2.Response:
        return await upstream.chat(body, headers, stream=stream)

    def reply_text(self, payload: dict[str, Any]) -> str:
        return assistant_text(payload)

    def record_usage(self, call: LlmCall, payload: Mapping[str, Any] | None) -> None:
        call.record_reply(payload)

    def add_hits(self, payload: dict[str, Any], hits: list[dict[str, Any]]) -> None:
        payload["memory_hits"] = hits

    def stream_with_hits(
        self, chunks: AsyncIterator[bytes], hits: list[dict[str, Any]]
    ) -> AsyncIterator[bytes]:
        return with_first_event_field(chunks, "memory_hits", hits)

    def stream_reader(self) -> ChatStreamReader:
        return ChatStreamReader()

    def stream_error(self, message: str, code: str) -> bytes:
        body = {"error": {"message": message, "type": UPSTREAM_ERROR, "param": None, "code": code}}
        return f"data: {json.dumps(body)}\n\n".encode()

    def error_response(self, error: GatewayError) -> Response:
        return error.response()
