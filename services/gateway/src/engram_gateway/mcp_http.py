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
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import httpx2
from fastapi import FastAPI
from opentelemetry.trace import TracerProvider

from engram_client.mcp_tools import GatewayApi, build_mcp_server
from engram_gateway.upstream import instrument_http_client

MCP_PATH = "/mcp"
#: The in-process API's base URL: never resolved, the transport calls the app directly.
INTERNAL_BASE_URL = "http://engram-gateway.internal"


def mount_mcp(
    app: FastAPI, host: str, tracer_provider: TracerProvider | None = None
) -> AbstractAsyncContextManager[None]:
    """Add the ``/mcp`` route to ``app``; the returned context manager (entered in the
    app's lifespan) opens the in-process client and runs the MCP session manager."""
    client = httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=app), base_url=INTERNAL_BASE_URL, timeout=None
    )
    server = build_mcp_server(GatewayApi(client, forward_authorization=True))
    http_app = server.streamable_http_app(
        streamable_http_path=MCP_PATH, stateless_http=True, json_response=True, host=host
    )
    app.router.routes.extend(http_app.routes)

    @asynccontextmanager
    async def running() -> AsyncIterator[None]:
        instrument_http_client(client, tracer_provider)
        try:
            async with server.session_manager.run():
                yield
        finally:
            await client.aclose()

    return running()
