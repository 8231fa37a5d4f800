"""gRPC call durations from spans, and ``ENGRAM_METRICS_PORT``'s own /metrics server."""

from __future__ import annotations

import urllib.request

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from engram_cli.stack.nats_server import free_port
from engram_core.metrics import prometheus_exposition, serve_metrics, setup_metrics
from engram_core.telemetry import RpcMetricsSpanProcessor
from engram_testing.metrics import metric


def test_grpc_spans_become_rpc_call_durations() -> None:
    setup_metrics(Resource.create({"service.name": "engram-test"}))
    provider = TracerProvider()
    provider.add_span_processor(RpcMetricsSpanProcessor())
    tracer = provider.get_tracer("test")
    grpc_attributes = {"rpc.system": "grpc", "rpc.service": "unit.Svc", "rpc.method": "Probe"}
    labels = {"rpc_service": "unit.Svc", "rpc_method": "Probe"}

    def counts() -> tuple[float, float]:
        text = prometheus_exposition()[0].decode()
        return (
            metric("rpc_server_call_duration_seconds_count", text, **labels),
            metric("rpc_client_call_duration_seconds_count", text, **labels),
        )

    before = counts()
    with tracer.start_as_current_span("server", kind=SpanKind.SERVER, attributes=grpc_attributes):
        pass
    with tracer.start_as_current_span("client", kind=SpanKind.CLIENT, attributes=grpc_attributes):
        pass
    with tracer.start_as_current_span("not rpc", kind=SpanKind.SERVER):
        pass
    after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


def test_metrics_port_serves_prometheus_text() -> None:
    setup_metrics(Resource.create({"service.name": "engram-test"}))
    port = free_port()
    stop = serve_metrics("127.0.0.1", port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert reply.status == 200
            assert "target_info" in reply.read().decode()
    finally:
        stop()
