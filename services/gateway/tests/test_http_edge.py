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

from .conftest import RunningGateway, StartGateway

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
    upstream = EveryRequestUpstream()
    upstream.start()
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


# --- header bytes ----------------------------------------------------------------------

JOSE = "José".encode()  # what Open WebUI sends for X-OpenWebUI-User-Name: UTF-8 bytes
NON_ASCII_HEADERS = [
    b"X-OpenWebUI-User-Name: " + JOSE,
    b"User-Agent: " + "Bücherwurm/1.0 (Zürich)".encode(),
    b"X-Anything: caf\xe9",  # a latin-1 byte that is not UTF-8
    b"X-Stainless-Lang: \xff\xfe",
]


def _sent(upstream: EveryRequestUpstream, name: str) -> bytes | None:
    """A header as the upstream received it, in bytes (Starlette decodes latin-1)."""
    value = upstream.requests[-1].headers.get(name)
    return None if value is None else value.encode("latin-1")


@pytest.mark.parametrize("stream", [False, True])
async def test_non_ascii_header_bytes_chat_fine_and_reach_the_upstream_unchanged(
    conn: RawConnection, scripted_upstream: EveryRequestUpstream, stream: bool
) -> None:
    chat = {"model": "m", "stream": stream, "messages": [{"role": "user", "content": "Hi"}]}
    reply = await conn.request("POST", CHAT, chat, headers=NON_ASCII_HEADERS)
    assert reply.status == 200, reply.body
    assert _sent(scripted_upstream, "x-openwebui-user-name") == JOSE
    assert _sent(scripted_upstream, "user-agent") == "Bücherwurm/1.0 (Zürich)".encode()
    assert _sent(scripted_upstream, "x-anything") == b"caf\xe9"
    assert _sent(scripted_upstream, "x-stainless-lang") == b"\xff\xfe"


async def test_non_ascii_header_bytes_pass_through_fine(
    conn: RawConnection, scripted_upstream: EveryRequestUpstream
) -> None:
    reply = await conn.request("GET", "/v1/models", headers=NON_ASCII_HEADERS)
    assert reply.status == 200, reply.body
    assert _sent(scripted_upstream, "x-openwebui-user-name") == JOSE
    assert _sent(scripted_upstream, "user-agent") == "Bücherwurm/1.0 (Zürich)".encode()


async def test_only_allowed_caller_headers_reach_the_upstream(
    conn: RawConnection, scripted_upstream: EveryRequestUpstream
) -> None:
    sent = {
        "Idempotency-Key": "idem-1",
        "OpenAI-Beta": "assistants=v2",
        "OpenAI-Organization": "org-1",
        "Anthropic-Version": "2023-06-01",
        "HTTP-Referer": "https://app.example",
        "X-Title": "My app",
        "X-Stainless-Lang": "python",
        "X-OpenWebUI-User-Id": "u-1",
        "Accept-Language": "fr",
        "Cookie": "session=secret",
        "Origin": "https://evil.example",
        "Referer": "https://intranet.example/page",
        "Forwarded": "for=10.0.0.1",
        "X-Forwarded-For": "10.0.0.1",
        "X-Real-IP": "10.0.0.1",
        "X-Engram-Memory": "true",
        "If-None-Match": '"abc"',
        "Sec-Fetch-Site": "cross-site",
    }
    lines = [f"{k}: {v}".encode() for k, v in sent.items()]
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    for method, target, body in (("POST", CHAT, chat), ("GET", "/v1/models", None)):
        reply = await conn.request(method, target, body, headers=lines)
        assert reply.status == 200, reply.body
        received = scripted_upstream.requests[-1].headers
        for name in list(sent)[:9]:
            assert received.get(name.lower()) == sent[name], (target, name)
        for name in list(sent)[9:]:
            assert name.lower() not in received, (target, name)


def test_a_header_value_with_a_control_byte_is_dropped_not_sent() -> None:
    from engram_gateway.settings import GatewaySettings
    from engram_gateway.upstream import Upstream

    upstream = Upstream(GatewaySettings(), None, None)  # type: ignore[arg-type]
    headers = upstream.forward_headers(
        {"x-ok": " fine ", "x-bad": "a\x01b", "x-nul": "a\x00", "x-tab": "a\tb"}, chat=True
    )
    assert headers == {"x-ok": b"fine", "x-tab": b"a\tb"}


# --- wide bodies -----------------------------------------------------------------------


def _wide_chat(zeros: int) -> bytes:
    head = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": ['
    return head + b",".join([b"0"] * zeros) + b"]}"


async def _slowest_healthz_while(gateway: RunningGateway, work: Any) -> tuple[float, Any]:
    """Run ``work`` while probing ``/healthz`` every 20 ms; the longest time between two
    answers (the gateway and this test share one event loop: a blocked loop shows as a
    gap, whenever the block starts) and the work's result."""
    import asyncio
    import time

    client = gateway.client()
    task = asyncio.ensure_future(work)
    slowest = 0.0
    last = time.perf_counter()
    while not task.done():
        await asyncio.sleep(0.02)
        assert (await client.get("/healthz")).status_code == 200
        now = time.perf_counter()
        slowest, last = max(slowest, now - last), now
    return slowest, task.result()


@pytest.mark.parametrize("path", [CHAT, "/v1/memories", "/mcp"])
async def test_a_wide_json_body_is_refused_without_stalling_the_gateway(
    gateway: RunningGateway, scripted_upstream: EveryRequestUpstream, path: str
) -> None:
    """3 million values (6 MB): the old walk held the event loop for seconds; refused
    from a bounded-cost count before any parse, everyone else's requests go on."""
    from engram_gateway.bodies import MAX_JSON_VALUES

    zeros = 3 * MAX_JSON_VALUES
    conn = await RawConnection.open(gateway.url)
    try:
        slowest, reply = await _slowest_healthz_while(
            gateway, conn.request("POST", path, _wide_chat(zeros))
        )
    finally:
        await conn.close()
    assert reply.status == 413, reply.body
    assert slowest < 1.0, f"/healthz took {slowest:.2f} s while the body was handled"
    if path == "/mcp":
        return  # the MCP server's own size limit answers first (plain text)
    error = reply.error()
    assert error["code"] == "too_many_json_values"
    assert f"{MAX_JSON_VALUES:,}" in error["message"]
    assert scripted_upstream.chat_requests() == []


async def test_a_body_just_under_the_value_bound_chats_fine(
    gateway: RunningGateway, scripted_upstream: EveryRequestUpstream
) -> None:
    from engram_gateway.bodies import MAX_JSON_VALUES

    conn = await RawConnection.open(gateway.url)
    try:
        slowest, reply = await _slowest_healthz_while(
            gateway, conn.request("POST", CHAT, _wide_chat(MAX_JSON_VALUES - 100))
        )
    finally:
        await conn.close()
    assert reply.status == 200, reply.body[:300]
    assert len(scripted_upstream.chat_requests()[0]["x"]) == MAX_JSON_VALUES - 100
    print(f"slowest /healthz beside a {MAX_JSON_VALUES - 100:,}-value chat: {slowest:.3f} s")


# --- request ids -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_id",
    [b"a/b", b"x" * 129, b"two words", b"caf\xc3\xa9", b"../../etc", b"id?x=1"],
    ids=["slash", "129 chars", "space", "non-ascii", "dots and slashes", "query"],
)
async def test_a_request_id_that_cannot_be_one_is_a_400_and_nothing_is_done(
    conn: RawConnection, scripted_upstream: EveryRequestUpstream, request_id: bytes
) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    for _ in range(2):  # a retry with the same id gets the same answer
        reply = await conn.request("POST", CHAT, chat, headers=[b"X-Request-Id: " + request_id])
        assert reply.status == 400, reply.body
        error = reply.error()
        assert (error["code"], error["param"]) == ("invalid_request_id", "X-Request-Id")
        assert reply.headers["x-request-id"] != request_id.decode("latin-1")
    assert scripted_upstream.chat_requests() == []


@pytest.mark.parametrize("request_id", [b"r-1", b"x" * 128, b"import-42:a.b_c"])
async def test_a_sane_request_id_is_kept_and_echoed(conn: RawConnection, request_id: bytes) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    reply = await conn.request("POST", CHAT, chat, headers=[b"X-Request-Id: " + request_id])
    assert reply.status == 200, reply.body
    assert reply.headers["x-request-id"] == request_id.decode()


# --- bodies that are not UTF-8 ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/memories", b'{"text": "caf\xe9"}'),
        ("/v1/memories/search", b'{"query": "\xff tea"}'),
        ("/v1/memories/add", b'{"text": ["ok", "\xc3\x28"]}'),
        (CHAT, b'{"model": "m", "messages": [{"role": "user", "content": "caf\xe9"}]}'),
    ],
)
async def test_a_body_that_is_not_utf8_is_a_documented_400(
    conn: RawConnection, path: str, body: bytes
) -> None:
    reply = await conn.request("POST", path, body)
    assert reply.status == 400, reply.body
    error = reply.error()
    assert error["code"] == "invalid_json", error
    assert "UTF-8" in error["message"] or "utf-8" in error["message"]


# --- metric labels ---------------------------------------------------------------------


@pytest.fixture
def model_labels_restored() -> Iterator[None]:
    from engram_core.genai import MODEL_LABEL

    before = MODEL_LABEL.seen()
    yield
    MODEL_LABEL.forget(MODEL_LABEL.seen() - before)


async def test_caller_chosen_models_paths_and_methods_leave_metrics_bounded(
    start_gateway: StartGateway, model_labels_restored: None
) -> None:
    """Every string a caller picks (the model, the path, the method) that could become a
    label: /metrics stays within the labels' bound however many distinct ones come."""
    from opentelemetry.sdk.resources import Resource

    from engram_core.genai import MAX_MODEL_LABELS
    from engram_core.metrics import setup_metrics

    setup_metrics(Resource.create({"service.name": "engram-gateway-test"}))
    client = (await start_gateway()).client()

    async def metrics_size() -> int:
        return len((await client.get("/metrics")).content)

    async def chats(first: int, count: int) -> None:
        for i in range(first, first + count):
            chat = {
                "model": f"edge-model-{i}",
                "memory": False,
                "messages": [{"role": "user", "content": "Hi"}],
            }
            assert (await client.post(CHAT, json=chat)).status_code == 200

    async def odd_requests(first: int, count: int) -> None:
        for i in range(first, first + count):
            assert (await client.get(f"/nowhere-{i}")).status_code == 404
            assert (await client.request(f"M{i}X", "/healthz")).status_code in (400, 405)

    await chats(0, MAX_MODEL_LABELS + 5)
    await odd_requests(0, 20)
    settled = await metrics_size()
    assert 'gen_ai_request_model="_OTHER"' in (await client.get("/metrics")).text
    await chats(MAX_MODEL_LABELS + 5, 300)
    await odd_requests(20, 300)
    assert await metrics_size() - settled < 2_000, "a caller's strings became labels"


# --- readiness -------------------------------------------------------------------------


async def test_readiness_is_about_chats_and_memory_is_reported_apart(
    start_gateway: StartGateway,
) -> None:
    """Retrieval going away (a restart) leaves the pod ready, since chats still answer;
    /readyz/memory, /readyz's ``memory`` and the gauge say memory is unavailable, and
    come back when it does."""
    from opentelemetry.sdk.resources import Resource

    from engram_core.metrics import setup_metrics

    setup_metrics(Resource.create({"service.name": "engram-gateway-test"}))
    from engram_cli.stack.nats_server import free_port

    gateway = await start_gateway(retrieval_address=f"127.0.0.1:{free_port()}")
    client = gateway.client()
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    chatted = await client.post(CHAT, json=chat)
    assert (chatted.status_code, chatted.headers["x-engram-memory"]) == (200, "unavailable")

    memory = await client.get("/readyz/memory")
    assert memory.status_code == 503
    assert memory.json()["error"]["code"] == "memory_unavailable"
    assert memory.json()["checks"] == {"retrieval": "unavailable"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json() == {
        "status": "ready",
        "checks": {"nats": "ok", "bus": "ok"},
        "memory": "unavailable",
    }
    assert memory_gauge(await client.get("/metrics")) == 0.0

    serving = await start_gateway()  # on the in-memory port, which serves
    client = serving.client()
    assert (await client.get("/readyz/memory")).status_code == 200
    assert (await client.get("/readyz")).json()["memory"] == "ok"
    assert memory_gauge(await client.get("/metrics")) == 1.0


def memory_gauge(metrics: Any) -> float:
    (line,) = [
        line
        for line in metrics.text.splitlines()
        if line.startswith("engram_gateway_memory_available{")
    ]
    return float(line.rsplit(" ", 1)[1])


async def test_the_probes_answer_without_an_api_key(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(api_keys="sha256:" + "0" * 64 + "=acme")
    client = gateway.client()
    for path in ("/healthz", "/readyz", "/readyz/memory"):
        assert (await client.get(path)).status_code == 200, path
