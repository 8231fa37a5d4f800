"""Which tenant a request acts for — decided here and nowhere else.

There is one tenant until API keys map to tenants (DESIGN §3): then this function
looks the caller's key up (configured as hashes) and every route keeps calling it.
"""

from __future__ import annotations

from starlette.requests import Request

DEFAULT_TENANT = "default"


def resolve_tenant(request: Request) -> str:
    del request  # the API key will come from here
    return DEFAULT_TENANT
