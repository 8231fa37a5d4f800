"""OpenTelemetry metrics shared by every service, scraped by Prometheus at ``/metrics``.

:func:`setup_metrics` installs the process's meter provider once: a Prometheus reader
always (each service serves :func:`prometheus_exposition` on its own HTTP port), plus an
OTLP push reader when ``OTEL_METRICS_EXPORTER`` names ``otlp`` (the OTLP endpoint and
protocol come from the same ``OTEL_EXPORTER_OTLP_*`` variables as traces, or their
``_METRICS_`` forms; :mod:`engram_core.otlp`). Engram does not push
metrics by default: a trace-only collector such as Jaeger would refuse them.

The instruments below are created from the global (proxy) meter, so modules can hold
them at import time without connecting anything; they start recording once a provider
is installed and cost next to nothing before that. Names and attributes are in
:mod:`engram_core.semconv` and docs/observability.md.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from engram_core import semconv
from engram_core.otlp import metric_exporter

#: Seconds: from a cached embedding (ms) to a slow LLM reply (a minute).
DURATION_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
#: The gen_ai semantic conventions' advice for token counts.
TOKEN_BUCKETS = tuple(4**i for i in range(14))

_lock = threading.Lock()
_provider: MeterProvider | None = None

meter = metrics.get_meter("engram")

llm_duration = meter.create_histogram(
    semconv.METRIC_GEN_AI_DURATION,
    unit="s",
    description="Duration of one LLM chat call, as the client sees it.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
)
llm_tokens = meter.create_histogram(
    semconv.METRIC_GEN_AI_TOKENS,
    unit="{token}",
    description="Tokens per LLM call (gen_ai.token.type: input or output), when the reply "
    "reports usage.",
    explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
)
llm_errors = meter.create_counter(
    semconv.METRIC_LLM_ERRORS,
    unit="{error}",
    description="LLM calls that failed (error.type says how).",
)
llm_fallbacks = meter.create_counter(
    semconv.METRIC_LLM_FALLBACKS,
    unit="{fallback}",
    description="Worker tasks that took their documented fallback instead of the model's "
    "answer (engram.llm.fallback says why).",
)
llm_tasks = meter.create_counter(
    semconv.METRIC_LLM_TASKS,
    unit="{task}",
    description="Worker tasks asked of a model, by outcome (engram.llm.outcome: answered, "
    "or the kind of fallback taken); engram status shows the fallback rate from it.",
)
search_stage_duration = meter.create_histogram(
    semconv.METRIC_SEARCH_STAGE_DURATION,
    unit="s",
    description="Time a retrieval Search spent per stage, as the service reports it.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
)
events_processed = meter.create_counter(
    semconv.METRIC_EVENTS_PROCESSED,
    unit="{event}",
    description="Events a worker handled and acknowledged.",
)
events_redelivered = meter.create_counter(
    semconv.METRIC_EVENTS_REDELIVERED,
    unit="{event}",
    description="Deliveries after the first (a retry or an expired ack_wait).",
)
events_dead_lettered = meter.create_counter(
    semconv.METRIC_EVENTS_DEAD_LETTERED,
    unit="{event}",
    description="Events published to the worker's dead-letter subject and terminated.",
)
rpc_server_duration = meter.create_histogram(
    semconv.METRIC_RPC_SERVER_DURATION,
    unit="s",
    description="Duration of gRPC calls served (from the server spans).",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
)
rpc_client_duration = meter.create_histogram(
    semconv.METRIC_RPC_CLIENT_DURATION,
    unit="s",
    description="Duration of gRPC calls made (from the client spans).",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
)
memories_changed = meter.create_counter(
    semconv.METRIC_MEMORIES_CHANGED,
    unit="{memory}",
    description="Memory changes announced on engram.memory.changed.v1, by kind and op.",
)


def _otlp_push_requested() -> bool:
    wanted = os.environ.get("OTEL_METRICS_EXPORTER", "")
    return "otlp" in {part.strip() for part in wanted.split(",")}


def setup_metrics(resource: Resource) -> MeterProvider:
    """Install the global meter provider (once per process; later calls return it)."""
    global _provider
    with _lock:
        if _provider is not None:
            return _provider
        # Imported here: the reader registers itself with prometheus_client's registry.
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers: list[MetricReader] = [PrometheusMetricReader()]
        if _otlp_push_requested():
            readers.append(PeriodicExportingMetricReader(metric_exporter()))
        _provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(_provider)
        return _provider


def serve_metrics(host: str, port: int) -> Callable[[], None]:
    """Serve ``/metrics`` from a background thread (for a process with no HTTP server).
    Returns what stops it; a daemon thread, so a process may also just exit."""
    from prometheus_client import start_http_server

    server, thread = start_http_server(port, addr=host)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop


def prometheus_exposition() -> tuple[bytes, str]:
    """The body and content type of a ``/metrics`` answer (Prometheus text format)."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
