"""``engram-gateway``: load settings, set up logs and traces, serve with uvicorn."""

from __future__ import annotations

import math
import socket
import sys

import uvicorn

from engram_core.logging import get_logger
from engram_core.observability import setup_observability
from engram_core.settings import load_settings
from engram_gateway.app import create_app
from engram_gateway.settings import GatewaySettings

log = get_logger(__name__)

STARTUP_FAILED = 3


class _Server(uvicorn.Server):
    """Logs the address once the socket is really listening (port 0 resolved), and
    exits 0 after a graceful SIGTERM/SIGINT shutdown."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            log.info("gateway.listening", url=self.listen_url())

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        # uvicorn re-raises the stopping signal once serving ends, so the process would
        # die of it before main() flushes telemetry; a graceful stop is a normal exit.
        self._captured_signals.clear()
        log.info("gateway.stopped")

    def listen_url(self) -> str:
        host, port = self.config.host, self.config.port
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                port = sock.getsockname()[1]
                break
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"


def main() -> None:
    settings = load_settings(GatewaySettings)
    telemetry = setup_observability("engram-gateway", settings)
    try:
        server = _Server(
            uvicorn.Config(
                create_app(settings),
                host=settings.gateway_host,
                port=settings.gateway_port,
                log_config=None,  # keep the structlog handlers configure_logging installed
                lifespan="on",
                loop=settings.event_loop,
                timeout_graceful_shutdown=math.ceil(settings.gateway_publish_drain_s) + 5,
            )
        )
        server.run()
    finally:
        telemetry.shutdown()
    if not server.started:
        log.error("gateway.start_failed")
        sys.exit(STARTUP_FAILED)


if __name__ == "__main__":
    main()
