"""The whole stack, as `engram up` runs it: real nats-server, retrieval, gateway, ingest."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_cli.stack import Stack
from engram_core.proto import pb
from engram_core.retrieval_client import RetrievalClient
from engram_testing.stack import stack_settings
from engram_testing.upstream import ScriptedUpstream
from engram_testing.waiting import eventually


@pytest.fixture
def spans_file(tmp_path: Path) -> Path:
    return tmp_path / "spans.jsonl"


@pytest.fixture
def stack(
    tmp_path: Path,
    scripted_upstream: ScriptedUpstream,
    spans_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Stack]:
    monkeypatch.setenv("ENGRAM_LLM_BASE_URL", scripted_upstream.base_url)
    monkeypatch.setenv("ENGRAM_TRACES_FILE", str(spans_file))
    monkeypatch.setenv("ENGRAM_LOG_FORMAT", "json")
    running = Stack(stack_settings(tmp_path / "data"), echo=lambda _: None, relay_logs=False)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def gateway_url(stack: Stack) -> str:
    return f"http://{stack.settings.gateway_host}:{stack.settings.gateway_port}/v1"


# The whole stack settles slower than one worker in-process: callers name their timeout
# (30 s unless the outcome needs longer) and the checks poll at a gentler pace.
wait_for = functools.partial(eventually, interval_s=0.2)


async def count_memories(
    address: str, tenant: str, conversation_id: str, kind: int = pb.MEMORY_KIND_TURN
) -> int:
    """How many memories of one kind (turns by default) a conversation holds."""
    client = RetrievalClient(address)
    try:
        reply = await client.count(
            pb.CountRequest(
                tenant=tenant,
                filter=pb.MemoryFilter(conversation_id=conversation_id, kinds=[kind]),
            )
        )
        return int(reply.count)
    finally:
        await client.close()


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
