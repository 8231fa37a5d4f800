"""What the routes share: the clients built in the lifespan, and the request id
(defined in ``request_ids``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from faststream.nats import NatsBroker
from opentelemetry import trace
from starlette.requests import Request

from engram_core.event_status import EventStatusStore
from engram_core.memory_port import MemoryPort
from engram_gateway.bus_link import BusLink
from engram_gateway.request_ids import REQUEST_ID_HEADER, RequestIdMiddleware, request_id
from engram_gateway.settings import GatewaySettings
from engram_gateway.turns import TurnPublisher
from engram_gateway.upstream import Upstream
from engram_gateway.user_names import UserNames


@dataclass
class GatewayState:
    settings: GatewaySettings
    memories: MemoryPort
    broker: NatsBroker
    publisher: TurnPublisher
    upstream: Upstream
    bus: BusLink
    #: For the gateway's own spans (the upstream LLM call): the app's tracer provider.
    tracer: trace.Tracer = field(default_factory=lambda: trace.get_tracer("engram.gateway"))
    #: Display names the chat clients forward, per tenant (over the bus link's bucket).
    user_names: UserNames = field(init=False)

    def __post_init__(self) -> None:
        self.user_names = UserNames(self.bus)

    @property
    def statuses(self) -> EventStatusStore:
        """The event-status store; 503 while the bus link is not up yet."""
        return self.bus.statuses


async def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


__all__ = [
    "REQUEST_ID_HEADER",
    "GatewayState",
    "RequestIdMiddleware",
    "gateway_state",
    "request_id",
]
