"""A typed Python client for Engram's memory API, sync (:class:`EngramClient`) and async
(:class:`AsyncEngramClient`): create, get, list (every page, filters kept), patch and
delete (with ``If-Match``), history, search, and add-then-wait for what was learned.

Requests and answers are the gateway's own models (engram_core.api_models), so the
client and the server validate the same shapes; an error answer is a typed exception
(engram_client.errors) carrying the API's ``code``. See docs/api.md, "Python client".
"""

from __future__ import annotations

from engram_client.async_client import AsyncEngramClient
from engram_client.calls import IfMatch, Memory
from engram_client.errors import (
    AuthenticationError,
    BadRequest,
    Conflict,
    EngramError,
    EventTimeout,
    GatewayUnreachable,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    PreconditionFailed,
    RateLimited,
    ServiceUnavailable,
)
from engram_client.sync_client import EngramClient
from engram_core.api_models import (
    Accepted,
    DeletedMemory,
    EventOut,
    MemoryHistory,
    MemoryList,
    MemoryOut,
    SearchHit,
    SearchResult,
)

__all__ = [
    "Accepted",
    "AsyncEngramClient",
    "AuthenticationError",
    "BadRequest",
    "Conflict",
    "DeletedMemory",
    "EngramClient",
    "EngramError",
    "EventOut",
    "EventTimeout",
    "GatewayUnreachable",
    "IfMatch",
    "Memory",
    "MemoryHistory",
    "MemoryList",
    "MemoryOut",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "PreconditionFailed",
    "RateLimited",
    "SearchHit",
    "SearchResult",
    "ServiceUnavailable",
]
