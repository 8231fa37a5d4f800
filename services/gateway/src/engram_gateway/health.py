"""Probes: ``/healthz`` (the process answers), ``/readyz`` (this pod can serve chats)
and ``/readyz/memory`` (memory is available too); ``/metrics``: the process's
OpenTelemetry metrics in the Prometheus text format.

Readiness is about chats only: NATS connected and the stream and the event-status
bucket reached (a chat that records turns needs them). Retrieval is not a condition:
while it is down, chats still answer (without memory, ``X-Engram-Memory:
unavailable``), so a retrieval restart must not take every gateway pod out of
service. Memory's own state is reported apart: ``/readyz/memory`` (503 while
retrieval does not serve), the ``memory`` field of ``/readyz`` (the last check), and
the gauge ``engram.gateway.memory.available`` (1/0), refreshed every
:data:`MEMORY_CHECK_INTERVAL_S` by :class:`MemoryHealth` and on every
``/readyz/memory``.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from engram_core.logging import get_logger
from engram_core.memory_port import MemoryPort
from engram_core.metrics import meter, prometheus_exposition
from engram_gateway.deps import AppState
from engram_gateway.errors import SERVICE_UNAVAILABLE, error_response

log = get_logger(__name__)
router = APIRouter()

READY_CHECK_TIMEOUT_S = 2.0
MEMORY_CHECK_INTERVAL_S = 10.0
METRIC_MEMORY_AVAILABLE = "engram.gateway.memory.available"

memory_available = meter.create_gauge(
    METRIC_MEMORY_AVAILABLE,
    unit="1",
    description="1 while the gateway's last check found retrieval serving (chats recall "
    "memories), 0 while it did not (chats answer without memory).",
)


class MemoryHealth:
    """Whether retrieval serves, as last checked; checked every ``interval_s`` while
    running (:meth:`run`, a task of the app's lifespan) and on demand."""

    def __init__(self, memories: MemoryPort, interval_s: float = MEMORY_CHECK_INTERVAL_S):
        self.memories = memories
        self.interval_s = interval_s
        self.serving: bool | None = None  # None: not checked yet

    @property
    def status(self) -> str:
        return {True: "ok", False: "unavailable", None: "unknown"}[self.serving]

    async def check(self) -> bool:
        serving = await self.memories.is_serving(timeout_s=READY_CHECK_TIMEOUT_S)
        if serving != self.serving:
            log.info("memory.availability", available=serving)
        self.serving = serving
        memory_available.set(1 if serving else 0)
        return serving

    async def run(self) -> None:
        while True:
            with suppress(Exception):  # a failed check is "not serving", never a crash
                await self.check()
            await asyncio.sleep(self.interval_s)


def memory_health(request: Request) -> MemoryHealth:
    health: MemoryHealth = request.app.state.memory_health
    return health


_PROBE = {"content": {"application/json": {"schema": {"type": "object"}}}}


@router.get("/healthz", responses={200: {"description": "The process answers.", **_PROBE}})
async def healthz() -> Response:
    return JSONResponse({"status": "ok"})


@router.get("/metrics", include_in_schema=False)
async def metrics() -> Response:
    body, content_type = prometheus_exposition()
    return Response(body, media_type=content_type)


@router.get(
    "/readyz",
    responses={
        200: {"description": "Chats can be served: NATS, the stream and the bucket.", **_PROBE},
        503: {"description": "Not ready: the failing checks are named.", **_PROBE},
    },
)
async def readyz(request: Request, state: AppState) -> Response:
    """Ready when NATS is connected and the stream and the event-status bucket were
    reached (``bus``). ``memory`` reports retrieval's last check and is no condition.

    The upstream LLM is not checked: it is the caller's dependency as much as ours,
    and its failures are reported per request (502/504).
    """
    checks = {
        "nats": "ok" if state.publisher.is_connected() else "unavailable",
        "bus": "ok" if state.bus.ready else f"waiting for the {state.bus.waiting_for}",
    }
    memory = memory_health(request).status
    failed = [name for name, status in checks.items() if status != "ok"]
    if not failed:
        return JSONResponse({"status": "ready", "checks": checks, "memory": memory})
    return error_response(
        503,
        f"Not ready: {', '.join(failed)} unavailable.",
        type=SERVICE_UNAVAILABLE,
        code="not_ready",
        extra={"checks": checks, "memory": memory},
    )


@router.get(
    "/readyz/memory",
    responses={
        200: {"description": "Retrieval serves: chats recall memories.", **_PROBE},
        503: {"description": "Retrieval does not serve: chats go without memory.", **_PROBE},
    },
)
async def readyz_memory(request: Request) -> Response:
    """Retrieval's gRPC health check, now (also refreshes ``/readyz``'s ``memory`` and
    the gauge). Not a readiness probe: chats are served without memory."""
    if await memory_health(request).check():
        return JSONResponse({"status": "ready", "checks": {"retrieval": "ok"}})
    return error_response(
        503,
        "Memory unavailable: retrieval does not serve; chats are answered without memory.",
        type=SERVICE_UNAVAILABLE,
        code="memory_unavailable",
        extra={"checks": {"retrieval": "unavailable"}},
    )
