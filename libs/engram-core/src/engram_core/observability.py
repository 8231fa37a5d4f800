"""One call that gives a process its logs, traces and metrics under one service name."""

from __future__ import annotations

from engram_core.logging import configure_logging, get_logger
from engram_core.metrics import serve_metrics
from engram_core.profiling import start_profiler
from engram_core.settings import EngramSettings
from engram_core.telemetry import Telemetry, setup_telemetry


def setup_observability(service_name: str, settings: EngramSettings) -> Telemetry:
    """structlog + OpenTelemetry for ``service_name`` (e.g. ``engram-gateway``).

    Log lines and spans carry the same service name, so a log line's ``trace_id``
    leads straight to the trace. ``OTEL_SERVICE_NAME`` still overrides the span name.
    """
    configure_logging(service_name, settings.log_level, settings.log_format)
    telemetry = setup_telemetry(service_name, settings.traces_file)
    if settings.profile_dir is not None:
        start_profiler(service_name, settings.profile_dir)
        get_logger(__name__).info("profiler.sampling", directory=str(settings.profile_dir))
    if settings.metrics_port:
        serve_metrics(settings.metrics_host, settings.metrics_port)
        get_logger(__name__).info(
            "metrics.listening", host=settings.metrics_host, port=settings.metrics_port
        )
    return telemetry
