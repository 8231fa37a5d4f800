"""A short-lived NATS connection for declarations and admin commands, without the
messaging stack (FastStream, telemetry) that :mod:`engram_core.bus` brings: commands
that only read the server's state (``engram status``, ``engram dlq``) import this and
start in a fraction of the time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats
from nats.aio.client import Client

from engram_core.settings import parse_nats_urls

CONNECT_TIMEOUT_S = 5


@asynccontextmanager
async def admin_connection(nats_url: str) -> AsyncIterator[Client]:
    """A short-lived connection for declarations and admin commands that fails fast:
    each server of the list is tried (twice) and then the connect gives up.

    nats-py retries an initial connect forever when ``max_reconnect_attempts`` is 0;
    1 makes it drop a server after its second failed attempt.
    """

    async def quiet(_: Exception) -> None:  # the caller reports the outcome
        return None

    nc = await nats.connect(
        servers=parse_nats_urls(nats_url),
        connect_timeout=CONNECT_TIMEOUT_S,
        max_reconnect_attempts=1,
        reconnect_time_wait=0.2,
        allow_reconnect=False,
        error_cb=quiet,
    )
    try:
        yield nc
    finally:
        await nc.close()
