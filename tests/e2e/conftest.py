"""The whole stack, as `engram up` runs it: real nats-server, retrieval, gateway, ingest."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engram_cli.stack.scripted_llm import RuleBasedBrain
from engram_cli.stack.up import Stack
from engram_core.codec import pb
from engram_core.retrieval_client import RetrievalClient
from engram_gateway.keys import entry_for
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
    # A process per worker, as the chart deploys them: the trace tests name each
    # worker's service (in one process they all are engram-workers).
    running = Stack(
        stack_settings(tmp_path / "data"),
        echo=lambda _: None,
        relay_logs=False,
        process_per_worker=True,
    )
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
    address: str, tenant: str, conversation_id: str, kind: pb.MemoryKind = pb.MEMORY_KIND_TURN
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


# --- two tenants, for the MCP server and the memory browser ----------------------------------

TOOLS_KEY_A, TOOLS_KEY_B = "e2e-tools-key-a", "e2e-tools-key-b"
#: An operator's key (tenant A's, with the admin role): the memory browser's operator panel.
TOOLS_ADMIN_KEY = "e2e-tools-admin-key"


@dataclass
class TwoTenantStack:
    """The stack with API keys for two tenants (A: acme, B: beta; an admin key of acme's)
    and its spans file."""

    stack: Stack
    spans_file: Path

    @property
    def base_url(self) -> str:
        return f"http://{self.stack.settings.gateway_host}:{self.stack.settings.gateway_port}"


@pytest.fixture(scope="module")
def two_tenant_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoTenantStack]:
    """Gateway, retrieval, NATS and the learning workers (ingest, reconcile, summarize)
    with the rule-based scripted LLM, for one test module (the MCP tests, the browser
    tests), stopped when the module is done."""
    tmp = tmp_path_factory.mktemp("two-tenants")
    upstream = ScriptedUpstream(replies=[RuleBasedBrain(chat_reply="Noted.")]).start()
    spans_file = tmp / "spans.jsonl"
    keys = (
        f"{entry_for(TOOLS_KEY_A, 'acme')},{entry_for(TOOLS_KEY_B, 'beta')},"
        f"{entry_for(TOOLS_ADMIN_KEY, 'acme')}:admin"
    )
    stack = Stack(
        stack_settings(tmp / "data"),
        echo=lambda _: None,
        relay_logs=False,
        workers=("ingest", "reconcile", "summarize"),
        process_per_worker=True,  # the MCP tests follow a turn through each worker's service
        extra_env={
            "ENGRAM_LLM_BASE_URL": upstream.base_url,
            # add_memory sends no model: the workers' own decides what extraction uses
            "ENGRAM_LLM_MODEL": upstream.model,
            "ENGRAM_LOG_FORMAT": "json",
            "ENGRAM_API_KEYS": keys,
            "ENGRAM_TRACES_FILE": str(spans_file),
        },
    )
    try:
        stack.start()
        yield TwoTenantStack(stack, spans_file)
    finally:
        stack.stop()
        upstream.stop()
