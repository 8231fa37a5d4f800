"""``engram mcp``: Engram's MCP server on stdio, for editors and desktop agents that
launch their tools as a subprocess (Claude Desktop, Cursor, VS Code).

The same tools and resources the gateway serves at ``/mcp`` (one implementation:
:mod:`engram_client.mcp_tools`), here calling a running gateway over HTTP
(``--gateway`` / ``ENGRAM_GATEWAY_URL``) with the configured key (``ENGRAM_API_KEY``),
so tenant isolation is the gateway's. stdout carries the protocol: logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable

from engram_cli.cli_common import add_gateway_flags, auth_headers, cli_settings
from engram_core.logging import configure_logging, get_logger

log = get_logger(__name__)
#: A tool call may wait up to mcp_tools.MAX_WAIT_S for learning; each HTTP call is short.
HTTP_TIMEOUT_S = 30.0


def add_mcp_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "mcp",
        help="serve Engram's MCP tools on stdio (for Claude Desktop, Cursor, VS Code)",
        description="An MCP server on stdin/stdout whose tools call a running gateway. "
        "Configure the key with ENGRAM_API_KEY (not on the command line, where other "
        "users can see it).",
    )
    add_gateway_flags(parser)
    parser.set_defaults(func=handler)


def mcp_command(args: argparse.Namespace) -> int:
    settings = cli_settings(args)
    configure_logging("engram-mcp", settings.log_level, "json")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # not a line per tool call
    asyncio.run(serve_stdio(settings.gateway_url, auth_headers(settings)))
    return 0


async def serve_stdio(gateway_url: str, headers: dict[str, str]) -> None:
    import httpx2

    from engram_client.mcp_tools import GatewayApi, build_mcp_server

    async with httpx2.AsyncClient(
        base_url=gateway_url.rstrip("/"), headers=headers, timeout=HTTP_TIMEOUT_S
    ) as client:
        server = build_mcp_server(GatewayApi(client))
        log.info("mcp.serving", transport="stdio", gateway=gateway_url)
        await server.run_stdio_async()
