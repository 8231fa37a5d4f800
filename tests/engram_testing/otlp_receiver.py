"""A minimal OTLP/HTTP receiver: accepts ``POST /v1/traces`` and ``POST /v1/metrics``
(protobuf, gzip or not), decodes them with the OTLP protos and keeps what arrived."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str


@dataclass
class OtlpHttpReceiver:
    url: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    metrics: list[tuple[str, str]] = field(default_factory=list)  # (service, metric name)
    content_types: set[str] = field(default_factory=set)

    def wait_for_span(self, service: str, timeout_s: float = 20.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [s for s in self.spans if s.service == service]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no span from {service} arrived; got {self.spans}")


def _service(resource: Resource) -> str:
    for attribute in resource.attributes:
        if attribute.key == "service.name":
            return str(attribute.value.string_value)
    return ""


def _handler(received: OtlpHttpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            received.content_types.add(self.headers.get("content-type", ""))
            if self.path == "/v1/traces":
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    service = _service(resource_spans.resource)
                    for scope in resource_spans.scope_spans:
                        for span in scope.spans:
                            received.spans.append(
                                ReceivedSpan(service, span.name, span.trace_id.hex())
                            )
            elif self.path == "/v1/metrics":
                metrics_request = ExportMetricsServiceRequest.FromString(body)
                for resource_metrics in metrics_request.resource_metrics:
                    service = _service(resource_metrics.resource)
                    for metric_scope in resource_metrics.scope_metrics:
                        for metric in metric_scope.metrics:
                            received.metrics.append((service, metric.name))
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None

    return Handler


@contextmanager
def otlp_http_receiver() -> Iterator[OtlpHttpReceiver]:
    received = OtlpHttpReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(received))
    received.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
