"""Reading request bodies: bounded in size, JSON objects only, valid Unicode, bounded
in depth.

JSON allows escapes that are not text: a lone surrogate (``"\ud800"``) parses into a
Python string that cannot be encoded again, and would fail deep in the write path (a
500). JSON nested deeper than the parser's recursion limit fails with a
``RecursionError`` instead of a parse error. Both are 400s here, naming where.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_gateway.errors import INVALID_REQUEST, GatewayError, bad_request


def check_text_size(text: str, limit: int, param: str) -> None:
    """413 for a text that cannot travel in one event (``ENGRAM_MAX_TEXT_BYTES``)."""
    size = len(text.encode("utf-8"))
    if size > limit:
        raise GatewayError(
            413,
            f"{param} is {size} bytes; Engram records texts of at most {limit} bytes "
            "(ENGRAM_MAX_TEXT_BYTES). Nothing was forwarded or stored.",
            type=INVALID_REQUEST,
            code="text_too_large",
            param=param,
        )


def too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"Request body larger than {limit} bytes",
        type=INVALID_REQUEST,
        code="request_too_large",
    )


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


#: Deeper than any request Engram or an OpenAI-compatible upstream reads (JSON schemas
#: of tools included), and well inside the parser's recursion limit.
MAX_JSON_DEPTH = 64
_SURROGATE = re.compile("[\ud800-\udfff]")


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity; they are not JSON and no upstream would take them.
    raise ValueError(f"{name} is not valid JSON")


def _where(path: tuple[str | int, ...]) -> str:
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
    return text.lstrip(".") or "the body"


def json_problem(value: Any) -> tuple[str, str] | None:
    """The first (where, what) that makes parsed JSON unusable, or None."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            return _where(path[:1]), f"is nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return _where(path), "contains a lone surrogate (\\ud800-\\udfff), not text"
        elif isinstance(item, dict):
            for key, child in item.items():
                if _SURROGATE.search(key):
                    return _where(path), "has a key with a lone surrogate, not text"
                stack.append((child, (*path, key)))
        elif isinstance(item, list):
            stack.extend((child, (*path, index)) for index, child in enumerate(item))
    return None


def parse_json(raw: bytes) -> Any:
    """Any JSON value; a 400 naming the problem for malformed, too deep or non-text JSON."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise bad_request(
            f"The request body is nested too deeply (at most {MAX_JSON_DEPTH} levels).",
            code="invalid_json",
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(
            f"The request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if (problem := json_problem(value)) is not None:
        where, what = problem
        raise bad_request(
            f"Invalid request body: {where} {what}.", param=where, code="invalid_json"
        )
    return value


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise bad_request("The request body is empty; expected a JSON object.", code="invalid_json")
    value = parse_json(raw)
    if not isinstance(value, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return value


class BodyLimitMiddleware:
    """Bounds request bodies on paths whose body FastAPI reads itself (the memory API):
    413 before the whole body is buffered; a JSON body that is too deep or not text is
    a 400 here (:func:`parse_json`), before FastAPI parses it. Chat and pass-through
    check in ``read_body`` and :func:`parse_json_object`."""

    def __init__(self, app: ASGIApp, limit: int, prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.limit = limit
        self.prefixes = prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
        if declared.isdigit() and int(declared) > self.limit:
            await too_large(self.limit).response()(scope, receive, send)
            return
        # Buffered here (the limit bounds it), so an oversized chunked body is a 413 too.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await too_large(self.limit).response()(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body.strip():
            try:
                _check_json_text(body)
            except GatewayError as exc:
                await exc.response()(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _check_json_text(raw: bytes) -> None:
    """Raise for JSON that is too deep or not text; malformed JSON is FastAPI's to
    report (with the field it expected)."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        parse_json(raw)  # raises the 400
        return
    except (ValueError, UnicodeDecodeError):
        return
    if json_problem(value) is not None:
        parse_json(raw)  # raises the 400 naming where
