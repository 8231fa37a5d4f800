"""A local reasoning model still teaches Engram (issue 36), through the whole stack as
``engram up`` runs it: real nats-server, retrieval, gateway and every worker process.

The upstream is the scripted rule-based model behind what a reasoning model writes
before its answer — a ``<think>`` block with a draft JSON inside, word for word what
the issue measured — so the answers are the brain's, unchanged, in that dress. Before
the workers read replies the way such models write them, the turn below taught nothing:
ingest took the draft and the answer for one value, re-asked, and fell back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest

from engram_cli.stack.reply_styles import styled
from engram_cli.stack.scripted_llm import Answer, RuleBasedBrain, ScriptedUpstream, is_task_request
from engram_cli.stack.up import Stack
from engram_testing.stack import start_stack

from .conftest import wait_for

pytestmark = pytest.mark.e2e

MODEL = "small-reasoner"
#: A task about a text holding this word is answered with a refusal, as small models do.
REFUSED = "Marlowe"


class ReasoningModel:
    """The rule-based brain in the issue's ``<think>`` style; a refusal for any task
    whose input mentions :data:`REFUSED`."""

    def __init__(self) -> None:
        brain = RuleBasedBrain("Noted.")
        self.thinking = styled(brain, "think_with_draft")
        self.refusing = styled(brain, "refusal")

    def __call__(self, body: dict[str, Any]) -> Answer:
        # messages[1] is the task's input, in the first ask and in the re-ask alike
        if is_task_request(body) and REFUSED in body["messages"][1]["content"]:
            return self.refusing(body)
        return self.thinking(body)


@dataclass
class LocalModelStack:
    stack: Stack
    upstream: ScriptedUpstream

    @property
    def base_url(self) -> str:
        s = self.stack.settings
        return f"http://{s.gateway_host}:{s.gateway_port}/v1"

    def http(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(base_url=self.base_url, timeout=30)

    async def memories(self, user: str, kind: str) -> list[dict[str, Any]]:
        async with self.http() as http:
            reply = await http.get("/memories", params={"user": user, "kind": kind, "limit": 200})
        return list(reply.json()["data"])

    def task_requests(self, task: str, mentioning: str) -> list[dict[str, Any]]:
        return [
            body
            for body in self.upstream.chat_requests()
            if body["messages"][0]["content"].startswith(f"engram-task: {task}\n")
            and mentioning in body["messages"][1]["content"]
        ]

    def status(self) -> dict[str, Any]:
        """``engram status --json`` in a subprocess pointed at this stack."""
        s = self.stack.settings
        env = {
            **os.environ,
            "ENGRAM_NATS_URL": s.nats_url,
            "ENGRAM_RETRIEVAL_ADDRESS": s.retrieval_listen,
            "ENGRAM_GATEWAY_URL": f"http://{s.gateway_host}:{s.gateway_port}",
            "ENGRAM_HEALTH_PORT_BASE": str(s.health_port_base),
        }
        done = subprocess.run(
            [sys.executable, "-m", "engram_cli.main", "status", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return dict(json.loads(done.stdout))


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalModelStack]:
    data_dir = tmp_path_factory.mktemp("local-models") / "data"
    stack, upstream = start_stack(data_dir, replies=[ReasoningModel()], ENGRAM_LLM_MODEL=MODEL)
    try:
        yield LocalModelStack(stack, upstream)
    finally:
        stack.stop()
        upstream.stop()


async def test_a_reasoning_models_answer_teaches_the_fact(local: LocalModelStack) -> None:
    said = "My kayak is called Zephyr and I paddle it every Sunday."
    async with local.http() as http:
        reply = await http.post(
            "/chat/completions",
            json={
                "model": "chat-model",
                "user": "kim",
                "memory_id": "boats",
                "messages": [{"role": "user", "content": said}],
            },
        )
    assert reply.status_code == 200, reply.text

    async def learned() -> list[str] | None:
        texts = [m["text"] for m in await local.memories("kim", "fact")]
        return texts if any("Zephyr" in t for t in texts) else None

    facts = await wait_for(learned, 45, what="a fact about Zephyr")
    assert "User's kayak is called Zephyr" in facts
    # understood on the first reply: no corrective re-ask
    assert len(local.task_requests("extract_facts", "Zephyr")) == 1

    # reconcile reads the same style: the correction supersedes the old name
    async with local.http() as http:
        await http.post(
            "/chat/completions",
            json={
                "model": "chat-model",
                "user": "kim",
                "memory_id": "boats",
                "messages": [{"role": "user", "content": "My kayak is called Zephyrus."}],
            },
        )

    async def corrected() -> list[str] | None:
        texts = [m["text"] for m in await local.memories("kim", "fact")]
        return texts if "User's kayak is called Zephyrus" in texts else None

    facts = await wait_for(corrected, 45, what="the corrected name")
    assert "User's kayak is called Zephyr" not in facts  # superseded, kept as history
    assert local.task_requests("reconcile", "Zephyrus")

    # and so does summarize: the rolling summary is the model's, not the rules'
    async def summarised() -> dict[str, Any] | None:
        for summary in await local.memories("kim", "summary"):
            if "Zephyrus" in summary["text"]:
                return summary
        return None

    summary = await wait_for(summarised, 45, what="the summary with the new name")
    assert summary["metadata"]["summarizer"] == "llm", summary


async def test_an_unusable_answer_is_reported_on_the_event_and_in_engram_status(
    local: LocalModelStack,
) -> None:
    async with local.http() as http:
        added = await http.post(
            "/memories/add", json={"text": f"My dog is called {REFUSED}.", "user": "lee"}
        )
        [event_id] = added.json()["event_ids"]

        async def handled() -> dict[str, Any] | None:
            event = (await http.get(f"/events/{event_id}")).json()
            return event if event["status"] != "pending" else None

        event = await wait_for(handled, 45, what="the added text to be handled")
    assert event["status"] == "skipped"
    assert f"unusable ({MODEL})" in event["fallback"]
    assert event["fallback"] in event["reason"]
    # asked, and asked again with the reason, before falling back
    assert len(local.task_requests("extract_facts", REFUSED)) == 2

    rows = local.status()["model_tasks"]["tasks"]
    extraction = next(r for r in rows if (r["task"], r["model"]) == ("extract_facts", MODEL))
    assert extraction["fallbacks"] == {"unusable": 1}
    assert extraction["fallback_rate"] == round(1 / extraction["asked"], 3)
