"""OTLP exporters chosen by the standard ``OTEL_EXPORTER_OTLP_*PROTOCOL`` variables.

``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`` win
over ``OTEL_EXPORTER_OTLP_PROTOCOL``; the values are ``grpc`` (port 4317) and
``http/protobuf`` (port 4318; the exporter appends ``/v1/traces`` or ``/v1/metrics``
to ``OTEL_EXPORTER_OTLP_ENDPOINT``). Unset means ``grpc``, which is what Engram has
always exported and what its examples (``:4317``) assume; the OpenTelemetry spec's
suggested default is ``http/protobuf``, so set it explicitly when in doubt.

A value the exporters do not speak (``http/json``, a typo) stops the process at start
with a message naming the variable, instead of silently exporting nothing. The
exporters read every other ``OTEL_EXPORTER_OTLP_*`` variable (endpoint, headers,
timeout, certificates, compression) themselves.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from engram_core.settings import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.trace.export import SpanExporter

Signal = Literal["traces", "metrics"]
Protocol = Literal["grpc", "http/protobuf"]
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http/protobuf")
DEFAULT_PROTOCOL: Protocol = "grpc"
GENERIC_PROTOCOL_VAR = "OTEL_EXPORTER_OTLP_PROTOCOL"


def protocol_var(signal: Signal) -> str:
    return f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"


def otlp_protocol(signal: Signal, environ: Mapping[str, str] | None = None) -> Protocol:
    """The protocol to export ``signal`` with; a ``ConfigError`` for an unknown one."""
    env = os.environ if environ is None else environ
    for var in (protocol_var(signal), GENERIC_PROTOCOL_VAR):
        value = env.get(var, "").strip().lower()
        if not value:
            continue
        if value not in PROTOCOLS:
            raise ConfigError(
                f"invalid configuration:\n  {var}: must be one of {', '.join(PROTOCOLS)} "
                f"(got {env[var]!r})"
            )
        return value
    return DEFAULT_PROTOCOL


def span_exporter(environ: Mapping[str, str] | None = None) -> SpanExporter:
    if otlp_protocol("traces", environ) == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )

        return HttpSpanExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def metric_exporter(environ: Mapping[str, str] | None = None) -> MetricExporter:
    if otlp_protocol("metrics", environ) == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )

        return HttpMetricExporter()
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()
