"""The standard OTLP protocol variables, end to end: the gateway's console script with
``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`` delivers its spans (and, with
``OTEL_METRICS_EXPORTER=otlp``, its metrics) to an OTLP/HTTP receiver; a protocol the
exporters do not speak stops it at start."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

import httpx2

from engram_testing.otlp_receiver import otlp_http_receiver

#: An address nobody listens on: a passthrough request needs no retrieval.
UNREACHABLE_RETRIEVAL = "127.0.0.1:1"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "OTEL_"))}
    env.update({"ENGRAM_LOG_FORMAT": "json", "ENGRAM_GATEWAY_PORT": "0", **extra})
    return env


def _stack_env(nats_url: str, upstream: Any, **otel: str) -> dict[str, str]:
    """The gateway's environment against the test's NATS and upstream."""
    return _env(
        ENGRAM_NATS_URL=nats_url,
        ENGRAM_RETRIEVAL_ADDRESS=UNREACHABLE_RETRIEVAL,
        ENGRAM_LLM_BASE_URL=upstream.base_url,
        **otel,
    )


async def _serve_one_request(env: dict[str, str]) -> None:
    """Start the gateway, send it one traced request, stop it (which flushes exports)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engram_gateway", env=env, stderr=asyncio.subprocess.PIPE
    )
    assert process.stderr is not None
    try:
        url = None
        while line := await asyncio.wait_for(process.stderr.readline(), timeout=30):
            record = json.loads(line)
            if record["event"] == "gateway.listening":
                url = record["url"]
                break
        assert url, "the gateway did not start"
        async with httpx2.AsyncClient(base_url=url) as client:
            assert (await client.get("/v1/models")).status_code == 200
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.stderr.read(), timeout=30)
        assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_spans_and_metrics_reach_an_otlp_http_receiver(
    nats_url: str, scripted_upstream: Any
) -> None:
    with otlp_http_receiver() as receiver:
        await _serve_one_request(
            _stack_env(
                nats_url,
                scripted_upstream,
                OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
                OTEL_METRICS_EXPORTER="otlp",
            )
        )
        spans = receiver.wait_for_span("engram-gateway")
    names = {span.name for span in spans}
    assert "GET /v1/{path:path}" in names, names  # the server span of the request
    assert "GET" in names, names  # the gateway's upstream call (httpx)
    assert len({span.trace_id for span in spans if span.name.startswith("GET")}) == 1
    assert receiver.content_types == {"application/x-protobuf"}
    assert ("engram-gateway", "http.server.request.duration") in receiver.metrics


async def test_the_traces_protocol_wins_over_the_generic_one(
    nats_url: str, scripted_upstream: Any
) -> None:
    with otlp_http_receiver() as receiver:
        await _serve_one_request(
            _stack_env(
                nats_url,
                scripted_upstream,
                OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
                OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.url + "/v1/traces",
            )
        )
        assert receiver.wait_for_span("engram-gateway")
    assert receiver.metrics == []  # metrics are not pushed unless asked for


def test_an_unknown_protocol_stops_the_gateway_naming_the_variable() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "engram_gateway"],
        env=_env(OTEL_EXPORTER_OTLP_PROTOCOL="http/json"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" in result.stderr
    assert "grpc, http/protobuf" in result.stderr
    assert "Traceback" not in result.stderr
