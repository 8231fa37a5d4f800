"""The installed ``engram-ingest`` entry point as a real process: start, trace, stop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.request
from pathlib import Path

import nats
import pytest

from engram_cli.stack.nats_server import free_port
from engram_core.bus import ensure_stream
from engram_core.events import STREAM_NAME, TurnPersisted
from engram_core.memory_port import MemoryPort
from engram_testing.worker_stack import RealRetrieval
from engram_workers.ingest import turn_memory_id

pytestmark = pytest.mark.integration

ENTRY_POINT = Path(sys.executable).parent / "engram-ingest"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
SECRET_TEXT = "my locker code is 4711"


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
            return reply.status == 200
    except OSError:
        return False


def worker_env(nats_url: str, retrieval: str, tmp_path: Path, health_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "OTEL_"))}
    env.update(
        ENGRAM_NATS_URL=nats_url,
        ENGRAM_RETRIEVAL_ADDRESS=retrieval,
        ENGRAM_HEALTH_PORT=str(health_port),
        ENGRAM_HEALTH_HOST="127.0.0.1",
        ENGRAM_LOG_FORMAT="json",
        ENGRAM_TRACES_FILE=str(tmp_path / "traces.jsonl"),
    )
    return env


async def test_engram_ingest_runs_continues_the_trace_and_stops_on_sigterm(
    nats_url: str, retrieval: RealRetrieval, tmp_path: Path, eventually
) -> None:
    port = free_port()
    log_path = tmp_path / "ingest.log"
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            str(ENTRY_POINT),
            env=worker_env(nats_url, retrieval.address, tmp_path, port),
            stdout=log_file,
            stderr=log_file,
        )
    try:
        await eventually(lambda: asyncio.to_thread(ready, port), 30, "/readyz")

        # Published the way the gateway does: JSON body, Nats-Msg-Id, W3C trace context.
        event = TurnPersisted(tenant="acme", turn_id="t-9", role="user", text=SECRET_TEXT)
        nc = await nats.connect(nats_url)
        try:
            await nc.jetstream().publish(
                event.subject,
                event.model_dump_json().encode(),
                stream=STREAM_NAME,
                headers={
                    "Nats-Msg-Id": event.event_id,
                    "traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01",
                },
            )
        finally:
            await nc.close()
        memories = MemoryPort(retrieval.client)
        memory_id = turn_memory_id(event.tenant, event.conversation_id, event.turn_id)

        async def indexed() -> bool:
            return await memories.get_one(event.tenant, memory_id) is not None

        await eventually(indexed, 15, "the turn in retrieval")

        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    spans = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    ours = [s for s in spans if s["trace_id"] == TRACE_ID]
    assert {s["service"] for s in ours} == {"engram-ingest"}
    consume = next(s for s in ours if s["kind"] == "CONSUMER")
    assert consume["parent_span_id"] == PARENT_SPAN_ID
    assert consume["attributes"]["engram.event_id"] == event.event_id
    assert any(s["kind"] == "CLIENT" and "Upsert" in s["name"] for s in ours)

    output = log_path.read_text()
    assert SECRET_TEXT not in output
    lines = [json.loads(line) for line in output.splitlines()]  # every line is JSON
    [indexed_line] = [line for line in lines if line["event"] == "turn.indexed"]
    assert indexed_line["trace_id"] == TRACE_ID
    assert (indexed_line["event_id"], indexed_line["tenant"]) == (event.event_id, "acme")
    assert lines[-1]["event"] == "worker.stopped"


async def test_engram_ingest_exits_non_zero_on_a_conflicting_stream(
    nats_url: str, tmp_path: Path
) -> None:
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().add_stream(name=STREAM_NAME, subjects=["something.else.>"])
    finally:
        await nc.close()
    process = await asyncio.create_subprocess_exec(
        str(ENTRY_POINT),
        env=worker_env(nats_url, "127.0.0.1:1", tmp_path, 0),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 1
    [failure] = [
        line
        for line in map(json.loads, output.decode().splitlines())
        if line["event"] == "worker.failed"
    ]
    assert failure["error"].startswith("StreamConfigConflict")
    with pytest.raises(Exception, match="conflicting"):
        await ensure_stream(nats_url)
