"""``/mcp`` on the gateway: the MCP server of :mod:`engram_client.mcp_tools` over
streamable HTTP (``ENGRAM_GATEWAY_MCP``, on by default).

The API key middleware guards ``/mcp`` like any other path (``Authorization: Bearer
<key>``; 401 before MCP sees the request). Each tool then calls the gateway's own HTTP
API through an in-process ASGI transport carrying the caller's ``Authorization``, so a
tool call is authorised, tenant-scoped, validated and logged exactly like the HTTP call
it makes; with the HTTP client instrumented, it is also one trace: the ``POST /mcp``
server span, the tool's client span, the inner API request and its retrieval and
JetStream spans.

Stateless: every request stands alone (no MCP session to pin to a replica), answered
with one JSON body. DNS-rebinding protection (Host/Origin checks) is on when the gateway
binds a loopback address, the SDK's rule.

Built on the first ``/mcp`` request, not at start: the MCP SDK and its schema types are
about 21 MB resident that a gateway nobody calls ``/mcp`` on never needs
(docs/benchmarks.md, footprint). The SDK's session manager then runs in a task of its
own until the gateway stops (its task group must be left by the task that entered it,
so not by the request that happened to start it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import TYPE_CHECKING

import httpx2
from fastapi import FastAPI
from opentelemetry.trace import TracerProvider
from starlette.routing import Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from engram_core.logging import get_logger
from engram_gateway.upstream import instrument_http_client

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

MCP_PATH = "/mcp"
#: The in-process API's base URL: never resolved, the transport calls the app directly.
INTERNAL_BASE_URL = "http://engram-gateway.internal"

log = get_logger(__name__)


class LazyMcp:
    """The ``/mcp`` endpoint: builds the MCP server and starts its session manager on the
    first request, then hands every request to the SDK's routes."""

    def __init__(self, app: FastAPI, host: str, tracer_provider: TracerProvider | None) -> None:
        self.app = app
        self.host = host
        self.tracer_provider = tracer_provider
        self._routes: ASGIApp | None = None
        self._starting = asyncio.Lock()
        self._stop = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._client: httpx2.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        routes = self._routes or await self._start()
        await routes(scope, receive, send)

    async def _start(self) -> ASGIApp:
        async with self._starting:
            if self._routes is not None:
                return self._routes
            from engram_client.mcp_tools import GatewayApi, build_mcp_server

            client = httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=self.app),
                base_url=INTERNAL_BASE_URL,
                timeout=None,
            )
            instrument_http_client(client, self.tracer_provider)
            self._client = client
            server = build_mcp_server(GatewayApi(client, forward_authorization=True))
            http_app = server.streamable_http_app(
                streamable_http_path=MCP_PATH,
                stateless_http=True,
                json_response=True,
                host=self.host,
            )
            started = asyncio.get_running_loop().create_future()
            runner = asyncio.create_task(self._run(server, started), name="mcp-sessions")
            try:
                await started
            except BaseException:
                # This request fails; the next one starts afresh.
                self._client = None
                await client.aclose()
                with suppress(BaseException):
                    await runner
                raise
            self._runner = runner
            self._routes = Router(routes=list(http_app.routes))
            return self._routes

    async def _run(self, server: MCPServer, started: asyncio.Future[None]) -> None:
        try:
            async with server.session_manager.run():
                started.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    async def stop(self) -> None:
        """Stop the session manager if a request started it; its failure is logged, not
        raised: the gateway's shutdown goes on."""
        self._stop.set()
        if self._runner is not None:
            try:
                await self._runner
            except Exception:
                log.exception("mcp.sessions_failed")
        if self._client is not None:
            await self._client.aclose()


def mount_mcp(
    app: FastAPI, host: str, tracer_provider: TracerProvider | None = None
) -> AbstractAsyncContextManager[None]:
    """Add the ``/mcp`` route to ``app``; the returned context manager (entered in the
    app's lifespan) stops the MCP session manager, if a request started it."""
    endpoint = LazyMcp(app, host, tracer_provider)
    app.router.routes.append(Route(MCP_PATH, endpoint=endpoint))

    @asynccontextmanager
    async def running() -> AsyncIterator[None]:
        try:
            yield
        finally:
            await endpoint.stop()

    return running()
