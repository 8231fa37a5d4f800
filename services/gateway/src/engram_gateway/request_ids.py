"""The request id: every request gets one (the caller's ``X-Request-Id``, else a new
one), every log line carries it, and every answer echoes it, errors included.

Event and memory ids derive from it, so a caller's id is never replaced: one that is
not 1 to 128 of ``A-Z a-z 0-9 . _ : -`` (a ``/``, a space, 129 characters, ...) is a
400 ``invalid_request_id`` before anything runs, which a retry with the same id gets
again (a silently made-up id would make each retry a new write). An empty header is
no id.

``RequestIdMiddleware`` is the outermost user middleware; the 500 of an unhandled
exception is sent inside it (by ``engram_gateway.guard.RequestGuardMiddleware``), so it
carries the id like every other answer. ``request_id_headers`` reads the id this
middleware put in the ASGI scope, for answers sent from outside it.
"""

from __future__ import annotations

import re
import uuid

import structlog
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_gateway.errors import INVALID_REQUEST, error_response
from engram_gateway.server_timing import stamp_arrival

REQUEST_ID_HEADER = "X-Request-Id"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id(request: Request) -> str:
    rid: str = request.scope["state"]["request_id"]
    return rid


def request_id_headers(request: Request) -> dict[str, str]:
    """``{"X-Request-Id": id}`` once the middleware has run, else nothing."""
    rid = request.scope.get("state", {}).get("request_id")
    return {REQUEST_ID_HEADER: rid} if rid else {}


class RequestIdMiddleware:
    """Give every request an id, put it on every log line and echo it in the response.

    Turn ids derive from it, so a client that retries with the same ``X-Request-Id``
    re-publishes the same events and JetStream de-duplicates them.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), ""
        )
        incoming = incoming.strip()
        refused = bool(incoming) and not _REQUEST_ID.match(incoming)
        # A refused request's answer carries an id of its own: the caller's is not one.
        rid = incoming if incoming and not refused else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        stamp_arrival(state)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = rid
            await send(message)

        if refused:
            await _invalid_request_id()(scope, receive, send_with_id)
            return
        with structlog.contextvars.bound_contextvars(request_id=rid):
            await self.app(scope, receive, send_with_id)


def _invalid_request_id() -> ASGIApp:
    return error_response(
        400,
        f"{REQUEST_ID_HEADER} must be 1 to 128 characters of A-Z a-z 0-9 . _ : - (the "
        "request's event ids derive from it); nothing was done.",
        type=INVALID_REQUEST,
        code="invalid_request_id",
        param=REQUEST_ID_HEADER,
    )
