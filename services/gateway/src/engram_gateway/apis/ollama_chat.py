"""Ollama's native chat (``POST /api/chat``) as a turn adapter.

- The turn: the latest ``user`` message's ``content`` (``images`` ride beside it,
  untouched); ``tool`` messages are tools' results, never the person speaking. Its
  position counts the user/assistant messages before it. No user field: the user is
  Engram's user header (``ENGRAM_GATEWAY_USER_HEADER``).
- ``stream`` defaults to true, as in Ollama.
- Memory: one ``system`` message right before the latest user message, as for Chat
  Completions.
- The reply: ``message.content``, whole or from each streamed line (newline-delimited
  JSON; complete at the line with ``done: true``). ``memory_hits`` on the reply's top
  level, and on the stream's first line.
- Errors: Ollama's shape, ``{"error": "<message>"}``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2
from starlette.responses import JSONResponse, Response

from engram_core.genai import LlmCall
from engram_gateway.apis.chat_completions import require_model, system_message_before_question
from engram_gateway.errors import GatewayError, bad_request
from engram_gateway.recall import conversation_position, latest_user_index, message_text
from engram_gateway.sse import NdjsonLines, with_first_line_field
from engram_gateway.turn_pipeline import ToolExchange, Turn, tool_exchange_text
from engram_gateway.upstream import Upstream


def ollama_chat_url(base_url: str) -> str:
    """Ollama serves ``/api/chat`` beside its OpenAI-compatible ``/v1``."""
    return base_url.removesuffix("/v1") + "/api/chat"


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def tool_exchanges(messages: list[Any]) -> tuple[ToolExchange, ...]:
    """The ``tool`` messages, each with the call it answers: Ollama's calls carry no id,
    so the n-th result answers the n-th call."""
    calls = [
        call.get("function") or {}
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or ()
        if isinstance(call, dict)
    ]
    results = [m for m in messages if m.get("role") == "tool"]
    return tuple(
        ToolExchange(
            str(n),
            tool_exchange_text(
                (calls[n] if n < len(calls) else {}).get("name") or result.get("tool_name", ""),
                (calls[n] if n < len(calls) else {}).get("arguments", {}),
                result.get("content", ""),
            ),
        )
        for n, result in enumerate(results)
    )


class OllamaStreamReader:
    def __init__(self) -> None:
        self._lines = NdjsonLines()
        self._texts: list[str] = []
        self.last: dict[str, Any] | None = None
        self.done = False
        self.error: Any = None

    def feed(self, chunk: bytes) -> None:
        for line in self._lines.feed(chunk):
            if "error" in line:
                self.error = line["error"]
                continue
            message = line.get("message")
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                self._texts.append(message["content"])
            if line.get("done") is True:
                self.done, self.last = True, line

    def text(self) -> str:
        return "".join(self._texts)

    @property
    def complete(self) -> bool:
        return self.done and self.error is None

    @property
    def usage(self) -> Mapping[str, Any] | None:
        return self.last


class OllamaChat:
    name = "ollama"
    controls_in_metadata = False
    stream_media_type = "application/x-ndjson"

    def read_turn(self, body: dict[str, Any]) -> Turn:
        model = require_model(body)
        messages = body.get("messages", [])
        if not isinstance(messages, list):
            raise bad_request("messages must be an array.", param="messages")
        for position, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise bad_request(
                    f"messages[{position}] must be an object with a string role.",
                    param=f"messages[{position}]",
                )
        stream = body.get("stream", True)
        if not isinstance(stream, bool):
            raise bad_request("stream must be a boolean.", param="stream")
        index = latest_user_index(messages)
        return Turn(
            model=model,
            stream=stream,
            text=message_text(messages[index]) if index is not None else "",
            position=conversation_position(messages, index),
            param=f"messages[{index}]",
            window=messages,
            anchor=index,
            tool_exchanges=tool_exchanges(messages[index + 1 :]) if index is not None else (),
        )

    def inject(self, body: dict[str, Any], turn: Turn, memory: str) -> dict[str, Any]:
        return system_message_before_question(body, turn, memory)

    async def forward(
        self, upstream: Upstream, body: dict[str, Any], headers: Mapping[str, str], *, stream: bool
    ) -> httpx2.Response:
        settings = upstream.settings
        url = settings.llm_ollama_chat_url or ollama_chat_url(settings.llm_base_url)
        return await upstream.post_json(url, body, headers, stream=stream)

    def reply_text(self, payload: dict[str, Any]) -> str:
        return message_text(payload.get("message"))

    def record_usage(self, call: LlmCall, payload: Mapping[str, Any] | None) -> None:
        if not isinstance(payload, Mapping):
            return
        model = payload.get("model")
        call.record_usage(
            _count(payload.get("prompt_eval_count")),
            _count(payload.get("eval_count")),
            model if isinstance(model, str) else None,
        )

    def add_hits(self, payload: dict[str, Any], hits: list[dict[str, Any]]) -> None:
        payload["memory_hits"] = hits

    def stream_with_hits(
        self, chunks: AsyncIterator[bytes], hits: list[dict[str, Any]]
    ) -> AsyncIterator[bytes]:
        return with_first_line_field(chunks, "memory_hits", hits)

    def stream_reader(self) -> OllamaStreamReader:
        return OllamaStreamReader()

    def stream_error(self, message: str, code: str) -> bytes:
        return (json.dumps({"error": message, "code": code}) + "\n").encode()

    def error_response(self, error: GatewayError) -> Response:
        return JSONResponse(
            {"error": error.message}, status_code=error.status, headers=error.headers
        )
