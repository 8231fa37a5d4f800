"""Which tenant a request acts for, and whether it may see across tenants — decided here
and nowhere else.

With API keys configured (``ENGRAM_API_KEYS`` / ``ENGRAM_API_KEYS_FILE``), every
request except the probes must carry ``Authorization: Bearer <key>`` (or, as Anthropic's
SDKs send their key, ``X-Api-Key: <key>`` when there is no bearer token); the key's hash
names the tenant, and a missing or unknown key is answered 401 before any route runs.
Without keys there is one tenant, ``default``, and no authentication (local use).
Routes call :func:`resolve_tenant`; the tenant then travels in every RPC and event.

Memories stored while Engram ran without keys belong to tenant ``default``; once keys
are configured only a key mapped to ``default`` reaches them.
:func:`warn_of_unreachable_default_tenant` says so at start when they exist.

Figures shared by every tenant (the workers' queues, every tenant's dead letters) are
an operator's: routes that show them call :func:`require_admin`, which answers 403
unless the key's entry carries ``:admin`` (engram_gateway.keys). Without keys the
local operator is the admin.
"""

from __future__ import annotations

import asyncio
import json

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from engram_core.logging import get_logger
from engram_core.memory import MemoryFilter
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_gateway.errors import INVALID_REQUEST, PERMISSION_ERROR, GatewayError, error_body
from engram_gateway.keys import Caller, KeyTable

log = get_logger(__name__)

DEFAULT_TENANT = "default"
#: Probes and the Prometheus scrape answer without a key: the kubelet and Prometheus have
#: none (metrics carry no memory content; keep /metrics off the public ingress). So do the
#: memory browser's static page and assets (no memory data; the page's API calls carry
#: the key the user signs in with).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/readyz/memory", "/metrics", "/", "/ui"})
OPEN_PREFIXES = ("/ui/",)
_TENANT = "tenant"
_ADMIN = "admin"
#: Who a request acts for when no keys are configured: the local operator.
LOCAL_OPERATOR = Caller(DEFAULT_TENANT, admin=True)


async def warn_of_unreachable_default_tenant(
    memories: MemoryPort, keys: KeyTable, *, attempts: int = 30, interval_s: float = 2.0
) -> int:
    """With keys configured and none for tenant ``default``, log a warning when that
    tenant holds memories (stored single-tenant, now out of every key's reach); return
    how many it holds. Retrieval may still be starting: tried ``attempts`` times, then
    left unsaid (-1) — a hint at start, not a check."""
    if DEFAULT_TENANT in keys.tenants:
        return 0
    for attempt in range(attempts):
        try:
            held = (await memories.count(DEFAULT_TENANT, MemoryFilter())).total
        except RetrievalError as exc:
            if attempt + 1 < attempts:
                await asyncio.sleep(interval_s)
                continue
            log.info("auth.default_tenant_not_counted", error=str(exc))
            return -1
        if held:
            log.warning(
                "auth.default_tenant_unreachable",
                tenant=DEFAULT_TENANT,
                memories=held,
                detail=f"{held} memories were stored without API keys (tenant "
                f"'{DEFAULT_TENANT}') and no configured key maps to '{DEFAULT_TENANT}': no "
                "request can reach them. To keep them, add a key entry ending in "
                f"'={DEFAULT_TENANT}' (python -m engram_gateway.keys new {DEFAULT_TENANT}); "
                "docs/api.md, 'Authentication and tenants'.",
            )
        return held
    return -1


async def resolve_tenant(request: Request) -> str:
    tenant = request.scope.get("state", {}).get(_TENANT)
    if not isinstance(tenant, str):
        # Only the probes skip the middleware, and they never ask.
        raise RuntimeError("no tenant resolved for this request")
    return tenant


def is_admin(request: Request) -> bool:
    """Whether the request's key may see figures shared by every tenant."""
    return request.scope.get("state", {}).get(_ADMIN) is True


async def require_admin(request: Request) -> None:
    """403 (OpenAI-shaped) unless the request's key is an admin key."""
    if not is_admin(request):
        raise GatewayError(
            403,
            "This endpoint shows figures shared by every tenant and needs an admin key "
            "(an API key entry ending in ':admin'; see docs/gateway.md). Your key reads and "
            "writes its own tenant's memories only.",
            type=PERMISSION_ERROR,
            code="admin_key_required",
        )


def is_open(path: str) -> bool:
    """Paths answered without an API key."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def bearer_token(authorization: str) -> str | None:
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class ApiKeyMiddleware:
    """Resolves the tenant of every HTTP request; 401 (OpenAI-shaped) without a valid key."""

    def __init__(self, app: ASGIApp, keys: KeyTable | None) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if self.keys is None:
            state[_TENANT], state[_ADMIN] = LOCAL_OPERATOR.tenant, LOCAL_OPERATOR.admin
        elif not is_open(scope["path"]):
            token = _presented_key(scope["headers"])
            caller = self.keys.caller_for(token) if token else None
            if caller is None:
                await _unauthorized(send, missing=token is None)
                return
            state[_TENANT], state[_ADMIN] = caller.tenant, caller.admin
        await self.app(scope, receive, send)


def _presented_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The bearer token, else the ``X-Api-Key`` value (Anthropic's SDKs and the agents
    built on them send their key only there)."""
    found = {k: v for k, v in headers if k in (b"authorization", b"x-api-key")}
    if b"authorization" in found:
        token = bearer_token(found[b"authorization"].decode("latin-1"))
        if token:
            return token
    api_key = found.get(b"x-api-key", b"").decode("latin-1").strip()
    return api_key or None


async def _unauthorized(send: Send, *, missing: bool) -> None:
    # The key itself is never echoed nor logged.
    message = (
        "Missing API key: send it as 'Authorization: Bearer <key>' (or 'X-Api-Key: <key>'). "
        "The upstream LLM key, if needed, goes in 'X-Upstream-Authorization'."
        if missing
        else "Invalid API key."
    )
    body = json.dumps(error_body(message, type=INVALID_REQUEST, code="invalid_api_key")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
