"""A tiny HTTP endpoint for a worker process: ``/healthz``, ``/readyz`` and ``/metrics``.

Workers have no HTTP API, and pulling in an ASGI server for two probe routes would
also bring its own signal handling and shutdown loop. This answers ``GET`` with a
small body and closes the connection; that is all a kubelet, a load balancer or a
Prometheus scrape asks of it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress

from engram_core.logging import get_logger

log = get_logger(__name__)

#: Returns the state of each dependency; the process is ready when all are true.
ReadinessCheck = Callable[[], Awaitable[Mapping[str, bool]]]
#: Returns the ``/metrics`` body and its content type.
MetricsSource = Callable[[], Awaitable[tuple[bytes, str]]]

_REQUEST_TIMEOUT_S = 5.0
_MAX_REQUEST_BYTES = 8192
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthServer:
    """``/healthz``: the process is alive. ``/readyz``: every readiness check passes.
    ``/metrics``: Prometheus text, when a metrics source is given."""

    def __init__(
        self,
        host: str,
        port: int,
        readiness: ReadinessCheck,
        metrics: MetricsSource | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._readiness = readiness
        self._metrics = metrics
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        log.info("health.listening", host=self.host, port=self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > _MAX_REQUEST_BYTES:
                raise ValueError("request head too large")
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            path = target.split("?", 1)[0]
            if path == "/metrics" and self._metrics is not None and method == "GET":
                status, (payload, content_type) = 200, await self._metrics()
            else:
                status, body = await self._respond(method, path)
                payload, content_type = json.dumps(body).encode(), "application/json"
        except (TimeoutError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        writer.write(
            f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n".encode("latin-1")
            + payload
        )
        with suppress(ConnectionError):
            await writer.drain()
        writer.close()
        with suppress(ConnectionError):
            await writer.wait_closed()

    async def _respond(self, method: str, path: str) -> tuple[int, dict[str, object]]:
        if path not in ("/healthz", "/readyz"):
            return 404, {"error": f"no route {path}"}
        if method != "GET":
            return 405, {"error": "use GET"}
        if path == "/healthz":
            return 200, {"status": "alive"}
        checks = dict(await self._readiness())
        ready = all(checks.values())
        return (200 if ready else 503), {
            "status": "ready" if ready else "not ready",
            "checks": checks,
        }
