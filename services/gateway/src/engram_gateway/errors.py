"""OpenAI-shaped errors: every failure the gateway returns is ``{"error": {...}}``.

Callers use OpenAI SDKs, which read ``error.message``/``type``/``code`` from the body;
a FastAPI ``{"detail": ...}`` or an HTML stack trace would surface as an opaque failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from engram_core.logging import get_logger
from engram_core.memory_port import RetrievalError

log = get_logger(__name__)

INVALID_REQUEST = "invalid_request_error"
UPSTREAM_ERROR = "upstream_error"
SERVICE_UNAVAILABLE = "service_unavailable"
SERVER_ERROR = "server_error"
PERMISSION_ERROR = "permission_error"


def error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    *,
    type: str,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> JSONResponse:
    body = error_body(message, type=type, code=code, param=param)
    if extra:
        body.update(extra)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


class GatewayError(Exception):
    """An error with the HTTP status and OpenAI-shaped body the caller should get."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def response(self) -> Response:
        return error_response(
            self.status,
            self.message,
            type=self.type,
            code=self.code,
            param=self.param,
            headers=self.headers,
        )


def bad_request(
    message: str, *, param: str | None = None, code: str = "invalid_request"
) -> GatewayError:
    return GatewayError(400, message, type=INVALID_REQUEST, code=code, param=param)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


async def _gateway_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        message = f"Unknown path: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"Method {request.method} not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    kind = INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
    return error_response(
        exc.status_code,
        message,
        type=kind,
        code=_HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}"),
        headers=exc.headers,
    )


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "header")]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid request")
    return error_response(
        400,
        f"{param}: {message}" if param else message,
        type=INVALID_REQUEST,
        code="invalid_request",
        param=param,
    )


async def _retrieval_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RetrievalError)
    status = exc.http_status
    if status == 503:
        log.warning("retrieval.call_failed", call=exc.call, code=exc.code.name)
        return error_response(
            503,
            f"The memory store is unavailable ({exc.call}: {exc.code.name}); retry later.",
            type=SERVICE_UNAVAILABLE,
            code="retrieval_unavailable",
        )
    codes = {400: "invalid_request", 404: "not_found", 409: "conflict"}
    return error_response(
        status,
        exc.details or f"{exc.call}: {exc.code.name}",
        type=INVALID_REQUEST,
        code=codes.get(status, "invalid_request"),
    )


def install_error_handlers(app: FastAPI) -> None:
    """Errors with a status of their own. An unexpected exception is answered by
    :class:`engram_gateway.guard.RequestGuardMiddleware` (a 500 that keeps the
    connection), never by Starlette's handler, which would re-raise and close it."""
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(RetrievalError, _retrieval_error)
