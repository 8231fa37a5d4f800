"""Reading request bodies: bounded in size, JSON objects only."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_gateway.errors import INVALID_REQUEST, GatewayError, bad_request


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


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity; they are not JSON and no upstream would take them.
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise bad_request("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(
            f"The request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(value, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return value


class BodyLimitMiddleware:
    """Bounds request bodies on paths whose body FastAPI reads itself (the memory API):
    413 before the whole body is buffered. Chat and pass-through check in ``read_body``."""

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
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
