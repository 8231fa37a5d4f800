"""Probes: ``/healthz`` (the process answers) and ``/readyz`` (its dependencies do);
``/metrics``: the process's OpenTelemetry metrics in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from engram_core.metrics import prometheus_exposition
from engram_gateway.errors import SERVICE_UNAVAILABLE, error_response
from engram_gateway.state import gateway_state

router = APIRouter()

READY_CHECK_TIMEOUT_S = 2.0


@router.get("/healthz")
async def healthz() -> Response:
    return JSONResponse({"status": "ok"})


@router.get("/metrics", include_in_schema=False)
async def metrics() -> Response:
    body, content_type = prometheus_exposition()
    return Response(body, media_type=content_type)


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    """Ready when retrieval reports SERVING and NATS is connected.

    The upstream LLM is not checked: it is the caller's dependency as much as ours,
    and its failures are reported per request (502/504).
    """
    state = gateway_state(request)
    retrieval_ok = await state.memories.is_serving(timeout_s=READY_CHECK_TIMEOUT_S)
    nats_ok = state.publisher.is_connected()
    checks = {
        "retrieval": "ok" if retrieval_ok else "unavailable",
        "nats": "ok" if nats_ok else "unavailable",
    }
    failed = [name for name, status in checks.items() if status != "ok"]
    if not failed:
        return JSONResponse({"status": "ready", "checks": checks})
    return error_response(
        503,
        f"Not ready: {', '.join(failed)} unavailable.",
        type=SERVICE_UNAVAILABLE,
        code="not_ready",
        extra={"checks": checks},
    )
