"""The MCP server through the SDK's own client, over both transports, against the whole
stack with two API keys: streamable HTTP at the gateway's ``/mcp`` and ``engram mcp`` on
stdio (a subprocess talking to the gateway over HTTP).

Tenant A's memories are invisible to tenant B through every tool; text added through
``add_memory`` is learned by the workers (the rule-based scripted LLM) and then found by
``search_memory``, and its profile and summary come back as resources; a tool call over
HTTP is one trace from the ``POST /mcp`` server span through the API request it makes to
the workers that learned from it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextResourceContents

from engram_testing.browser import (
    SCREENSHOTS_ENV,
    chromium_or_skip,
    screenshot_dir,
    screenshot_transcript,
)

from .conftest import TOOLS_KEY_A, TOOLS_KEY_B, TwoTenantStack, read_spans, wait_for

pytestmark = pytest.mark.e2e

TOOLS = {
    "search_memory",
    "add_memory",
    "remember_fact",
    "list_memories",
    "get_memory",
    "update_memory",
    "delete_memory",
    "get_profile",
}


@asynccontextmanager
async def over_http(stack: TwoTenantStack, key: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=90) as http,
        Client(streamable_http_client(f"{stack.base_url}/mcp", http_client=http)) as client,
    ):
        yield client


def over_stdio(stack: TwoTenantStack, key: str) -> Client:
    """``engram mcp`` as an editor launches it: a subprocess, the key in its environment."""
    engram = Path(sys.executable).with_name("engram")
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env.update({"ENGRAM_API_KEY": key, "ENGRAM_GATEWAY_URL": stack.base_url})
    return Client(StdioServerParameters(command=str(engram), args=["mcp"], env=env))


#: (call, answer) pairs of the stdio session, for the picture in the docs.
TRANSCRIPT: list[tuple[str, str]] = []


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, result.content)
    assert isinstance(result.structured_content, dict)
    TRANSCRIPT.append((f"{tool}({json.dumps(arguments)})", brief(result.structured_content)))
    return result.structured_content


def brief(answer: dict[str, Any]) -> str:
    """The answer as an agent reads it, shortened for the picture: the bulky fields of
    each memory and all but the first item of each list left out."""
    bulky = {
        "metadata",
        "updated_at",
        "valid_from",
        "valid_to",
        "source_id",
        "turn_index",
        "turn_range",
        "role",
        "object",
        "source_turn_ids",
        "superseded_by",
        "profile",
    }

    def trim(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: trim(v) for k, v in value.items() if k not in bulky}
        if isinstance(value, list):
            return [trim(v) for v in value[:1]] + (["…"] if len(value) > 1 else [])
        return value

    return json.dumps(trim(answer), indent=1, ensure_ascii=False)


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    result: CallToolResult = await client.call_tool(tool, arguments)
    assert result.is_error, (tool, result.structured_content)
    return " ".join(getattr(block, "text", "") for block in result.content)


async def test_tools_over_streamable_http_keep_tenants_apart(
    two_tenant_stack: TwoTenantStack,
) -> None:
    scope = {"user": "mcp-alice", "conversation": "mcp-http"}
    async with over_http(two_tenant_stack, TOOLS_KEY_A) as a:
        tools = {tool.name: tool for tool in (await a.list_tools()).tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            assert tool.description and len(tool.description) > 60, tool.name
        assert tools["search_memory"].input_schema["required"] == ["query"]
        delete_annotations = tools["delete_memory"].annotations
        assert delete_annotations is not None
        assert delete_annotations.destructive_hint is True

        fact = await call(a, "remember_fact", text="User's bike is green.", tags=["bike"], **scope)
        found = await call(a, "search_memory", query="What colour is my bike?", **scope)
        hit = next(h for h in found["hits"] if h["id"] == fact["id"])
        assert hit["scope"] == "conversation" and hit["text"] == "User's bike is green."
        assert set(hit["scores"]) == {"dense", "sparse", "relevance", "recency", "total", "mmr"}

        edited = await call(a, "update_memory", memory_id=fact["id"], text="User's bike is red.")
        assert edited["id"] == fact["id"] and edited["text"] == "User's bike is red."
        with_history = await call(a, "get_memory", memory_id=fact["id"], include_history=True)
        assert [v["text"] for v in with_history["history"]] == ["User's bike is green."]
        listed = await call(a, "list_memories", conversation="mcp-http", kinds=["fact"], limit=5)
        assert [m["text"] for m in listed["data"]] == ["User's bike is red."]

        async with over_http(two_tenant_stack, TOOLS_KEY_B) as b:
            assert (await call(b, "search_memory", query="bike colour", **scope))["hits"] == []
            assert (await call(b, "list_memories", conversation="mcp-http"))["data"] == []
            assert "No memory" in await refused(b, "get_memory", memory_id=fact["id"])
            assert "No memory" in await refused(
                b, "update_memory", memory_id=fact["id"], text="User's bike is blue."
            )
            assert "No memory" in await refused(b, "delete_memory", memory_id=fact["id"])

        assert "not a valid memory id" in await refused(a, "get_memory", memory_id="bike")
        gone = await call(a, "delete_memory", memory_id=fact["id"])
        assert len(gone["deleted_ids"]) == 2  # the memory and its history version
        assert "No memory" in await refused(a, "get_memory", memory_id=fact["id"])


async def test_learning_over_stdio_then_profile_and_summary_resources(
    two_tenant_stack: TwoTenantStack,
) -> None:
    scope = {"user": "mcp-carol", "conversation": "mcp-stdio"}
    TRANSCRIPT.clear()
    async with over_stdio(two_tenant_stack, TOOLS_KEY_A) as a:
        added = await call(
            a, "add_memory", text="I am allergic to cashews.", wait_seconds=45, **scope
        )
        assert added["status"] == "applied", added
        assert [e["status"] for e in added["events"]] == ["applied"]

        found = await call(a, "search_memory", query="What is the user allergic to?", **scope)
        facts = [h["text"] for h in found["hits"] if h["kind"] == "fact"]
        assert "User is allergic to cashews" in facts
        profile = await call(a, "get_profile", user="mcp-carol")
        assert [(e["category"], e["key"], e["value"]) for e in profile["entries"]] == [
            ("constraint", "allergy", "cashews")
        ]
        resource = await a.read_resource("engram://users/mcp-carol/profile")
        contents = resource.contents[0]
        assert isinstance(contents, TextResourceContents)
        assert json.loads(contents.text)["entries"][0]["value"] == "cashews"

        async def summary() -> str | None:
            uri = "engram://users/mcp-carol/conversations/mcp-stdio/summary"
            try:
                read = await a.read_resource(uri)
            except Exception:  # no summary yet: the resource read fails
                return None
            text = read.contents[0]
            return text.text if isinstance(text, TextResourceContents) else None

        summarised = await wait_for(summary, 30, what="the conversation summary")
        assert "cashews" in summarised
    if os.environ.get(SCREENSHOTS_ENV):  # the picture in docs/mcp.md and the README
        await screenshot_transcript(
            chromium_or_skip(),
            "engram mcp (stdio): the MCP SDK's client calling Engram's tools",
            TRANSCRIPT[:3],
            screenshot_dir(Path(".")) / "mcp-session.png",
        )

    async with over_stdio(two_tenant_stack, TOOLS_KEY_B) as b:
        other = await call(b, "search_memory", query="What is the user allergic to?", **scope)
        assert other["hits"] == [] and other["profile"] == []
        assert (await call(b, "get_profile", user="mcp-carol"))["entries"] == []

    async with over_stdio(two_tenant_stack, "not-a-key") as nobody:
        assert "Invalid API key" in await refused(nobody, "list_memories")


async def test_a_tool_call_over_http_is_one_trace(two_tenant_stack: TwoTenantStack) -> None:
    async with over_http(two_tenant_stack, TOOLS_KEY_A) as a:
        added = await call(
            a,
            "add_memory",
            text="My sister Eva lives in Porto.",
            user="mcp-dave",
            conversation="mcp-trace",
            wait_seconds=45,
        )
    assert added["status"] == "applied"
    event_id = added["events"][0]["id"]

    def trace_of_the_add() -> list[dict[str, Any]] | None:
        spans = read_spans(two_tenant_stack.spans_file)
        adds = [s for s in spans if s["attributes"].get("http.route") == "/v1/memories/add"]
        for add in adds:
            trace = [s for s in spans if s["trace_id"] == add["trace_id"]]
            ingested = any(
                s["service"] == "engram-ingest"
                and s["attributes"].get("messaging.message.id") == event_id
                for s in trace
            )
            reconciled = any(s["service"] == "engram-reconcile" for s in trace)
            # a span is exported when it ends, after its children: wait for the parents
            ids = {s["span_id"] for s in trace}
            complete = all(s["parent_span_id"] in (None, *ids) for s in trace)
            if ingested and reconciled and complete:
                return trace
        return None

    trace = await wait_for(trace_of_the_add, 30, what="the add_memory call traced, whole")
    by_id = {s["span_id"]: s for s in trace}
    roots = [s for s in trace if s["parent_span_id"] is None]
    assert len(roots) == 1, [(s["service"], s["name"]) for s in roots]
    root = roots[0]
    assert root["service"] == "engram-gateway" and root["kind"] == "SERVER"
    assert root["attributes"]["http.route"] == "/mcp"
    assert all(s["parent_span_id"] is None or s["parent_span_id"] in by_id for s in trace)
    # the tool's in-process API call (a client span and the API's own request span)
    # hangs under the MCP request; the API's work and the workers' follow from it
    add = next(s for s in trace if s["attributes"].get("http.route") == "/v1/memories/add")
    client = by_id[add["parent_span_id"]]
    assert client["kind"] == "CLIENT" and client["service"] == "engram-gateway"
    assert any(
        s["attributes"].get("http.route") == "/v1/events/{event_id}" for s in trace
    )  # the status polls of the same call
    assert any(s["name"] == "publish engram.turn.persisted.v1" for s in trace)
    assert {"engram-ingest", "engram-reconcile"} <= {s["service"] for s in trace}
