"""One trace per turn, across every process the turn touches.

Each process of the stack appends its finished spans to one JSON-lines file
(``ENGRAM_TRACES_FILE``). A chat must come out as one trace rooted at the gateway's
HTTP server span: retrieval's Search (with its stages), the upstream LLM call, the
JetStream publishes and then, in the workers, ingest (Upsert), the extraction LLM call,
``fact.proposed``, reconcile (with its LLM call when the fact has neighbours), the
summary fold and the file mirror, each span's parent in the same trace, each
``process`` span a child of the ``publish`` span of another process. Log lines written
inside the handlers carry the same trace id.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx2
import pytest

from engram_cli.stack.scripted_llm import RuleBasedBrain
from engram_cli.stack.up import Stack
from engram_testing.upstream import ScriptedUpstream

from .conftest import gateway_url, read_spans, wait_for

pytestmark = pytest.mark.e2e

Span = dict[str, Any]

CHAT_ROUTE = "/v1/chat/completions"
TURN = "engram.turn.persisted.v1"
FACT = "engram.fact.proposed.v1"
CHANGED = "engram.memory.changed.v1"


def turn_traces(spans: list[Span]) -> list[str]:
    """Trace ids of chat requests, oldest first (the gateway's root HTTP spans)."""
    roots = [
        s
        for s in spans
        if s["service"] == "engram-gateway"
        and s["kind"] == "SERVER"
        and s["attributes"].get("http.route") == CHAT_ROUTE
    ]
    return [s["trace_id"] for s in sorted(roots, key=lambda s: s["start_ns"])]


def spans_of(spans: list[Span], trace_id: str) -> list[Span]:
    return [s for s in spans if s["trace_id"] == trace_id]


def has(spans: list[Span], service: str, name: str, **attributes: Any) -> bool:
    return any(
        s["service"] == service
        and s["name"] == name
        and all(s["attributes"].get(k) == v for k, v in attributes.items())
        for s in spans
    )


def llm_tasks(spans: list[Span], service: str) -> set[str]:
    return {
        s["attributes"].get("engram.llm.task")
        for s in spans
        if s["service"] == service and s["attributes"].get("gen_ai.operation.name") == "chat"
    }


def complete_turn(trace: list[Span], *, reconcile_llm: bool) -> bool:
    """Everything one remembered turn should leave in its trace."""
    needed = [
        has(trace, "engram-gateway", f"publish {TURN}"),
        has(trace, "engram-retrieval", "/engram.memory.v1.MemoryService/Search"),
        has(trace, "engram-ingest", f"process {TURN}"),
        has(trace, "engram-retrieval", "/engram.memory.v1.MemoryService/Upsert"),
        has(trace, "engram-ingest", f"publish {FACT}"),
        has(trace, "engram-reconcile", f"process {FACT}"),
        has(trace, "engram-reconcile", f"publish {CHANGED}"),
        has(trace, "engram-summarize", f"process {CHANGED}"),
        has(trace, "engram-mirror", f"process {CHANGED}"),
        "extract_facts" in llm_tasks(trace, "engram-ingest"),
        "summarize" in llm_tasks(trace, "engram-summarize"),
        not reconcile_llm or "reconcile" in llm_tasks(trace, "engram-reconcile"),
    ]
    return all(needed) and parents_resolved(trace)


def parents_resolved(trace: list[Span]) -> bool:
    ids = {s["span_id"] for s in trace}
    return all(s["parent_span_id"] is None or s["parent_span_id"] in ids for s in trace)


def assert_well_formed(trace: list[Span]) -> None:
    by_id = {s["span_id"]: s for s in trace}
    roots = [s for s in trace if s["parent_span_id"] is None]
    # one root: the gateway's HTTP server span
    assert len(roots) == 1, [(s["service"], s["name"]) for s in roots]
    root = roots[0]
    assert root["service"] == "engram-gateway" and root["kind"] == "SERVER"
    assert root["attributes"]["http.request.method"] == "POST"
    assert root["attributes"]["http.response.status_code"] == 200
    assert root["attributes"]["engram.memory.status"]
    for span in trace:
        assert span["parent_span_id"] is None or span["parent_span_id"] in by_id, span

    # retrieval's Search stages are children of its server span
    search = next(
        s
        for s in trace
        if s["service"] == "engram-retrieval" and s["attributes"].get("rpc.method") == "Search"
    )
    assert search["kind"] == "SERVER" and search["attributes"]["rpc.system"] == "grpc"
    stages = {s["name"] for s in trace if s["parent_span_id"] == search["span_id"]}
    assert {"embed", "candidates", "rerank", "mmr"} <= stages

    # the upstream LLM call: gen_ai conventions, a child of the HTTP request
    upstream = next(
        s
        for s in trace
        if s["service"] == "engram-gateway" and s["attributes"].get("engram.llm.task") == "chat"
    )
    assert upstream["name"] == "chat scripted-model" and upstream["kind"] == "CLIENT"
    assert upstream["parent_span_id"] == root["span_id"]
    assert upstream["attributes"]["gen_ai.operation.name"] == "chat"
    assert upstream["attributes"]["gen_ai.request.model"] == "scripted-model"
    assert upstream["attributes"]["gen_ai.provider.name"] == "openai"
    assert upstream["attributes"]["gen_ai.system"] == "openai"

    # every process span continues a publish span of another process, same subject
    processes = [s for s in trace if s["attributes"].get("messaging.operation.type") == "process"]
    assert {s["service"] for s in processes} >= {
        "engram-ingest",
        "engram-reconcile",
        "engram-summarize",
        "engram-mirror",
    }
    for span in processes:
        parent = by_id[span["parent_span_id"]]
        subject = span["attributes"]["messaging.destination.name"]
        assert parent["attributes"]["messaging.destination.name"] == subject
        # a memory change's subject names its kind and op; the span names its event
        event = span["attributes"].get("messaging.destination.template", subject)
        if event == CHANGED:
            assert subject.startswith(f"{CHANGED}.") and subject.count(".") == 5, subject
        assert span["kind"] == "CONSUMER" and parent["kind"] == "PRODUCER", (span, parent)
        assert parent["name"] == f"publish {event}" and span["name"] == f"process {event}"
        for s in (span, parent):
            assert s["attributes"]["messaging.system"] == "nats"
            assert s["attributes"]["messaging.message.id"]
        assert parent["attributes"]["messaging.operation.type"] == "send"
        assert (
            span["attributes"]["messaging.message.id"]
            == parent["attributes"]["messaging.message.id"]
        )


def log_lines(stack: Stack) -> list[dict[str, Any]]:
    lines = []
    for path in Path(stack.log_dir).glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    continue
    return lines


async def test_a_chat_is_one_trace_across_every_process(
    stack: Stack, scripted_upstream: ScriptedUpstream, spans_file: Path
) -> None:
    scripted_upstream.replies = [RuleBasedBrain("Noted!", "Noted, Anna it is.")]
    conversation = "conv-one-trace"
    async with httpx2.AsyncClient(base_url=gateway_url(stack), timeout=30) as http:

        async def chat(text: str) -> None:
            reply = await http.post(
                "/chat/completions",
                json={
                    "model": "scripted-model",
                    "messages": [{"role": "user", "content": text}],
                    "memory_id": conversation,
                },
            )
            assert reply.status_code == 200, reply.text

        # turn 1: a new fact (reconcile adds it without asking the model)
        await chat("My wife's name is Anne.")

        async def first_turn_traced() -> bool:
            traces = turn_traces(read_spans(spans_file))
            return bool(traces) and complete_turn(
                spans_of(read_spans(spans_file), traces[0]), reconcile_llm=False
            )

        await wait_for(first_turn_traced, 45, what="turn 1 traced through every worker")

        # turn 2: a correction, so reconcile asks the model about its neighbour
        await chat("My wife's name is Anna.")

        async def second_turn_traced() -> bool:
            traces = turn_traces(read_spans(spans_file))
            return len(traces) == 2 and complete_turn(
                spans_of(read_spans(spans_file), traces[1]), reconcile_llm=True
            )

        await wait_for(second_turn_traced, 45, what="turn 2 traced, reconcile LLM included")

    # A child span is written when it ends, before its parent does: a worker still busy
    # with turn 1 (a late Get from the mirror, say) can leave a snapshot with a parent
    # not yet written. Read once every turn's trace has settled.
    async def every_trace_settled() -> bool:
        spans = read_spans(spans_file)
        return all(parents_resolved(spans_of(spans, t)) for t in turn_traces(spans))

    await wait_for(every_trace_settled, 30, what="every span's parent written")
    spans = read_spans(spans_file)
    by_trace: dict[str, set[str]] = defaultdict(set)
    for span in spans:
        by_trace[span["trace_id"]].add(span["service"])
    for trace_id in turn_traces(spans):
        trace = spans_of(spans, trace_id)
        assert_well_formed(trace)
        extraction = next(
            s for s in trace if s["attributes"].get("engram.llm.task") == "extract_facts"
        )
        assert extraction["name"].startswith("chat ")
        assert extraction["attributes"]["gen_ai.request.model"]

    # the handlers' log lines carry their event's trace id
    second = turn_traces(spans)[1]
    logged = {
        line["service"]
        for line in log_lines(stack)
        if line.get("trace_id") == second
        and line.get("event") in ("extraction.done", "reconcile.applied")
    }
    assert logged == {"engram-ingest", "engram-reconcile"}, logged
