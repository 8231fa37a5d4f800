"""The other ``/v1/*`` requests the operator allows (``ENGRAM_GATEWAY_PASSTHROUGH``,
default ``models`` and ``embeddings``) relayed to the upstream: method, path (checked and
re-encoded, below), query, body and the allowed headers (:mod:`engram_gateway.upstream`);
the response status, headers and body come back unchanged and streamed. Only a
transport failure is the gateway's to report (502 unreachable, 504 timeout).

An allowlist, not a catch-all: the upstream key is the operator's and the upstream
knows no tenants, so relaying files, batches, assistants, ... would let every tenant
see and change the same upstream objects. Any other path is a 404 (OpenAI-shaped).

The path is checked and forwarded as one thing (:func:`forwarded_path`): the caller's
raw path is split into segments, each decoded once, and the segments are re-encoded
into the path that is sent; the allowlist is checked on that path's first segment. A
path that could name something else after the check is a 404 and is never sent: a dot
segment (``.``/``..``, raw or percent-encoded in any case, also before a ``;``), an
encoded slash or a backslash (``%2f``, ``%5c``, ``\\``), a NUL or other control byte,
or any of these once decoded a second time (``%252e%252e``), since the HTTP client and
the servers behind it resolve such segments, so ``/v1/models/../../x`` would otherwise
reach ``/x`` upstream with the operator's key.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import suppress
from urllib.parse import quote_from_bytes, unquote_to_bytes

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from engram_gateway.bodies import read_body
from engram_gateway.deps import AppState
from engram_gateway.errors import INVALID_REQUEST, GatewayError
from engram_gateway.upstream import response_headers

router = APIRouter()

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


#: RFC 3986 ``pchar`` beyond the unreserved characters: left as they are in a segment.
_SEGMENT_SAFE = "!$&'()*+,;=:@"
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")


def _unsafe_segment(value: bytes) -> bool:
    """A decoded segment that some resolver would not take as a plain name."""
    if b"/" in value or b"\\" in value or _CONTROL.search(value):
        return True
    return value.split(b";", 1)[0] in (b".", b"..")


def forwarded_path(raw_path: bytes) -> tuple[str, str] | None:
    """``(first segment, path)``: the path after ``/v1`` as it will be sent upstream
    (each segment decoded once and re-encoded), or None for a path that must not be
    sent (see the module docstring)."""
    text = raw_path.decode("latin-1").split("?", 1)[0]
    if not text.startswith("/v1/"):
        return None
    segments = []
    for raw_segment in text.removeprefix("/v1/").split("/"):
        if "\\" in raw_segment:
            return None
        value = unquote_to_bytes(raw_segment)
        if _unsafe_segment(value) or _unsafe_segment(unquote_to_bytes(value)):
            return None
        segments.append(value)
    first = segments[0].decode("utf-8", "replace")
    return first, "/" + "/".join(quote_from_bytes(s, safe=_SEGMENT_SAFE) for s in segments)


def _unknown_path(request: Request) -> GatewayError:
    return GatewayError(
        404,
        f"Unknown path: {request.method} {request.url.path}",
        type=INVALID_REQUEST,
        code="not_found",
    )


@router.api_route("/v1/{path:path}", methods=METHODS, include_in_schema=False)
async def passthrough(request: Request, state: AppState, path: str) -> Response:
    checked = forwarded_path(request.scope.get("raw_path") or request.url.path.encode())
    if checked is None or checked[0] not in state.settings.gateway_passthrough:
        raise _unknown_path(request)
    query = request.scope.get("query_string", b"").decode("latin-1")
    content = await read_body(request, state.settings.gateway_max_body_bytes)
    upstream = await state.upstream.send(
        request.method, checked[1] + (f"?{query}" if query else ""), content, request.headers
    )

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            with suppress(Exception):
                await upstream.aclose()

    return StreamingResponse(
        relay(), status_code=upstream.status_code, headers=response_headers(upstream.headers)
    )
