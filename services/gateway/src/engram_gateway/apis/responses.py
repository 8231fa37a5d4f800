"""The OpenAI Responses API (``POST /v1/responses``) as a turn adapter.

- The turn: ``input`` as a string, or the latest ``user`` message item's text
  (``input_text`` parts) in an ``input`` list; tool items (``function_call``,
  ``function_call_output``, ...) are never read as the person speaking. Its position
  counts the message items before it. The user: the body's ``user``.
- ``previous_response_id``: the upstream keeps the history, the request carries only the
  new items. Recall searches the new input alone, the new user item is the one
  recorded, and its identity comes from the response it follows
  (:func:`~engram_gateway.turns.chained_turn_key`), so a retry is stored once.
- Memory: appended to ``instructions`` (a new paragraph after the caller's own), not as
  an input item. ``instructions`` apply to this request only: the upstream does not
  keep them in a chain's stored history, so the memory recalled for this turn is not
  replayed with every later turn of a ``previous_response_id`` chain (an input item
  would be, stale and paid for again), and the model reads it as the system/developer
  text it is.
- The reply: the ``output_text`` parts of its ``message`` output items, whole or from
  the ``response.completed`` event of a stream (complete only with that event).
  ``memory_hits`` on the response's top level, and on the stream's first event.
- Errors: OpenAI-shaped, as the Responses API's own.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2
from starlette.responses import Response

from engram_core.genai import LlmCall
from engram_gateway.apis.chat_completions import optional_string, require_model, require_stream_flag
from engram_gateway.errors import GatewayError, bad_request
from engram_gateway.sse import SseEvents, json_object, with_first_event_field
from engram_gateway.turn_pipeline import ToolExchange, Turn, tool_exchange_text
from engram_gateway.turns import chained_turn_key
from engram_gateway.upstream import Upstream


def _is_message(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("type", "message") == "message"
        and item.get("role") in ("user", "assistant", "system", "developer")
    )


def item_text(item: Mapping[str, Any]) -> str:
    """A message item's text: a string content, or its text parts."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        part["text"]
        for part in content
        if isinstance(part, dict)
        and part.get("type") in ("input_text", "output_text", "text")
        and isinstance(part.get("text"), str)
    )


def tool_exchanges(items: list[Any]) -> tuple[ToolExchange, ...]:
    """The ``function_call_output`` items, each with the ``function_call`` it answers."""
    typed = [item for item in items if isinstance(item, dict)]
    calls = {i.get("call_id"): i for i in typed if i.get("type") == "function_call"}
    return tuple(
        ToolExchange(
            str(item.get("call_id")),
            tool_exchange_text(
                calls.get(item.get("call_id"), {}).get("name", ""),
                calls.get(item.get("call_id"), {}).get("arguments", ""),
                item.get("output"),
            ),
        )
        for item in typed
        if item.get("type") == "function_call_output"
    )


def output_text(response: Mapping[str, Any]) -> str:
    """The assistant's text in a response object."""
    output = response.get("output")
    if not isinstance(output, list):
        return ""
    return "".join(
        item_text(item)
        for item in output
        if _is_message(item) and isinstance(item, dict) and item.get("role") == "assistant"
    )


def _usage(call: LlmCall, response: Mapping[str, Any] | None) -> None:
    if not isinstance(response, Mapping):
        return
    usage = response.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    model = response.get("model")
    call.record_usage(
        _count(usage.get("input_tokens")),
        _count(usage.get("output_tokens")),
        model if isinstance(model, str) else None,
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ResponsesStreamReader:
    """Responses' typed events: the reply is the ``response.completed`` event's response."""

    def __init__(self) -> None:
        self._events = SseEvents()
        self._deltas: list[str] = []
        self.final: dict[str, Any] | None = None
        self.error: Any = None

    def feed(self, chunk: bytes) -> None:
        for _, data in self._events.feed(chunk):
            event = json_object(data)
            if event is None:
                continue
            kind = event.get("type")
            if kind == "response.output_text.delta" and isinstance(event.get("delta"), str):
                self._deltas.append(event["delta"])
            elif kind == "response.completed" and isinstance(event.get("response"), dict):
                self.final = event["response"]
            elif kind in ("error", "response.failed", "response.incomplete"):
                self.error = event.get("error") or event.get("response") or kind

    def text(self) -> str:
        return output_text(self.final) if self.final is not None else "".join(self._deltas)

    @property
    def done(self) -> bool:
        return self.final is not None

    @property
    def complete(self) -> bool:
        return self.error is None and self.final is not None

    @property
    def usage(self) -> Mapping[str, Any] | None:
        return self.final


def _first_event_hits(hits: list[dict[str, Any]]) -> Any:
    def add(payload: dict[str, Any]) -> bool:
        if not isinstance(payload.get("type"), str):
            return False
        payload["memory_hits"] = hits
        return True

    return add


class Responses:
    name = "responses"
    controls_in_metadata = True
    stream_media_type = "text/event-stream"

    def read_turn(self, body: dict[str, Any]) -> Turn:
        model = require_model(body)
        stream = require_stream_flag(body)
        user = optional_string(body.get("user"), "user")
        previous = optional_string(body.get("previous_response_id"), "previous_response_id")
        optional_string(body.get("instructions"), "instructions")
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
            param = "input"
        elif items is None:
            items = []
            param = "input"
        elif isinstance(items, list):
            param = ""
        else:
            raise bad_request("input must be a string or an array of items.", param="input")
        messages = [(i, item) for i, item in enumerate(items) if _is_message(item)]
        latest = next(
            (n for n in range(len(messages) - 1, -1, -1) if messages[n][1].get("role") == "user"),
            None,
        )
        text, position = "", 0
        tools: tuple[ToolExchange, ...] = ()
        if latest is not None:
            where, item = messages[latest]
            text = item_text(item)
            param = param or f"input[{where}]"
            position = sum(
                1 for _, m in messages[:latest] if m.get("role") in ("user", "assistant")
            )
            tools = tool_exchanges(items[where + 1 :])
        param = param or "input"
        return Turn(
            model=model,
            stream=stream,
            text=text,
            position=position,
            param=param,
            window=[{"content": item_text(m)} for _, m in messages],
            user=user,
            key=chained_turn_key(previous, position, text.strip()) if previous else None,
            tool_exchanges=tools,
        )

    def inject(self, body: dict[str, Any], turn: Turn, memory: str) -> dict[str, Any]:
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions.strip():
            return {**body, "instructions": f"{instructions}\n\n{memory}"}
        return {**body, "instructions": memory}

    async def forward(
        self, upstream: Upstream, body: dict[str, Any], headers: Mapping[str, str], *, stream: bool
    ) -> httpx2.Response:
        url = upstream.settings.llm_responses_url or "/responses"
        return await upstream.post_json(url, body, headers, stream=stream)

    def reply_text(self, payload: dict[str, Any]) -> str:
        return output_text(payload)

    def record_usage(self, call: LlmCall, payload: Mapping[str, Any] | None) -> None:
        _usage(call, payload)

    def add_hits(self, payload: dict[str, Any], hits: list[dict[str, Any]]) -> None:
        payload["memory_hits"] = hits

    def stream_with_hits(
        self, chunks: AsyncIterator[bytes], hits: list[dict[str, Any]]
    ) -> AsyncIterator[bytes]:
        return with_first_event_field(chunks, "memory_hits", hits, add=_first_event_hits(hits))

    def stream_reader(self) -> ResponsesStreamReader:
        return ResponsesStreamReader()

    def stream_error(self, message: str, code: str) -> bytes:
        event = {"type": "error", "code": code, "message": message, "param": None}
        return f"event: error\ndata: {json.dumps(event)}\n\n".encode()

    def error_response(self, error: GatewayError) -> Response:
        return error.response()
