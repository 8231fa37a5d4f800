"""What an MCP tool call answered, read the way the tests read it: the text of its first
content block (Engram's tools answer in text; anything else fails the test)."""

from __future__ import annotations

from mcp_types import CallToolResult, TextContent


def tool_text(result: CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent), block
    return block.text
