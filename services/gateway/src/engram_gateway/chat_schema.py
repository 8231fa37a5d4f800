"""What ``POST /v1/chat/completions`` documents in the OpenAPI schema.

The route reads its body itself (a transparent proxy forwards fields it does not know),
so FastAPI cannot derive the request schema: it is written here, covering what the
gateway checks (``model``, ``messages``, ``stream``, ``user``) and the memory controls,
and leaving every other field open. The responses are the upstream's completion (JSON
with ``memory_hits``, or an SSE stream) and the OpenAI-shaped errors, so clients and
the schema fuzz test know every status the route can answer.
"""

from __future__ import annotations

from typing import Any

from engram_core.api_models import USER_ID_SCHEMA, ErrorResponse

_FRACTION = {"type": "number", "minimum": 0, "maximum": 1}
#: A conversation name: no separators, no control characters, not a dot-file.
_CONVERSATION_PATTERN = r"^[^/\\\x00-\x1f\x7f.][^/\\\x00-\x1f\x7f]*$"

CHAT_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {"role": {"type": "string"}},
                "additionalProperties": True,
            },
        },
        "stream": {"type": "boolean"},
        "user": USER_ID_SCHEMA,
        "memory": {"type": "boolean"},
        "memory_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "pattern": _CONVERSATION_PATTERN,
        },
        "memory_top_k": {"type": "integer", "minimum": 1, "maximum": 100},
        "memory_recency_weight": _FRACTION,
        "memory_score_threshold": _FRACTION,
        "memory_mmr_lambda": _FRACTION,
        "memory_cross_session": {"type": "boolean"},
    },
    "additionalProperties": True,
}

_ERRORS = {
    400: "Invalid request (missing model or messages, a bad memory control, bad JSON)",
    401: "Missing or invalid API key",
    408: "The request body did not arrive in time",
    413: "The body, or the user message to record, is too large",
    502: "The upstream LLM is unreachable",
    503: "The event bus did not record the user turn (nothing was forwarded)",
    504: "The upstream LLM timed out",
}


def chat_openapi() -> tuple[dict[int | str, dict[str, Any]], dict[str, Any]]:
    """``responses`` and ``openapi_extra`` for the chat route."""
    responses: dict[int | str, dict[str, Any]] = {
        200: {
            "description": "The upstream's completion with memory_hits, or its SSE stream "
            "(stream: true). Upstream errors are relayed with their own status.",
            "content": {
                "application/json": {"schema": {"type": "object", "additionalProperties": True}},
                # One schema per server-sent event: its data is a chat.completion.chunk
                # (JSON) or the final "[DONE]".
                "text/event-stream": {
                    "schema": {
                        "type": "object",
                        "required": ["data"],
                        "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                    }
                },
            },
        },
        **{
            status: {"model": ErrorResponse, "description": text}
            for status, text in _ERRORS.items()
        },
    }
    extra = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": CHAT_REQUEST_SCHEMA}},
        }
    }
    return responses, extra
