"""Reading request bodies: bounded in size, JSON objects only, valid Unicode, bounded
in depth and in width.

JSON allows escapes that are not text: a lone surrogate (``"\ud800"``) parses into a
Python string that cannot be encoded again, and would fail deep in the write path (a
500). JSON nested deeper than the parser's recursion limit fails with a
``RecursionError`` instead of a parse error. Both are 400s ``invalid_json`` here,
naming where; so is a body that is not UTF-8 (never FastAPI's bare ``http_400``).

Width: parsing and checking JSON holds the event loop (the parser is C code that keeps
the GIL, so a thread would not help), and a body of small values costs far more parsed
than raw (31 MB of ``0,`` is 16 million list slots). Before any parse, a count that
costs milliseconds (commas and opening brackets, an upper bound on the number of
values) refuses a body of more than :data:`MAX_JSON_VALUES` values with a 413
``too_many_json_values``; what one request may cost is then bounded by
``ENGRAM_GATEWAY_MAX_BODY_BYTES`` raw and by that many values parsed. The walk that
checks depth and text visits each value once and builds a path only for containers.
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
#: Values in one JSON body (every string, number, array and object counts). A chat of
#: thousands of messages with tools holds some tens of thousands; commas inside
#: strings count too (the bound is counted before parsing), and a million of them
#: needs some 30 MB of prose, more than any model's context.
MAX_JSON_VALUES = 1_000_000
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_json_width(raw: bytes) -> None:
    """413 for a body that may hold more than :data:`MAX_JSON_VALUES` values, counted
    without parsing: each value but the first of a container follows a comma."""
    bound = 1 + raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if bound > MAX_JSON_VALUES:
        raise GatewayError(
            413,
            f"The request body holds more than {MAX_JSON_VALUES:,} JSON values (commas and "
            "opening brackets counted); nothing was forwarded or stored.",
            type=INVALID_REQUEST,
            code="too_many_json_values",
        )


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity; they are not JSON and no upstream would take them.
    raise ValueError(f"{name} is not valid JSON")


def _where(path: tuple[str | int, ...]) -> str:
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
    return text.lstrip(".") or "the body"


_NOT_TEXT = "contains a lone surrogate (\\ud800-\\udfff), not text"
#: A surrogate only parses from a ``\\uD800``-``\\uDFFF`` escape (UTF-8 cannot carry one).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SCALARS = frozenset({int, float, bool, type(None)})


def json_problem(value: Any, *, check_text: bool = True) -> tuple[str, str] | None:
    """The first (where, what) that makes parsed JSON unusable, or None.

    ``check_text=False``: the raw body had no surrogate escape, so strings need no look.
    Containers whose values are all plain (counted by type, at C speed) are not walked.
    """
    plain = _SCALARS if check_text else _SCALARS | {str}
    if isinstance(value, str):
        return ("the body", _NOT_TEXT) if check_text and _SURROGATE.search(value) else None
    containers: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while containers:
        item, path = containers.pop()
        # A value deeper than the limit: this container, or a child of one at the limit.
        if len(path) > MAX_JSON_DEPTH or (len(path) == MAX_JSON_DEPTH and item):
            return _where(path[:1]), f"is nested deeper than {MAX_JSON_DEPTH} levels"
        children: Any
        if isinstance(item, dict):
            if check_text and any(_SURROGATE.search(key) for key in item):
                return _where(path), "has a key with a lone surrogate, not text"
            if plain.issuperset(map(type, item.values())):
                continue
            children = item.items()
        else:
            if plain.issuperset(map(type, item)):
                continue
            children = enumerate(item)
        for where, child in children:
            if isinstance(child, str):
                if check_text and _SURROGATE.search(child):
                    return _where((*path, where)), _NOT_TEXT
            elif isinstance(child, dict | list):
                containers.append((child, (*path, where)))
    return None


def parse_json(raw: bytes) -> Any:
    """Any JSON value; a 400 naming the problem for malformed, too deep or non-text JSON,
    a 413 for too wide."""
    check_json_width(raw)
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
    check_text = _SURROGATE_ESCAPE.search(raw) is not None
    if (problem := json_problem(value, check_text=check_text)) is not None:
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
    """Raise for JSON that is too wide, too deep, not UTF-8 or not text; malformed JSON
    is FastAPI's to report (with the field it expected)."""
    check_json_width(raw)
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        parse_json(raw)  # raises the 400
        return
    except UnicodeDecodeError as exc:
        # FastAPI would answer a bare 400 "There was an error parsing the body".
        raise bad_request(
            f"The request body is not valid UTF-8 ({exc.reason} at byte {exc.start}).",
            code="invalid_json",
        ) from None
    except ValueError:
        return
    if json_problem(value, check_text=_SURROGATE_ESCAPE.search(raw) is not None) is not None:
        parse_json(raw)  # raises the 400 naming where
