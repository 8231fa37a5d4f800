"""The MCP tools' own behaviour, through the SDK client connected in-process: what an
agent sees when the gateway cannot be reached or answers an error, and that every tool
says what it does and what it needs. (Against the real stack: tests/e2e/test_mcp.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from engram_cli.stack.nats_server import free_port
from engram_client.mcp_tools import GatewayApi, build_mcp_server
from engram_testing.mcp_results import tool_text


@asynccontextmanager
async def unreachable() -> AsyncIterator[tuple[Client, str]]:
    """The SDK client of a server whose gateway does not answer. Entered in the test
    itself: the SDK's task groups must start and end in one task."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with (
        httpx2.AsyncClient(base_url=url, timeout=5) as http,
        Client(build_mcp_server(GatewayApi(http))) as client,
    ):
        yield client, url


async def test_an_unreachable_gateway_is_a_tool_error_naming_it() -> None:
    async with unreachable() as (client, url):
        await _unreachable_is_named(client, url)


async def _unreachable_is_named(client: Client, url: str) -> None:
    result = await client.call_tool("search_memory", {"query": "anything"})
    assert result.is_error
    text = tool_text(result)
    assert f"cannot reach the Engram gateway at {url}" in text
    with pytest.raises(MCPError, match="cannot reach the Engram gateway"):
        await client.read_resource("engram://users/alice/profile")


async def test_arguments_are_checked_before_any_call() -> None:
    async with unreachable() as (client, _):
        await _checked_first(client)


async def _checked_first(client: Client) -> None:
    empty = await client.call_tool("search_memory", {"query": ""})
    assert empty.is_error and "cannot reach" not in str(empty.content)
    too_many = await client.call_tool("search_memory", {"query": "x", "top_k": 1000})
    assert too_many.is_error and "cannot reach" not in str(too_many.content)
    bad_kind = await client.call_tool("list_memories", {"kinds": ["opinion"]})
    assert bad_kind.is_error and "cannot reach" not in str(bad_kind.content)


async def test_every_tool_documents_itself() -> None:
    async with unreachable() as (client, _):
        await _documented(client)


async def _documented(client: Client) -> None:
    tools = (await client.list_tools()).tools
    assert len(tools) == 8
    for tool in tools:
        assert tool.description and tool.annotations is not None, tool.name
        for name, schema in tool.input_schema["properties"].items():
            assert schema.get("description"), f"{tool.name}.{name} has no description"
    read_only = {t.name for t in tools if t.annotations and t.annotations.read_only_hint}
    assert read_only == {"search_memory", "list_memories", "get_memory", "get_profile"}
    templates = (await client.list_resource_templates()).resource_templates
    assert {t.uri_template for t in templates} == {
        "engram://users/{user}/profile",
        "engram://users/{user}/conversations/{conversation}/summary",
        "engram://conversations/{conversation}/summary",
    }


@asynccontextmanager
async def recording() -> AsyncIterator[tuple[Client, list[str]]]:
    """The SDK client of a server whose gateway answers every call with an empty memory
    (or history, or list) and records the paths it was asked for."""
    paths: list[str] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        path = request.url.raw_path.decode()
        paths.append(path)
        if path.endswith("/history"):
            return httpx2.Response(200, json={"id": "m", "data": []})
        if path.startswith("/v1/memories/"):
            return httpx2.Response(200, json={"id": "m", "kind": "fact", "text": ""})
        return httpx2.Response(200, json={"data": [], "has_more": False, "next_cursor": None})

    transport = httpx2.MockTransport(answer)
    async with (
        httpx2.AsyncClient(base_url="http://gateway", transport=transport) as http,
        Client(build_mcp_server(GatewayApi(http))) as client,
    ):
        yield client, paths


async def test_a_memory_id_that_is_not_a_uuid_never_becomes_a_path() -> None:
    async with recording() as (client, paths):
        for tool in ("get_memory", "update_memory", "delete_memory"):
            for memory_id in ("../../v1/users", "x/../../users", "%2e%2e%2fusers", "a?b=c"):
                result = await client.call_tool(tool, {"memory_id": memory_id, "text": "t"})
                assert result.is_error, (tool, memory_id)
                assert "is not a valid memory id (a UUID)" in tool_text(result)
        assert paths == []

        spelled = "{ABCDEF01-2345-6789-ABCD-EF0123456789}"
        await client.call_tool("get_memory", {"memory_id": spelled, "include_history": True})
        canonical = "abcdef01-2345-6789-abcd-ef0123456789"
        assert paths == [f"/v1/memories/{canonical}", f"/v1/memories/{canonical}/history"]


async def test_user_ids_are_normalised_before_any_call() -> None:
    async with recording() as (client, paths):
        blank = await client.call_tool("get_profile", {"user": "   "})
        assert blank.is_error and "must not be blank" in tool_text(blank)
        assert paths == []
        profile = await client.call_tool("get_profile", {"user": " Jose\u0301 "})
        assert not profile.is_error
        assert profile.structured_content["user"] == "Jos\u00e9"
        assert paths == ["/v1/memories?user=Jos%C3%A9&kind=profile&limit=500"]
