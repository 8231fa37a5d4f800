"""What the routes share: the clients built in the lifespan, and the request id."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

import structlog
from faststream.nats import NatsBroker
from opentelemetry import trace
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_core.event_status import EventStatusStore
from engram_core.memory_port import MemoryPort
from engram_gateway.settings import GatewaySettings
from engram_gateway.turns import TurnPublisher
from engram_gateway.upstream import Upstream

REQUEST_ID_HEADER = "X-Request-Id"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass
class GatewayState:
    settings: GatewaySettings
    memories: MemoryPort
    broker: NatsBroker
    publisher: TurnPublisher
    upstream: Upstream
    statuses: EventStatusStore
    #: For the gateway's own spans (the upstream LLM call): the app's tracer provider.
    tracer: trace.Tracer = field(default_factory=lambda: trace.get_tracer("engram.gateway"))


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def request_id(request: Request) -> str:
    rid: str = request.scope["state"]["request_id"]
    return rid


class RequestIdMiddleware:
    """Give every request an id (the caller's ``X-Request-Id`` when it is sane), put it
    on every log line and echo it in the response.

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
        rid = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = rid
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=rid):
            await self.app(scope, receive, send_with_id)
