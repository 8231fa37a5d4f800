"""What a person meets: scenarios that drive the real stack (``engram up``: nats-server,
retrieval, gateway and every worker as processes) through real clients (the official
``openai`` SDK, the memory API over HTTP, the ``engram`` CLI), against the scripted,
deterministic upstream. One stack serves the whole folder; each scenario keeps to its own
users and conversations, as people sharing one deployment do.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from engram_cli.cli_common import WORKERS
from engram_cli.stack.scripted_llm import (
    RuleBasedBrain,
    ScriptedUpstream,
    UpstreamError,
    is_task_request,
)
from engram_cli.stack.up import Stack
from engram_testing.stack import start_stack
from engram_testing.waiting import eventually
from engram_testing.worker_stack import consumer_settled

wait_for = functools.partial(eventually, interval_s=0.2)


@dataclass
class Upstream:
    """The scripted model: the rule-based brain, plus failures a scenario asks for
    (``fail_next``: the next chat whose last message contains the key answers 500)."""

    brain: RuleBasedBrain = field(default_factory=lambda: RuleBasedBrain("Noted."))
    fail_next: dict[str, int] = field(default_factory=dict)

    def __call__(self, body: dict[str, Any]) -> str | UpstreamError:
        if not is_task_request(body):
            last = str(body["messages"][-1].get("content", ""))
            for key, count in list(self.fail_next.items()):
                if key in last and count > 0:
                    self.fail_next[key] = count - 1
                    return UpstreamError(500, "the model is overloaded")
        return self.brain(body)


@dataclass
class Engram:
    """The running stack and the clients a person uses against it."""

    stack: Stack
    upstream: ScriptedUpstream
    model: Upstream
    data_dir: Path

    @property
    def base_url(self) -> str:
        s = self.stack.settings
        return f"http://{s.gateway_host}:{s.gateway_port}/v1"

    def openai(self, **options: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.base_url, api_key="sk-anything", **options)

    def http(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(base_url=self.base_url, timeout=30)

    def sent_upstream(self, containing: str) -> list[dict[str, Any]]:
        """The chat requests the upstream received whose last message contains a text."""
        return [
            body
            for body in self.upstream.conversation_requests()
            if containing in str(body["messages"][-1].get("content", ""))
        ]

    def injected(self, containing: str) -> str:
        """The memory message Engram injected into the last such request."""
        messages = self.sent_upstream(containing)[-1]["messages"]
        memory = [
            m["content"] for m in messages if m["role"] == "system" and "Engram" in m["content"]
        ]
        assert len(memory) <= 1, messages
        return memory[0] if memory else ""

    async def memories(self, **params: Any) -> list[dict[str, Any]]:
        """Every memory the memory API lists for these filters (all pages)."""
        found: list[dict[str, Any]] = []
        query = {**params, "limit": 200}
        async with self.http() as http:
            while True:
                page = (await http.get("/memories", params=query)).json()
                found += page["data"]
                if not page["next_cursor"]:
                    return found
                query = {"cursor": page["next_cursor"], "limit": 200}

    async def facts(self, user: str, **params: Any) -> list[str]:
        return sorted(m["text"] for m in await self.memories(user=user, kind="fact", **params))

    async def until_facts(
        self, user: str, mentioning: list[str], timeout_s: float = 45, **params: Any
    ) -> list[str]:
        """Wait until the user has current facts mentioning each of these words (the
        scripted model's wording may change; what it learned may not); return them."""

        async def learned() -> list[str] | None:
            facts = await self.facts(user, **params)
            joined = " ".join(facts)
            return facts if all(word in joined for word in mentioning) else None

        found: list[str] = await wait_for(learned, timeout_s, what=f"{user}'s facts {mentioning}")
        return found

    async def settled(self, timeout_s: float = 45) -> None:
        """Every worker has handled everything published so far."""

        async def idle() -> bool:
            nats_url = self.stack.settings.nats_url
            return all([await consumer_settled(nats_url, worker) for worker in WORKERS])

        await wait_for(idle, timeout_s, what="the workers to catch up")

    def cli(self, *args: str) -> tuple[int, str]:
        """``engram <args>`` in a subprocess pointed at this stack; (exit code, output)."""
        s = self.stack.settings
        env_args = {
            "ENGRAM_DATA_DIR": str(self.data_dir),
            "ENGRAM_NATS_URL": s.nats_url,
            "ENGRAM_RETRIEVAL_ADDRESS": s.retrieval_listen,
            "ENGRAM_GATEWAY_URL": f"http://{s.gateway_host}:{s.gateway_port}",
            "ENGRAM_GATEWAY_PORT": str(s.gateway_port),
            "ENGRAM_HEALTH_PORT_BASE": str(s.health_port_base),
        }
        done = subprocess.run(
            [sys.executable, "-m", "engram_cli.main", *args],
            env={**os.environ, **env_args},
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="package")
def engram(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engram]:
    model = Upstream()
    data_dir = tmp_path_factory.mktemp("scenarios") / "data"
    # No ENGRAM_LLM_MODEL: chats lend their model to extraction; texts added without one
    # show what happens when no model is configured anywhere.
    stack, upstream = start_stack(data_dir, replies=[model])
    try:
        yield Engram(stack, upstream, model, data_dir)
    finally:
        stack.stop()
        upstream.stop()
