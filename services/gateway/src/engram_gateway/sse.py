"""Reading a streamed reply on the side while its bytes are relayed.

The gateway never re-encodes a stream: chunks go to the caller exactly as they arrive
(the one exception: the recalled hits added to the first event). The readers only
watch them to collect the assistant text for the turn event and to know whether the
reply completed: :class:`ChatStreamReader` for Chat Completions' ``data:`` chunks;
:class:`SseEvents` splits any server-sent-event stream (Responses' and Anthropic's
typed events) and :class:`NdjsonLines` a newline-delimited JSON one (Ollama's), for the
other APIs' readers (``engram_gateway.apis``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any


class ChatStreamReader:
    def __init__(self) -> None:
        self._buffer = b""
        self._texts: dict[int, list[str]] = {}
        self.finished: set[int] = set()  # choice indexes that sent a finish_reason
        self.done = False  # saw "data: [DONE]"
        self.error: Any = None  # an in-stream {"error": ...} payload
        #: The last chunk that reported usage (sent when the caller asked for
        #: ``stream_options.include_usage``), for the LLM call's span and metrics.
        self.usage_chunk: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        self._buffer = (self._buffer + chunk).replace(b"\r\n", b"\n")
        while (end := self._buffer.find(b"\n\n")) >= 0:
            block, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            self._event(block.decode("utf-8", "replace"))

    def _event(self, block: str) -> None:
        data = [
            line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")
        ]
        if not data:
            return
        payload = "\n".join(data)
        if payload.strip() == "[DONE]":
            self.done = True
            return
        try:
            event = json.loads(payload)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if "error" in event:
            self.error = event["error"]
        if isinstance(event.get("usage"), dict):
            self.usage_chunk = event
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            delta = choice.get("delta") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str) and content:
                self._texts.setdefault(index, []).append(content)
            if choice.get("finish_reason"):
                self.finished.add(index)

    def text(self, index: int = 0) -> str:
        return "".join(self._texts.get(index, ()))

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.usage_chunk

    @property
    def complete(self) -> bool:
        """The reply ended normally: ``[DONE]`` or a finish_reason on the first choice."""
        return self.error is None and (self.done or 0 in self.finished)


#: Adds a field to a first event's JSON in place; False: not the event to change.
AddField = Callable[[dict[str, Any]], bool]


def _chat_chunk_field(name: str, value: Any) -> AddField:
    def add(payload: dict[str, Any]) -> bool:
        if "choices" not in payload:
            return False
        payload[name] = value
        return True

    return add


async def with_first_event_field(
    chunks: AsyncIterator[bytes], name: str, value: Any, *, add: AddField | None = None
) -> AsyncIterator[bytes]:
    """The stream with ``name: value`` added to the JSON of its first chunk event (the
    gateway's one re-encoded event; official clients keep unknown fields of a chunk and
    otherwise ignore them). Everything after it passes through byte for byte; a stream
    whose first event is not a JSON object passes through unchanged. ``add``: how to
    add the field to another API's first event (default: a chat chunk's top level)."""
    add = add or _chat_chunk_field(name, value)
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        normalized = buffer.replace(b"\r\n", b"\n")
        end = normalized.find(b"\n\n")
        if end < 0:
            continue
        yield _with_field(normalized[: end + 2], add) + normalized[end + 2 :]
        break
    else:
        if buffer:
            yield buffer
        return
    async for chunk in chunks:
        yield chunk


def _with_field(event: bytes, add: AddField) -> bytes:
    lines = event.decode("utf-8", "replace").rstrip("\n").split("\n")
    data = [line for line in lines if line.startswith("data:")]
    if len(data) != 1:
        return event
    try:
        payload = json.loads(data[0][5:])
    except ValueError:
        return event
    if not isinstance(payload, dict) or not add(payload):
        return event
    encoded = "data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return ("\n".join(encoded if line is data[0] else line for line in lines) + "\n\n").encode()


async def with_first_line_field(
    lines: AsyncIterator[bytes], name: str, value: Any
) -> AsyncIterator[bytes]:
    """A newline-delimited JSON stream with ``name: value`` added to its first object;
    the rest byte for byte (a first line that is not a JSON object is left as it is)."""
    buffer = b""
    async for chunk in lines:
        buffer += chunk
        end = buffer.find(b"\n")
        if end < 0:
            continue
        first = buffer[:end]
        try:
            payload = json.loads(first)
        except ValueError:
            payload = None
        if isinstance(payload, dict):
            payload[name] = value
            first = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        yield first + buffer[end:]
        break
    else:
        if buffer:
            yield buffer
        return
    async for chunk in lines:
        yield chunk


class SseEvents:
    """Splits a server-sent-event stream into ``(event name, data)`` as bytes arrive."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> Iterator[tuple[str, str]]:
        self._buffer = (self._buffer + chunk).replace(b"\r\n", b"\n")
        while (end := self._buffer.find(b"\n\n")) >= 0:
            block, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            name, data = "", []
            for line in block.decode("utf-8", "replace").split("\n"):
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
            if data:
                yield name, "\n".join(data)


class NdjsonLines:
    """Splits a newline-delimited JSON stream into its objects as bytes arrive."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> Iterator[dict[str, Any]]:
        self._buffer += chunk
        while (end := self._buffer.find(b"\n")) >= 0:
            line, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                yield value


def json_object(data: str) -> dict[str, Any] | None:
    """An event's data as a JSON object, or None."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
