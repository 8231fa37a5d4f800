"""Log lines carry the active trace; the span file exporter writes parent links."""

from __future__ import annotations

import io
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


class _Terminal:
    """Stands in for a terminal's stderr."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return True


def _log_line(monkeypatch: pytest.MonkeyPatch, fmt: str | None, terminal: bool) -> str:
    stream = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    try:
        if fmt is None:
            configure_logging("engram-test", level="info")
        else:
            configure_logging("engram-test", level="info", fmt=fmt)
        get_logger("test").info("hello", turn=3)
    finally:
        logging.getLogger().handlers.clear()
    return stream.text if isinstance(stream, _Terminal) else stream.getvalue()


@pytest.mark.parametrize("terminal", [True, False])
def test_json_is_the_default_even_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    record = json.loads(_log_line(monkeypatch, None, terminal))
    assert record["event"] == "hello" and record["service"] == "engram-test"


def test_console_is_readable_and_coloured_only_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = _log_line(monkeypatch, "console", terminal=False)
    assert "hello" in plain and "turn=3" in plain and not plain.startswith("{")
    assert "\x1b[" not in plain  # a log file gets no escape codes
    assert "\x1b[" in _log_line(monkeypatch, "console", terminal=True)


def test_auto_is_console_on_a_terminal_and_json_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not _log_line(monkeypatch, "auto", terminal=True).startswith("{")
    assert json.loads(_log_line(monkeypatch, "auto", terminal=False))["event"] == "hello"
