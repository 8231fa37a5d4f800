"""Log lines carry the active trace; the span file exporter writes parent links."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from engram_core.logging import configure_logging, get_logger
from engram_core.telemetry import JsonLinesSpanExporter


@pytest.fixture
def provider(tmp_path: Path) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "engram-test"}))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(tmp_path / "s.jsonl")))
    return provider


def test_json_log_lines_carry_trace_and_span_ids(
    provider: TracerProvider, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("engram-test", level="info", fmt="json")
    try:
        with provider.get_tracer("t").start_as_current_span("work") as span:
            get_logger("test").info("inside a span", turn=3)
        get_logger("test").info("outside")
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        logging.getLogger().handlers.clear()
    inside, outside = lines[-2], lines[-1]
    ctx = span.get_span_context()
    assert inside["event"] == "inside a span" and inside["turn"] == 3
    assert inside["service"] == "engram-test"
    assert inside["trace_id"] == format(ctx.trace_id, "032x")
    assert inside["span_id"] == format(ctx.span_id, "016x")
    assert "trace_id" not in outside


def test_span_file_records_parent_links(provider: TracerProvider, tmp_path: Path) -> None:
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("parent") as parent, tracer.start_as_current_span("child"):
        pass
    spans = {s["name"]: s for s in map(json.loads, (tmp_path / "s.jsonl").read_text().splitlines())}
    assert spans["child"]["parent_span_id"] == format(parent.get_span_context().span_id, "016x")
    assert spans["child"]["trace_id"] == spans["parent"]["trace_id"]
    assert spans["parent"]["parent_span_id"] is None
    assert spans["parent"]["service"] == "engram-test"
