"""The gateway's app factory. Nothing connects at import: the retrieval channel, the
NATS broker and the upstream HTTP client are built in the lifespan and closed on
shutdown (after the assistant turns still being published are given time to land).
An unreachable NATS does not stop start-up (:mod:`engram_gateway.bus_link`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, suppress
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from faststream.nats import NatsBroker
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.trace import TracerProvider, get_tracer

from engram_core.bus import make_broker
from engram_core.logging import get_logger
from engram_core.memory_port import MemoryPort
from engram_core.retrieval_client import RetrievalClient
from engram_core.telemetry import prefer_stable_semconv
from engram_core.urls import without_credentials
from engram_gateway import admin, browse_api, chat, health, memory_api, passthrough, ui
from engram_gateway.bodies import BodyLimitMiddleware
from engram_gateway.bus_link import BusLink
from engram_gateway.errors import install_error_handlers
from engram_gateway.guard import RequestGuardMiddleware
from engram_gateway.health import MemoryHealth
from engram_gateway.mcp_http import mount_mcp
from engram_gateway.request_ids import RequestIdMiddleware
from engram_gateway.settings import GatewaySettings
from engram_gateway.state import GatewayState
from engram_gateway.tenancy import (
    DEFAULT_TENANT,
    ApiKeyMiddleware,
    warn_of_unreachable_default_tenant,
)
from engram_gateway.turns import TurnPublisher
from engram_gateway.upstream import (
    Upstream,
    instrument_http_client,
    make_http_client,
    make_llm_client,
)

log = get_logger(__name__)

CLIENT_NAME = "engram-gateway"


async def _stop_broker(broker: NatsBroker) -> None:
    try:
        await broker.stop()  # drains: buffered publishes are flushed first
    except Exception as exc:
        # Draining needs a live connection; while NATS is down, just close.
        log.warning("gateway.nats_drain_failed", then="closing", error=repr(exc))
        with suppress(Exception):
            if not broker.connection.is_closed:
                await broker.connection.close()


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task


#: Opens the memories the gateway serves from, for as long as the app runs.
MemoryPortFactory = Callable[[GatewaySettings], AbstractAsyncContextManager[MemoryPort]]


@asynccontextmanager
async def retrieval_port(settings: GatewaySettings) -> AsyncIterator[MemoryPort]:
    """The retrieval service's memories over gRPC (the channel closed on the way out)."""
    client = RetrievalClient(
        settings.retrieval_address,
        timeout_s=settings.gateway_retrieval_timeout_s,
        keepalive_s=settings.grpc_keepalive_s,
        interactive=True,  # a person waits for each call: retrieval serves them first
        search_stream=settings.gateway_search_stream,
    )
    try:
        yield MemoryPort(client)
    finally:
        await client.close()


def create_app(
    settings: GatewaySettings,
    *,
    tracer_provider: TracerProvider | None = None,
    memory_port: MemoryPortFactory = retrieval_port,
) -> FastAPI:
    """Build the gateway. ``tracer_provider``: defaults to the global one (tests pass
    their own to capture spans). ``memory_port``: where memories come from, the
    retrieval service unless a caller (a test) hands in another port."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            memories = await stack.enter_async_context(memory_port(settings))

            broker = make_broker(settings.nats_url, client_name=CLIENT_NAME)
            stack.push_async_callback(_stop_broker, broker)
            bus = BusLink(settings, broker)
            stack.push_async_callback(bus.stop)
            await bus.start()

            http = make_http_client(settings)
            stack.push_async_callback(http.aclose)
            instrument_http_client(http, tracer_provider)
            llm = make_llm_client(settings, http)
            stack.push_async_callback(llm.close)

            publisher = TurnPublisher(
                broker,
                retry_s=settings.retry_policy.publish_retry_s,
                max_text_bytes=settings.max_text_bytes,
            )
            # Runs first on the way out: turns in flight land before the broker closes.
            stack.push_async_callback(publisher.drain, settings.gateway_publish_drain_s)

            app.state.memory_health = MemoryHealth(memories)
            checking = asyncio.create_task(app.state.memory_health.run())
            stack.push_async_callback(_cancel, checking)
            app.state.gateway = GatewayState(
                settings=settings,
                memories=memories,
                broker=broker,
                publisher=publisher,
                upstream=Upstream(settings, http, llm),
                bus=bus,
                tracer=get_tracer("engram.gateway", tracer_provider=tracer_provider),
            )
            if mcp is not None:
                await stack.enter_async_context(mcp)
            if keys is None:
                log.warning(
                    "auth.disabled",
                    detail="single tenant, no authentication (local use only)",
                    tenant=DEFAULT_TENANT,
                )
            else:
                log.info("auth.keys_configured", keys=len(keys.entries), tenants=len(keys.tenants))
                counting = asyncio.create_task(warn_of_unreachable_default_tenant(memories, keys))
                stack.push_async_callback(_cancel, counting)
            log.info(
                "gateway.ready",
                upstream=without_credentials(settings.llm_base_url),
                retrieval=settings.retrieval_address,
                nats=",".join(map(without_credentials, settings.nats_url.split(","))),
                mcp=settings.gateway_mcp,
                ui=settings.gateway_ui,
            )
            yield
            log.info("gateway.stopping")

    keys = settings.key_table
    app = GatewayApp(
        title="Engram gateway",
        summary="OpenAI-compatible proxy with long-term memory",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    install_error_handlers(app)
    prefer_stable_semconv()  # before the first HTTP instrumentation reads it
    app.add_middleware(
        BodyLimitMiddleware, limit=settings.gateway_max_body_bytes, prefixes=MEMORY_API_PREFIXES
    )
    app.add_middleware(ApiKeyMiddleware, keys=keys)
    app.add_middleware(RequestGuardMiddleware, body_timeout_s=settings.gateway_body_timeout_s)
    app.add_middleware(RequestIdMiddleware)  # outermost: every answer carries the request id
    app.include_router(health.router)
    app.include_router(chat.router)
    app.include_router(memory_api.router)
    app.include_router(browse_api.router)
    app.include_router(admin.router)
    if settings.gateway_ui:
        app.include_router(ui.router)
    app.include_router(passthrough.router)  # last: it catches every other /v1 path
    mcp = mount_mcp(app, settings.gateway_host, tracer_provider) if settings.gateway_mcp else None
    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=tracer_provider,
        excluded_urls="/healthz,/readyz,/readyz/memory,/metrics,/ui/",
        # Not one span per ASGI message of every request and streamed chunk.
        exclude_spans=["receive", "send"],
    )
    return app


MEMORY_API_PREFIXES = ("/v1/memories", "/v1/events")


class GatewayApp(FastAPI):
    """FastAPI serving the gateway's own OpenAPI schema (:func:`_openapi`)."""

    def openapi(self) -> dict[str, Any]:
        return _openapi(self)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, minus its 422 ``{"detail": ...}`` answers: validation errors
    are 400 and OpenAI-shaped here (``ErrorResponse``)."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
        schema.setdefault("components", {})["securitySchemes"] = {
            "apiKey": {"type": "http", "scheme": "bearer"}
        }
        schema["security"] = [{"apiKey": []}]
        app.openapi_schema = schema
    return app.openapi_schema
