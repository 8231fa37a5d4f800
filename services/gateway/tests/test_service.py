"""Probes, error shape, /v1 pass-through, tracing and the console script."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engram_cli.stack.nats_server import free_port
from engram_core.metrics import setup_metrics
from engram_testing.upstream import RecordedRequest, ScriptedUpstream

CHAT = "/v1/chat/completions"
#: An address nobody listens on: these tests need no retrieval.
UNREACHABLE_RETRIEVAL = "127.0.0.1:1"


class EchoUpstream(ScriptedUpstream):
    """The scripted upstream plus ``/v1/echo/...``, which answers with what it received."""

    async def _echo(self, request: Request) -> Response:
        body = await request.body()
        self.requests.append(RecordedRequest(request.url.path, dict(request.headers), {}))
        return JSONResponse(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "body": body.decode(),
                "content_type": request.headers.get("content-type"),
            },
            status_code=201,
            headers={"x-upstream-thing": "kept"},
        )

    def app(self) -> Starlette:
        app = super().app()
        app.router.routes.append(
            Route("/v1/echo/{rest:path}", self._echo, methods=["GET", "POST", "PUT", "DELETE"])
        )
        return app


@pytest.fixture
def echo_upstream() -> Iterator[EchoUpstream]:
    upstream = EchoUpstream().start()
    assert isinstance(upstream, EchoUpstream)
    try:
        yield upstream
    finally:
        upstream.stop()


# --- probes and errors ---------------------------------------------------------------


async def test_healthz_and_readyz(client: httpx2.AsyncClient) -> None:
    health = await client.get("/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    memory = await client.get("/readyz/memory")
    assert (memory.status_code, memory.json()) == (
        200,
        {"status": "ready", "checks": {"retrieval": "ok"}},
    )
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "checks": {"nats": "ok", "bus": "ok"},
        "memory": "ok",
    }
    assert ready.headers["x-request-id"]


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/nope", 404, "not_found"),
        ("POST", "/healthz", 405, "method_not_allowed"),
    ],
)
async def test_unknown_paths_are_openai_shaped(
    client: httpx2.AsyncClient, method: str, path: str, status: int, code: str
) -> None:
    response = await client.request(method, path)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert path in error["message"]


# --- pass-through --------------------------------------------------------------------


async def test_models_pass_through(client: httpx2.AsyncClient, scripted_upstream: Any) -> None:
    response = await client.get("/v1/models", headers={"Authorization": "Bearer caller"})
    assert response.status_code == 200
    assert response.json() == {
        "object": "list",
        "data": [{"id": "scripted-model", "object": "model", "created": 0, "owned_by": "scripted"}],
    }
    recorded = scripted_upstream.requests[-1]
    assert recorded.path == "/v1/models"
    assert recorded.headers["authorization"] == "Bearer caller"


async def test_allowed_v1_requests_pass_through_unchanged(
    start_gateway: Any, echo_upstream: EchoUpstream
) -> None:
    gateway = await start_gateway(
        llm_base_url=echo_upstream.base_url, gateway_passthrough=("echo", "models")
    )
    client = gateway.client()
    body = b'{"input": ["a", "b"], "model": "embed", "whatever": [1, {"x": null}]}'
    response = await client.post(
        "/v1/echo/embeddings/a%20b?x=1&y=%20z",  # an encoded slash would be a 404
        content=body,
        headers={"content-type": "application/json", "X-Engram-Memory-Id": "not-forwarded"},
    )
    assert response.status_code == 201
    assert response.headers["x-upstream-thing"] == "kept"
    echoed = response.json()
    assert echoed == {
        "method": "POST",
        "path": "/v1/echo/embeddings/a b",
        "query": "x=1&y=%20z",
        "body": body.decode(),
        "content_type": "application/json",
    }
    assert "x-engram-memory-id" not in echo_upstream.requests[-1].headers

    deleted = await client.delete("/v1/echo/files/f-1")
    assert deleted.json()["method"] == "DELETE"
    missing = await client.get("/v1/models/no-such-model")
    assert missing.status_code == 404  # the upstream's answer, relayed


async def test_paths_outside_the_allowlist_are_404_and_never_relayed(
    start_gateway: Any, echo_upstream: EchoUpstream
) -> None:
    gateway = await start_gateway(llm_base_url=echo_upstream.base_url)  # models, embeddings
    client = gateway.client()
    for method, path in (
        ("GET", "/v1/files"),
        ("POST", "/v1/batches"),
        ("DELETE", "/v1/assistants/asst_1"),
        ("GET", "/v1/memories/"),
        ("GET", "/v1/echo/embeddings"),
    ):
        response = await client.request(method, path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"
        assert path in response.json()["error"]["message"]
    assert echo_upstream.requests == []


async def test_pass_through_to_an_unreachable_upstream_is_502(start_gateway: Any) -> None:
    gateway = await start_gateway(llm_base_url=f"http://127.0.0.1:{free_port()}/v1")
    response = await gateway.client().get("/v1/models")
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"


# --- tracing -------------------------------------------------------------------------


async def test_upstream_call_is_a_gen_ai_span_under_the_request_span(gateway: Any) -> None:
    client = gateway.client()
    response = await client.post(
        CHAT, json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 200
    spans = gateway.spans.get_finished_spans()
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    (upstream,) = [
        s
        for s in spans
        if s.kind is SpanKind.CLIENT
        and "chat/completions"
        in str(s.attributes.get("url.full", "") or s.attributes.get("http.url", ""))
    ]
    (chat,) = [s for s in spans if s.name == "chat m"]
    assert chat.kind is SpanKind.CLIENT and chat.attributes is not None
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "m"
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["engram.llm.task"] == "chat"
    assert upstream.context.trace_id == server.context.trace_id
    assert chat.parent is not None and chat.parent.span_id == server.context.span_id
    assert upstream.parent is not None and upstream.parent.span_id == chat.context.span_id


# --- metrics -------------------------------------------------------------------------


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


async def test_metrics_show_request_duration_and_the_llm_call(gateway: Any) -> None:
    setup_metrics(Resource.create({"service.name": "engram-gateway-test"}))
    client = gateway.client()
    response = await client.post(
        CHAT, json={"model": "metrics-model", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 200
    scrape = await client.get("/metrics")  # no API key needed, not traced
    assert scrape.status_code == 200
    assert scrape.headers["content-type"].startswith("text/plain")
    text = scrape.text
    requests = samples(text, "http_server_request_duration_seconds_count")
    assert any(
        labels.get("http_route") == CHAT and labels.get("http_response_status_code") == "200"
        for labels, value in requests
        if value >= 1
    ), requests
    calls = samples(text, "gen_ai_client_operation_duration_seconds_count")
    assert any(labels.get("gen_ai_request_model") == "metrics-model" for labels, _ in calls)
    assert not [s for s in gateway.spans.get_finished_spans() if "/metrics" in s.name]


# --- the console script --------------------------------------------------------------


def _gateway_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "OTEL_"))}
    env.update({"ENGRAM_LOG_FORMAT": "json", **extra})
    return env


async def test_console_script_serves_and_stops_cleanly(
    nats_url: str, scripted_upstream: Any
) -> None:
    """Ready without retrieval (memory is reported apart): nobody listens on its address."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "engram_gateway",
        env=_gateway_env(
            ENGRAM_NATS_URL=nats_url,
            ENGRAM_GATEWAY_PORT="0",
            ENGRAM_RETRIEVAL_ADDRESS=UNREACHABLE_RETRIEVAL,
            ENGRAM_LLM_BASE_URL=scripted_upstream.base_url,
        ),
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    records = []
    try:
        url = None
        while line := await asyncio.wait_for(process.stderr.readline(), timeout=20):
            record = json.loads(line)
            records.append(record)
            assert record["service"] == "engram-gateway"
            if record["event"] == "gateway.listening":
                url = record["url"]
                break
        assert url and url.startswith("http://127.0.0.1:"), records
        async with httpx2.AsyncClient(base_url=url) as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/readyz")).status_code == 200
        process.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(process.stderr.read(), timeout=20)
        assert await process.wait() == 0
        events = [json.loads(line)["event"] for line in rest.decode().splitlines()]
        assert "gateway.stopped" in events
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def test_console_script_rejects_bad_configuration() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "engram_gateway"],
        env=_gateway_env(ENGRAM_LLM_BASE_URL="not-a-url"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "ENGRAM_LLM_BASE_URL" in result.stderr
    assert "Traceback" not in result.stderr


async def test_unexpected_errors_are_500_openai_shaped(gateway: Any) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internals")

    gateway.app.state.gateway.upstream.chat = broken
    response = await gateway.client().post(
        CHAT, json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert "secret internals" not in response.text
