"""Typed errors of the memory API: one exception class per kind of answer, each carrying
what the gateway said (``{"error": {"message", "type", "code", "param"}}``), so a caller
branches on a class or on ``code`` (``memory_not_found``, ``precondition_failed``, …),
never on message text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class EngramError(Exception):
    """The gateway answered with an error, or could not be reached (``status`` 0)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str | None = None,
        type: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{message} ({status} {code or type or 'error'})")
        self.message = message
        self.status = status
        self.code = code
        self.type = type
        self.param = param
        self.headers = dict(headers or {})

    @property
    def request_id(self) -> str | None:
        """The gateway's ``X-Request-Id`` of the failed call (quote it in a report)."""
        return self.headers.get("x-request-id")


class GatewayUnreachable(EngramError):
    """No answer: connection refused, reset or timed out."""


class BadRequest(EngramError):
    """400: the request is invalid (``param`` names what)."""


class AuthenticationError(EngramError):
    """401: no API key, or not one the gateway knows."""


class PermissionDenied(EngramError):
    """403: the key may not do this (an admin route without the ``:admin`` role)."""


class NotFound(EngramError):
    """404: no such memory or event for this tenant."""


class Conflict(EngramError):
    """409: the memory is not in a state that allows it (e.g. editing a superseded one)."""


class PreconditionFailed(EngramError):
    """412: ``If-Match`` names another version; :attr:`current_etag` is the one it has."""

    @property
    def current_etag(self) -> str | None:
        return self.headers.get("etag")


class PayloadTooLarge(EngramError):
    """413: a text or body over the gateway's limits."""


class RateLimited(EngramError):
    """429: slow down."""


class ServiceUnavailable(EngramError):
    """503 (and other 5xx): a dependency is down; retrying later may succeed."""


class EventTimeout(EngramError):
    """An added text was still being learned when the wait ran out (it goes on);
    :attr:`events` are the statuses last read."""

    def __init__(self, message: str, events: Sequence[Any]) -> None:
        super().__init__(message, status=0, code="event_timeout")
        self.events = list(events)


_BY_STATUS: dict[int, type[EngramError]] = {
    400: BadRequest,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    413: PayloadTooLarge,
    422: BadRequest,
    429: RateLimited,
}


def error_from_answer(status: int, body: Any, headers: Mapping[str, str]) -> EngramError:
    """The typed exception for an error answer (any body: a proxy's HTML page too)."""
    cls = _BY_STATUS.get(status, ServiceUnavailable if status >= 500 else EngramError)
    detail = body.get("error") if isinstance(body, dict) else None
    lowered = {k.lower(): v for k, v in headers.items()}
    if not isinstance(detail, dict):
        text = body if isinstance(body, str) else ""
        return cls(text[:200] or f"HTTP {status}", status=status, headers=lowered)
    return cls(
        str(detail.get("message") or f"HTTP {status}"),
        status=status,
        code=detail.get("code"),
        type=detail.get("type"),
        param=detail.get("param"),
        headers=lowered,
    )
