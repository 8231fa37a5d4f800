"""The walking skeleton end to end, against a real nats-server and real services.

A first chat teaches Engram something; a later chat in the same conversation gets
it back: injected for the upstream, reported in ``memory_hits``; the memory
controls never reach the upstream while everything else arrives unchanged; and the
whole turn is one trace across gateway, retrieval and ingest.
"""

from __future__ import annotations

from collections import defaultdict

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.shared_params import ResponseFormatJSONSchema

from engram_cli.stack.scripted_llm import RuleBasedBrain
from engram_cli.stack.up import Stack
from engram_testing.upstream import ScriptedUpstream

from .conftest import count_memories, gateway_url, read_spans, wait_for

pytestmark = pytest.mark.e2e

TENANT = "default"  # single-tenant local mode

TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_trail",
            "description": "Find a hiking trail",
            "parameters": {
                "type": "object",
                "properties": {"region": {"type": "string"}},
                "required": ["region"],
            },
        },
    }
]
RESPONSE_FORMAT: ResponseFormatJSONSchema = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}


async def test_second_chat_recalls_the_first(
    stack: Stack, scripted_upstream: ScriptedUpstream, spans_file
) -> None:
    scripted_upstream.replies = [
        RuleBasedBrain("Noted! Anne and the Alps.", "You like to hike in the Alps.")
    ]
    client = openai.AsyncOpenAI(base_url=gateway_url(stack), api_key="sk-test")
    conversation = "conv-e2e-1"

    first = await client.chat.completions.create(
        model="scripted-model",
        messages=[
            {"role": "user", "content": "My wife's name is Anne and I love hiking in the Alps"}
        ],
        extra_body={"memory_id": conversation},
    )
    assert first.choices[0].message.content == "Noted! Anne and the Alps."

    # ingest is asynchronous: the user and the assistant turn get indexed
    await wait_for(
        lambda: _at_least(count_memories(stack.settings.retrieval_listen, TENANT, conversation), 2),
        30,
        what="both turns indexed",
    )

    second = await client.chat.completions.create(
        model="scripted-model",
        messages=[{"role": "user", "content": "Where do I like to hike?"}],
        tools=TOOLS,
        response_format=RESPONSE_FORMAT,
        extra_body={"memory_id": conversation, "memory_top_k": 3},
    )
    await client.close()
    assert second.choices[0].message.content == "You like to hike in the Alps."

    sent = scripted_upstream.conversation_requests()[1]
    # the memory controls are removed, everything else arrives unchanged
    assert "memory_id" not in sent and "memory_top_k" not in sent
    assert sent["tools"] == TOOLS
    assert sent["response_format"] == RESPONSE_FORMAT
    # one system message, right before the latest user message, carrying the first turn
    messages = sent["messages"]
    assert messages[-1] == {"role": "user", "content": "Where do I like to hike?"}
    assert messages[-2]["role"] == "system"
    assert "hiking in the Alps" in messages[-2]["content"]
    assert sum(1 for m in messages if m["role"] == "system") == 1

    hits = second.to_dict()["memory_hits"]
    assert isinstance(hits, list), hits
    assert any("hiking in the Alps" in hit["text"] for hit in hits)
    recalled = next(hit for hit in hits if "hiking in the Alps" in hit["text"])
    # the turn itself or the fact extracted from it, with its identity and time
    assert recalled["kind"] in ("turn", "fact") and recalled["id"] and recalled["created_at"]

    # one trace per turn: the gateway's request, retrieval and ingest share a trace id
    async def traced_across_services() -> bool:
        services_by_trace: dict[str, set[str]] = defaultdict(set)
        for span in read_spans(spans_file):
            services_by_trace[span["trace_id"]].add(span["service"])
        return any(
            {"engram-gateway", "engram-retrieval", "engram-ingest"} <= s
            for s in services_by_trace.values()
        )

    await wait_for(traced_across_services, 30, what="one trace spanning gateway, retrieval, ingest")

    # the ingest consumer continues the gateway's publish: its root has a gateway parent
    # (each process exports its spans in its own batches: wait for the gateway's publish)
    async def ingest_continues_the_gateway() -> bool:
        spans = read_spans(spans_file)
        by_id = {s["span_id"]: s for s in spans}
        return any(
            s["parent_span_id"] in by_id
            and by_id[s["parent_span_id"]]["service"] == "engram-gateway"
            for s in spans
            if s["service"] == "engram-ingest"
        )

    await wait_for(ingest_continues_the_gateway, 30, what="an ingest span under the gateway's")


async def _at_least(awaitable, n: int) -> bool:
    return (await awaitable) >= n


async def test_streaming_chat_is_relayed_and_its_reply_remembered(
    stack: Stack, scripted_upstream: ScriptedUpstream
) -> None:
    scripted_upstream.replies = [RuleBasedBrain("Rain is expected on Saturday in Zermatt.")]
    client = openai.AsyncOpenAI(base_url=gateway_url(stack), api_key="sk-test")
    conversation = "conv-e2e-stream"
    stream = await client.chat.completions.create(
        model="scripted-model",
        messages=[{"role": "user", "content": "What is the weather in Zermatt this weekend?"}],
        stream=True,
        extra_body={"memory_id": conversation},
    )
    chunks = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    await client.close()
    assert "".join(chunks) == "Rain is expected on Saturday in Zermatt."
    assert len([c for c in chunks if c]) > 1  # relayed piecewise, not buffered into one
    # the completed assistant reply is persisted and indexed like the user turn
    await wait_for(
        lambda: _at_least(count_memories(stack.settings.retrieval_listen, TENANT, conversation), 2),
        30,
        what="user and streamed assistant turn indexed",
    )


async def test_bad_input_gets_an_openai_shaped_error(
    stack: Stack, scripted_upstream: ScriptedUpstream
) -> None:
    async with httpx2.AsyncClient(base_url=gateway_url(stack)) as http:
        malformed = await http.post(
            "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        unknown_knob = await http.post(
            "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "memory_topk": 3},
        )
        wrong_type = await http.post(
            "/chat/completions",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "memory_top_k": "many",
            },
        )
    for reply in (malformed, unknown_knob, wrong_type):
        assert reply.status_code in (400, 422), reply.text
        error = reply.json()["error"]
        assert error["message"] and error["type"]
    assert "memory_topk" in unknown_knob.json()["error"]["message"]
    assert scripted_upstream.chat_requests() == []  # nothing reached the upstream
