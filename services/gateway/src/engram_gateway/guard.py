"""The last line of defence of every HTTP request: no error may break the connection.

:class:`RequestGuardMiddleware` sits just inside the request-id middleware and

- bounds the time a client may take to send its request body
  (``ENGRAM_GATEWAY_BODY_TIMEOUT_S``): a half-sent body gets 408 and the connection
  is closed, instead of holding it (and a worker slot) open;
- answers an error nobody handled with an OpenAI-shaped 500 and *returns*: Starlette's
  own last-resort handler sends its 500 and then re-raises, and the server closes a
  connection whose application raised, so the client's next request on that
  keep-alive connection would fail with "server disconnected";
- logs a client that hangs up mid-request as one info line, not as tracebacks.

A failure after the response started (mid-stream) cannot be answered any more; it is
logged and the connection is closed, which is the only honest end of a broken stream.
"""

from __future__ import annotations

import asyncio
import json
import time

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_core.logging import get_logger
from engram_gateway.errors import INVALID_REQUEST, SERVER_ERROR, error_body

log = get_logger(__name__)


class _BodyTimeout(Exception):
    """The client did not finish sending its body in time."""


def _json_response(status: int, body: dict[str, object], *, close: bool) -> list[Message]:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    return [
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": payload},
    ]


class RequestGuardMiddleware:
    def __init__(self, app: ASGIApp, *, body_timeout_s: float) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.body_timeout_s
        state = {"started": False, "body_done": False, "timed_out": False}

        async def guarded_receive() -> Message:
            if state["timed_out"]:
                return {"type": "http.disconnect"}
            if state["body_done"]:
                return await receive()  # waiting for a disconnect: no deadline
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                state["timed_out"] = True
                raise _BodyTimeout from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["body_done"] = True
            return message

        async def guarded_send(message: Message) -> None:
            if state["timed_out"] and not state["started"]:
                return  # the 408 is ours to send
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except (_BodyTimeout, ClientDisconnect) as exc:
            await self._client_problem(scope, send, state, exc)
            return
        except Exception:
            if state["started"]:
                log.exception("request.failed_mid_response", path=scope.get("path"))
                raise
            log.exception("request.unhandled_error", path=scope.get("path"))
            body = error_body(
                "The gateway hit an internal error.", type=SERVER_ERROR, code="internal_error"
            )
            for message in _json_response(500, body, close=False):
                await send(message)
            return
        if state["timed_out"]:
            # The app turned the timeout into an answer of its own (dropped): ours is 408.
            await self._client_problem(scope, send, state, _BodyTimeout())

    async def _client_problem(
        self, scope: Scope, send: Send, state: dict[str, bool], exc: BaseException
    ) -> None:
        if isinstance(exc, _BodyTimeout):
            log.info("request.body_timeout", path=scope.get("path"), timeout_s=self.body_timeout_s)
            if not state["started"]:
                state["started"] = True
                body = error_body(
                    f"The request body was not received within {self.body_timeout_s:g} s.",
                    type=INVALID_REQUEST,
                    code="request_timeout",
                )
                for message in _json_response(408, body, close=True):
                    await send(message)
            return
        # The client hung up (mid-upload, or before the answer): nobody to answer.
        log.info("request.client_gone", path=scope.get("path"), error=type(exc).__name__)
