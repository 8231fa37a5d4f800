"""What a route may ask FastAPI for, as ``Annotated`` aliases: ``state: AppState`` and
``tenant: Tenant`` instead of the same two calls at the top of every route.

Every dependency is ``async def``: FastAPI runs a plain ``def`` one in its thread pool,
a hop per dependency per request that waits for a thread and for the GIL, for
functions that only read the request (docs/gateway.md, Observability)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from engram_gateway.state import GatewayState, gateway_state
from engram_gateway.tenancy import resolve_tenant

AppState = Annotated[GatewayState, Depends(gateway_state)]
Tenant = Annotated[str, Depends(resolve_tenant)]
