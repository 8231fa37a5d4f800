"""The gateway's HTTP edge against bytes no client would normalise: pass-through paths
that walk out of the allowlist, header bytes that are not ASCII, request ids that
cannot be one, bodies wide enough to stall the event loop, and caller-chosen strings
that would become metric labels.

Requests are written on a raw socket (:mod:`engram_testing.raw_http`), and the
upstream records every request that reaches it, whatever its path, so "nothing was
forwarded" is checked where it matters.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from engram_testing.raw_http import RawConnection
from engram_testing.upstream import ScriptedUpstream

from .conftest import RunningGateway

CHAT = "/v1/chat/completions"
SECRET_PROMPT = "Tenant A's secret: the vault code is 4471."


class EveryRequestUpstream(ScriptedUpstream):
    """The scripted upstream, also noting the method and raw target (path and query) of
    every request that reaches it (its own ``/requests`` included, which it does not
    record itself)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.reached: list[tuple[str, str]] = []

    def app(self) -> Any:
        inner: ASGIApp = super().app()
        reached = self.reached

        async def noting(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                target = scope.get("raw_path") or scope["path"].encode()
                if scope.get("query_string"):
                    target += b"?" + scope["query_string"]
                reached.append((scope["method"], target.decode("latin-1")))
            await inner(scope, receive, send)

        return noting


@pytest.fixture
def scripted_upstream() -> Iterator[EveryRequestUpstream]:
    upstream = EveryRequestUpstream().start()
    try:
        yield upstream
    finally:
        upstream.stop()


@pytest.fixture
async def conn(gateway: RunningGateway) -> AsyncIterator[RawConnection]:
    connection = await RawConnection.open(gateway.url)
    try:
        yield connection
    finally:
        await connection.close()


# --- pass-through traversal ------------------------------------------------------------

#: Request targets that name an allowed first segment (``models``) but resolve, once
#: dot segments or encoded slashes are taken as such, somewhere else upstream.
WALKS_OUT = [
    "/v1/models/../../requests",
    "/v1/models/../files",
    "/v1/models/./../../requests",
    "/v1/models/%2e%2e/%2e%2e/requests",
    "/v1/models/%2E%2E/%2E%2E/requests",
    "/v1/models/%2e./%2E./requests",
    "/v1/models/.%2e/.%2E/requests",
    "/v1/models/%2e/x",
    "/v1/models/.",
    "/v1/models/..",
    "/v1/models/..%2f..%2frequests",
    "/v1/models/..%2F..%2Frequests",
    "/v1/models%2f..%2f..%2frequests",
    "/v1/models/x%2fy",
    "/v1/models/..\\..\\requests",
    "/v1/models/..%5c..%5crequests",
    "/v1/models/%5C..%5C..%5Crequests",
    "/v1/models/x\\y",
    "/v1/models/%252e%252e/%252e%252e/requests",  # double-encoded: a dot segment once decoded twice
    "/v1/models/..;/..;/requests",
    "/v1/models/%00/../../requests",
    "http://gateway/v1/models/../../requests",  # absolute form
]


async def _upstream_holds_a_secret(conn: RawConnection, upstream: EveryRequestUpstream) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": SECRET_PROMPT}]}
    assert (await conn.request("POST", CHAT, chat)).status == 200
    upstream.reached.clear()


@pytest.mark.parametrize("target", WALKS_OUT)
@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_passthrough_path_that_walks_out_of_the_allowlist_is_a_404_never_forwarded(
    conn: RawConnection, scripted_upstream: EveryRequestUpstream, method: str, target: str
) -> None:
    await _upstream_holds_a_secret(conn, scripted_upstream)
    reply = await conn.request(method, target)
    assert reply.status == 404, reply.body
    assert reply.error()["code"] == "not_found"
    assert SECRET_PROMPT.encode() not in reply.body
    assert scripted_upstream.reached == []
    assert len(scripted_upstream.chat_requests()) == 1  # DELETE /requests never ran
    # the connection and the allowed path still work
    models = await conn.request("GET", "/v1/models")
    assert models.status == 200, models.body
    assert scripted_upstream.reached == [("GET", "/v1/models")]


@pytest.mark.parametrize(
    ("target", "forwarded"),
    [
        ("/v1/models", "/v1/models"),
        ("/v1/models/scripted-model", "/v1/models/scripted-model"),
        ("/v1/%6dodels", "/v1/models"),  # an encoded letter is that letter
        ("/v1/models/a%20b?x=1&y=%2F", "/v1/models/a%20b?x=1&y=%2F"),
        ("/v1/models/..a/b..", "/v1/models/..a/b.."),  # dots inside a name are a name
    ],
)
async def test_the_passthrough_forwards_exactly_the_path_it_checked(
    conn: RawConnection, scripted_upstream: EveryRequestUpstream, target: str, forwarded: str
) -> None:
    reply = await conn.request("GET", target)
    assert reply.status in (200, 404), reply.body
    assert scripted_upstream.reached == [("GET", forwarded)]
