"""The other ``/v1/*`` requests the operator allows (``ENGRAM_GATEWAY_PASSTHROUGH``,
default ``models`` and ``embeddings``) relayed to the upstream as is: method, path,
query, body and headers; the response status, headers and body come back unchanged
and streamed. Only a transport failure is the gateway's to report (502 unreachable,
504 timeout).

An allowlist, not a catch-all: the upstream key is the operator's and the upstream
knows no tenants, so relaying files, batches, assistants, ... would let every tenant
see and change the same upstream objects. Any other path is a 404 (OpenAI-shaped).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import suppress

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from engram_gateway.bodies import read_body
from engram_gateway.errors import INVALID_REQUEST, GatewayError
from engram_gateway.state import gateway_state
from engram_gateway.upstream import response_headers

router = APIRouter()

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def _path_and_query(request: Request) -> str:
    """The path after ``/v1``, as the caller encoded it, plus the raw query string."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    path = raw.decode("latin-1").split("?", 1)[0].removeprefix("/v1")
    query = request.scope.get("query_string", b"").decode("latin-1")
    return path + (f"?{query}" if query else "")


def _unknown_path(request: Request) -> GatewayError:
    return GatewayError(
        404,
        f"Unknown path: {request.method} {request.url.path}",
        type=INVALID_REQUEST,
        code="not_found",
    )


@router.api_route("/v1/{path:path}", methods=METHODS, include_in_schema=False)
async def passthrough(request: Request, path: str) -> Response:
    state = gateway_state(request)
    if path.split("/", 1)[0] not in state.settings.gateway_passthrough:
        raise _unknown_path(request)
    content = await read_body(request, state.settings.gateway_max_body_bytes)
    upstream = await state.upstream.send(
        request.method, _path_and_query(request), content, request.headers
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
