"""The scripted upstream's other APIs: a scripted answer as the OpenAI Responses API,
the Anthropic Messages API and Ollama's native chat send it, whole or streamed in each
API's own framing (typed SSE events, ``message_start … message_stop``, NDJSON), and a
scripted failure in each API's error shape. :mod:`engram_cli.stack.scripted_llm` serves them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

#: What a scripted reply is, seen from here: text, or a tool call (name, arguments, id).
ToolCallParts = tuple[str, dict[str, Any], str]


def _words(text: str) -> list[str]:
    parts = text.split(" ")
    return [word + " " for word in parts[:-1]] + [parts[-1]]


def _sse(events: list[dict[str, Any]]) -> Iterator[str]:
    for sequence, event in enumerate(events):
        event = {**event, "sequence_number": sequence} if "sequence_number" in event else event
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


# --- OpenAI Responses ------------------------------------------------------------------


def responses_reply(
    number: int, model: str, answer: str | ToolCallParts, *, stream: bool
) -> Response:
    response_id, item_id = f"resp_{number}", f"msg_{number}"
    if isinstance(answer, tuple):
        name, arguments, call_id = answer
        item: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{number}",
            "call_id": call_id,
            "name": name,
            "arguments": json.dumps(arguments),
            "status": "completed",
        }
        words = 1
    else:
        item = {
            "type": "message",
            "id": item_id,
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": answer, "annotations": []}],
        }
        words = len(answer.split())
    full = _response_object(response_id, model, [item], words, status="completed")
    if not stream:
        return JSONResponse(full)
    started = _response_object(response_id, model, [], 0, status="in_progress")
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started, "sequence_number": 0},
        {"type": "response.in_progress", "response": started, "sequence_number": 0},
    ]
    if isinstance(answer, tuple):
        events += [
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "arguments": "", "status": "in_progress"},
                "sequence_number": 0,
            },
            {
                "type": "response.function_call_arguments.delta",
                "item_id": item["id"],
                "output_index": 0,
                "delta": item["arguments"],
                "sequence_number": 0,
            },
            {
                "type": "response.function_call_arguments.done",
                "item_id": item["id"],
                "output_index": 0,
                "arguments": item["arguments"],
                "sequence_number": 0,
            },
        ]
    else:
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        events += [
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "status": "in_progress", "content": []},
                "sequence_number": 0,
            },
            {"type": "response.content_part.added", **where, "part": part, "sequence_number": 0},
            *(
                {
                    "type": "response.output_text.delta",
                    **where,
                    "delta": word,
                    "logprobs": [],
                    "sequence_number": 0,
                }
                for word in _words(answer)
            ),
            {
                "type": "response.output_text.done",
                **where,
                "text": answer,
                "logprobs": [],
                "sequence_number": 0,
            },
            {
                "type": "response.content_part.done",
                **where,
                "part": {**part, "text": answer},
                "sequence_number": 0,
            },
        ]
    events += [
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": item,
            "sequence_number": 0,
        },
        {"type": "response.completed", "response": full, "sequence_number": 0},
    ]
    return StreamingResponse(_sse(events), media_type="text/event-stream")


def _response_object(
    response_id: str, model: str, output: list[dict[str, Any]], words: int, *, status: str
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": words,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 10 + words,
        },
    }


def responses_error(status: int, message: str) -> Response:
    body = {"error": {"message": message, "type": "scripted_error", "param": None, "code": None}}
    return JSONResponse(body, status_code=status)


# --- Anthropic Messages ----------------------------------------------------------------


def messages_reply(
    number: int, model: str, answer: str | ToolCallParts, *, stream: bool
) -> Response:
    if isinstance(answer, tuple):
        name, arguments, call_id = answer
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": call_id,
            "name": name,
            "input": arguments,
        }
        stop, words = "tool_use", 1
    else:
        block = {"type": "text", "text": answer}
        stop, words = "end_turn", len(answer.split())
    message = {
        "id": f"msg_{number}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": words},
    }
    if not stream:
        return JSONResponse(message)
    started = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": started}]
    if isinstance(answer, tuple):
        events += [
            {"type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
            },
        ]
    else:
        events += [
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            *(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": w},
                }
                for w in _words(answer)
            ),
        ]
    events += [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": words},
        },
        {"type": "message_stop"},
    ]
    return StreamingResponse(_sse(events), media_type="text/event-stream")


def messages_error(status: int, message: str) -> Response:
    kind = "invalid_request_error" if status < 500 else "api_error"
    return JSONResponse(
        {"type": "error", "error": {"type": kind, "message": message}}, status_code=status
    )


# --- Ollama chat -----------------------------------------------------------------------


def ollama_reply(model: str, answer: str | ToolCallParts, *, stream: bool) -> Response:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if isinstance(answer, tuple):
        name, arguments, _ = answer
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": name, "arguments": arguments}}],
        }
        words = 1
    else:
        message, words = {"role": "assistant", "content": answer}, len(answer.split())
    final = {
        "model": model,
        "created_at": created,
        "done": True,
        "done_reason": "stop",
        "total_duration": 1000,
        "prompt_eval_count": 10,
        "eval_count": words,
    }
    if not stream:
        return JSONResponse({**final, "message": message})

    def lines() -> Iterator[str]:
        if isinstance(answer, tuple):
            yield (
                json.dumps(
                    {"model": model, "created_at": created, "message": message, "done": False}
                )
                + "\n"
            )
        else:
            for word in _words(answer):
                part = {"role": "assistant", "content": word}
                yield (
                    json.dumps(
                        {"model": model, "created_at": created, "message": part, "done": False}
                    )
                    + "\n"
                )
        yield json.dumps({**final, "message": {"role": "assistant", "content": ""}}) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def ollama_error(status: int, message: str) -> Response:
    return JSONResponse({"error": message}, status_code=status)
