"""What a route may ask FastAPI for, as ``Annotated`` aliases: ``state: AppState`` and
``tenant: Tenant`` instead of the same two calls at the top of every route."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from engram_gateway.state import GatewayState, gateway_state
from engram_gateway.tenancy import resolve_tenant

AppState = Annotated[GatewayState, Depends(gateway_state)]
Tenant = Annotated[str, Depends(resolve_tenant)]
