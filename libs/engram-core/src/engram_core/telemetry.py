"""OpenTelemetry set-up shared by every service.

The tracer provider is configured from the standard ``OTEL_*`` variables
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_*``): an
OTLP exporter (gRPC or HTTP/protobuf, by ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``; see
:mod:`engram_core.otlp`) is added when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the
traces-specific variable) is set, and a JSON-lines file exporter when
``ENGRAM_TRACES_FILE`` is.
Set-up errors are not swallowed: a broken exporter configuration stops the service.
The same resource (service name) is given to the meter provider (:mod:`engram_core.metrics`).

gRPC calls are traced by :mod:`engram_core.rpc_tracing` (the retrieval client and
service open their spans themselves).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import SpanKind

from engram_core import metrics, semconv
from engram_core.metrics import setup_metrics
from engram_core.otlp import otlp_protocol, span_exporter

_OTLP_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span; several processes may share the file."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            if ctx is None:  # a span always has one; the SDK's signature allows None
                continue
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "service": span.resource.attributes.get(SERVICE_NAME),
                        "trace_id": format(ctx.trace_id, "032x"),
                        "span_id": format(ctx.span_id, "016x"),
                        "parent_span_id": format(span.parent.span_id, "016x")
                        if span.parent
                        else None,
                        "kind": span.kind.name,
                        "start_ns": span.start_time,
                        "end_ns": span.end_time,
                        "status": span.status.status_code.name,
                        "attributes": {k: _jsonable(v) for k, v in (span.attributes or {}).items()},
                    }
                )
            )
        with self._lock, self._path.open("a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def _jsonable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


class RpcMetricsSpanProcessor(SpanProcessor):
    """Records ``rpc.server.call.duration`` / ``rpc.client.call.duration`` from the
    finished gRPC spans (:mod:`engram_core.rpc_tracing`), so every gRPC call has a
    latency metric with the span's own timing."""

    def on_end(self, span: ReadableSpan) -> None:
        attributes = span.attributes or {}
        if attributes.get(semconv.RPC_SYSTEM) != "grpc" or span.end_time is None:
            return
        if span.kind is SpanKind.SERVER:
            histogram = metrics.rpc_server_duration
        elif span.kind is SpanKind.CLIENT:
            histogram = metrics.rpc_client_duration
        else:
            return
        histogram.record(
            (span.end_time - (span.start_time or span.end_time)) / 1e9,
            {
                key: attributes[key]
                for key in (
                    semconv.RPC_SYSTEM,
                    semconv.RPC_SERVICE,
                    semconv.RPC_METHOD,
                    semconv.RPC_GRPC_STATUS_CODE,
                )
                if key in attributes
            },
        )


@dataclass
class Telemetry:
    provider: TracerProvider
    meter_provider: MeterProvider

    def shutdown(self) -> None:
        self.provider.shutdown()
        self.meter_provider.shutdown()


def prefer_stable_semconv() -> None:
    """Use the stable HTTP semantic conventions (``http.server.request.duration`` in
    seconds, ``http.request.method``, ...) unless ``OTEL_SEMCONV_STABILITY_OPT_IN`` says
    otherwise. Must run before the first instrumentor is installed (any of them reads
    the variable, once per process)."""
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")


def setup_telemetry(service_name: str, traces_file: Path | None = None) -> Telemetry:
    """Install the global tracer and meter providers for this process."""
    prefer_stable_semconv()
    for signal in ("traces", "metrics"):
        otlp_protocol(signal)  # a bad protocol stops the process now, not at first export
    attributes = {SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service_name}
    resource = Resource.create(attributes)
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(RpcMetricsSpanProcessor())
    if any(os.environ.get(var) for var in _OTLP_ENDPOINT_VARS):
        provider.add_span_processor(BatchSpanProcessor(span_exporter()))
    if traces_file is not None:
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(traces_file)))
    trace.set_tracer_provider(provider)
    return Telemetry(provider=provider, meter_provider=setup_metrics(resource))
