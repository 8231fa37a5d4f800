"""``engram import`` through the whole stack (every worker process, the rule-based
scripted LLM): imported user messages are learned as facts, ``engram search`` finds
them, and ``engram status`` sees every service ready and no lag left."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_cli.main import main
from engram_cli.stack.up import Stack
from engram_core.codec import pb

from .conftest import count_memories, wait_for
from .test_learning import start_stack

pytestmark = pytest.mark.e2e


@pytest.fixture
def full_stack(tmp_path: Path) -> Iterator[Stack]:
    stack, upstream = start_stack(tmp_path / "data")
    try:
        yield stack
    finally:
        stack.stop()
        upstream.stop()


async def test_imported_history_is_learned(
    full_stack: Stack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = full_stack.settings
    monkeypatch.setenv("ENGRAM_DATA_DIR", str(tmp_path / "cli"))
    gateway = f"http://{s.gateway_host}:{s.gateway_port}"
    source = tmp_path / "history.jsonl"
    source.write_text(
        json.dumps(
            {
                "conversation_id": "imported",
                "user_id": "alice",
                "messages": [
                    {"role": "user", "content": "I love green tea."},
                    {"role": "assistant", "content": "Noted."},
                    {"role": "user", "content": "My sister's name is Eva."},
                ],
            }
        )
        + "\n"
    )

    def cli(*args: str) -> int:
        return main(list(args))

    assert (
        await asyncio.to_thread(cli, "import", str(source), "--gateway", gateway, "--model", "m")
        == 0
    )

    async def facts() -> int | None:
        n = await count_memories(s.retrieval_listen, "default", "imported", pb.MEMORY_KIND_FACT)
        return n if n >= 2 else None

    await wait_for(facts, 45, what="facts extracted from the imported messages")
    assert await count_memories(s.retrieval_listen, "default", "imported") == 2  # user turns

    capsys.readouterr()
    code = await asyncio.to_thread(
        cli, "search", "what tea do I like?", "--user", "alice", "--conversation",
        "imported", "--gateway", gateway, "--json",
    )  # fmt: skip
    assert code == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert any(h["kind"] == "fact" and "green tea" in h["text"] for h in hits), hits

    status = ("status", "--gateway", gateway, "--retrieval", s.retrieval_listen, "--nats",
              s.nats_url, "--health-port-base", str(s.health_port_base), "--json")  # fmt: skip

    async def settled() -> dict | None:
        code = await asyncio.to_thread(cli, *status)
        report = json.loads(capsys.readouterr().out)
        lag = [
            c["num_pending"] + c["num_ack_pending"]
            for c in report["jetstream"]["consumers"].values()
            if c
        ]
        return report if code == 0 and not any(lag) else None

    report = await wait_for(settled, 30, what="every service ready, nothing pending")
    assert report["memories"]["by_kind"]["fact"] >= 2
