"""An LLM call's span and metrics, and Search stage timings as metrics."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from engram_core.codec import pb, pb_grpc
from engram_core.genai import LlmCall
from engram_core.metrics import setup_metrics
from engram_core.retrieval_client import InProcessRetrievalClient, record_search_timings
from engram_testing.metrics import metric


@pytest.fixture
def spans() -> InMemorySpanExporter:
    setup_metrics(Resource.create({"service.name": "engram-test"}))
    return InMemorySpanExporter()


def tracer_for(exporter: InMemorySpanExporter):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


def test_a_successful_call_has_gen_ai_attributes_and_token_metrics(
    spans: InMemorySpanExporter,
) -> None:
    before = metric("gen_ai_client_token_usage_sum", gen_ai_request_model="unit-ok")
    with LlmCall("unit-ok", task="extract_facts", tracer=tracer_for(spans)) as call:
        call.record_reply(
            {"model": "unit-ok-2025", "usage": {"prompt_tokens": 12, "completion_tokens": 5}}
        )
    (span,) = spans.get_finished_spans()
    assert span.name == "chat unit-ok" and span.kind is SpanKind.CLIENT
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "unit-ok",
        "gen_ai.response.model": "unit-ok-2025",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 5,
        "engram.llm.task": "extract_facts",
    }
    assert span.status.status_code is StatusCode.UNSET
    after = metric("gen_ai_client_token_usage_sum", gen_ai_request_model="unit-ok")
    assert after - before == 17
    assert metric("gen_ai_client_operation_duration_seconds_count", gen_ai_request_model="unit-ok")


def test_a_failed_call_is_an_error_span_and_counted(spans: InMemorySpanExporter) -> None:
    with (
        pytest.raises(TimeoutError),
        LlmCall("unit-fail", task="reconcile", tracer=tracer_for(spans)),
    ):
        raise TimeoutError("upstream took too long")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "TimeoutError"
    assert "gen_ai.usage.input_tokens" not in (span.attributes or {})
    errors = metric(
        "engram_llm_errors_total", gen_ai_request_model="unit-fail", error_type="TimeoutError"
    )
    assert errors == 1


def test_search_timings_become_stage_durations(spans: InMemorySpanExporter) -> None:
    def count(stage: str) -> float:
        return metric("engram_search_stage_duration_seconds_count", engram_search_stage=stage)

    before = {stage: count(stage) for stage in ("embed", "mmr", "total")}
    record_search_timings(pb.StageTimings(embed_ms=3, candidates_ms=2, rerank_ms=1, total_ms=7))
    record_search_timings(pb.StageTimings())  # nothing reported: nothing recorded
    assert {stage: count(stage) - n for stage, n in before.items()} == {
        "embed": 1,
        "mmr": 1,
        "total": 1,
    }


class _TimedSearches(pb_grpc.MemoryServiceServicer):
    async def Search(self, request: pb.SearchRequest, context: object) -> pb.SearchResponse:
        return pb.SearchResponse(timings=pb.StageTimings(embed_ms=3, total_ms=7))


async def test_a_caller_records_no_stage_durations(spans: InMemorySpanExporter) -> None:
    """The service records them for every search it serves; a caller recording the reply's
    timings again would count each search twice where both report to one place."""
    before = metric("engram_search_stage_duration_seconds_count", engram_search_stage="total")
    client = InProcessRetrievalClient(_TimedSearches())
    reply = await client.search(pb.SearchRequest(tenant="t", query="q"))
    assert reply.timings.total_ms == 7
    after = metric("engram_search_stage_duration_seconds_count", engram_search_stage="total")
    assert after == before
