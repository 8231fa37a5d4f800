"""Which OTLP exporter each signal gets from the standard protocol variables."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from engram_core.otlp import metric_exporter, otlp_protocol, span_exporter
from engram_core.settings import ConfigError


@pytest.mark.parametrize(
    ("environ", "traces", "metrics"),
    [
        ({}, "grpc", "grpc"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http/protobuf", "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": " HTTP/Protobuf "}, "http/protobuf", "http/protobuf"),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            "http/protobuf",
            "grpc",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
            },
            "http/protobuf",
            "grpc",
        ),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": ""}, "grpc", "grpc"),
    ],
)
def test_signal_specific_protocol_wins_then_the_generic_one_then_grpc(
    environ: dict[str, str], traces: str, metrics: str
) -> None:
    assert otlp_protocol("traces", environ) == traces
    assert otlp_protocol("metrics", environ) == metrics


@pytest.mark.parametrize(
    "environ",
    [
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
        {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http"},
    ],
)
def test_a_protocol_the_exporters_do_not_speak_is_a_config_error(environ: dict[str, str]) -> None:
    (var,) = environ
    with pytest.raises(ConfigError, match=var) as error:
        otlp_protocol("traces", environ)
    assert "grpc, http/protobuf" in str(error.value)


def test_exporters_follow_the_protocol() -> None:
    http = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    exporters: list[SpanExporter | MetricExporter] = [
        span_exporter(http),
        metric_exporter(http),
        span_exporter({}),
        metric_exporter({}),
    ]
    try:
        kinds = [HttpSpanExporter, HttpMetricExporter, GrpcSpanExporter, GrpcMetricExporter]
        for exporter, kind in zip(exporters, kinds, strict=True):
            assert isinstance(exporter, kind)
    finally:
        for exporter in exporters:
            exporter.shutdown()
