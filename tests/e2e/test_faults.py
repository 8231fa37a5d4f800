"""Faults on the real stack (nats-server, retrieval, gateway and ingest as processes):
NATS killed and restarted under a chat stream, retrieval down for longer than the old
retry budget, ingest killed in the middle of a batch. Nothing accepted is lost and
nothing is stored twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import nats
import pytest

from engram_cli.stack.up import Stack
from engram_core.codec import pb
from engram_core.events import TurnPersisted
from engram_core.retrieval_client import RetrievalClient
from engram_testing.upstream import ScriptedUpstream
from engram_testing.worker_stack import dead_letter_count

from .conftest import stack_settings, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHAT = "/v1/chat/completions"


@pytest.fixture
def start_stack(
    tmp_path: Path, scripted_upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
) -> Iterator[object]:
    """``start_stack(**env)``: nats-server, retrieval, the gateway and ingest."""
    monkeypatch.setenv("ENGRAM_LLM_BASE_URL", scripted_upstream.base_url)
    monkeypatch.setenv("ENGRAM_LOG_FORMAT", "json")
    stacks: list[Stack] = []

    def start(**env: str) -> Stack:
        running = Stack(
            stack_settings(tmp_path / "data"),
            echo=lambda _: None,
            relay_logs=False,
            workers=("ingest",),
            process_per_worker=True,  # ingest is killed alone
            extra_env={"ENGRAM_EXTRACTION_ENABLED": "false", **env},
        )
        stacks.append(running)
        running.start()
        return running

    try:
        yield start
    finally:
        for running in stacks:
            running.stop()


def gateway(stack: Stack) -> str:
    return f"http://{stack.settings.gateway_host}:{stack.settings.gateway_port}"


async def turn_texts(stack: Stack, conversation: str, role: str) -> Counter[str]:
    """How often each text is stored as a turn of this role in the conversation."""
    client = RetrievalClient(stack.settings.retrieval_listen, timeout_s=10)
    try:
        texts: Counter[str] = Counter()
        token = ""
        while True:
            reply = await client.list(
                pb.ListRequest(
                    tenant="default",
                    filter=pb.MemoryFilter(
                        conversation_id=conversation, kinds=[pb.MEMORY_KIND_TURN]
                    ),
                    page_size=500,
                    page_token=token,
                )
            )
            texts.update(m.text for m in reply.memories if m.role == role)
            token = reply.next_page_token
            if not token:
                return texts
    finally:
        await client.close()


@dataclass
class ChatLog:
    accepted: list[str] = field(default_factory=list)  # 200
    refused: list[str] = field(default_factory=list)  # 503 turn_not_persisted
    replies_recorded: int = 0  # 200s whose assistant turn was persisted
    other: list[str] = field(default_factory=list)  # anything else: a failure


async def chat_stream(url: str, conversation: str, count: int, log: ChatLog) -> None:
    """One user message after another, each a chat of its own in one conversation."""
    async with httpx2.AsyncClient(base_url=url, timeout=30) as http:
        for n in range(count):
            text = f"Message number {n} of the {conversation} stream."
            body: dict[str, object] = {"model": "m", "memory_id": conversation}
            body["messages"] = [{"role": "user", "content": text}]
            try:
                reply = await http.post(CHAT, json=body)
            except httpx2.HTTPError as exc:
                log.other.append(f"{text}: {type(exc).__name__}")
                continue
            if reply.status_code == 200:
                log.accepted.append(text)
                if reply.headers.get("x-engram-assistant-turn") != "not-persisted":
                    log.replies_recorded += 1
            elif reply.status_code == 503 and reply.json()["error"]["code"] == "turn_not_persisted":
                log.refused.append(text)
            else:
                log.other.append(f"{text}: {reply.status_code} {reply.text[:200]}")
            await asyncio.sleep(0.05)


async def test_nats_killed_and_restarted_under_a_chat_stream(start_stack) -> None:
    stack: Stack = start_stack(ENGRAM_PUBLISH_RETRY_S="1")
    log = ChatLog()
    chats = asyncio.create_task(chat_stream(gateway(stack), "nats-fault", 60, log))
    await wait_for(lambda: len(log.accepted) >= 10, 30, what="chats before the fault")
    await asyncio.to_thread(stack.nats.kill)
    await wait_for(lambda: len(log.refused) >= 3, 30, what="chats refused while NATS is down")
    await asyncio.to_thread(stack.nats.start)  # same port, same store
    await asyncio.wait_for(chats, 120)

    assert log.other == []
    assert log.refused, "NATS was down long enough to refuse some turns"
    assert len(log.accepted) > 20  # before and after the outage

    async def users_indexed() -> Counter[str] | None:
        texts = await turn_texts(stack, "nats-fault", "user")
        return texts if all(texts[t] for t in log.accepted) else None

    users = await wait_for(users_indexed, 60, what="every accepted user turn indexed")
    assert all(users[t] == 1 for t in log.accepted)  # none duplicated
    # A refused turn may still have landed (the ack was lost, not the message): once.
    assert all(users[t] <= 1 for t in log.refused)
    assert set(users) <= set(log.accepted) | set(log.refused)

    async def replies_indexed() -> int | None:
        count = (await turn_texts(stack, "nats-fault", "assistant"))["OK."]
        return count if count >= log.replies_recorded else None

    replies = await wait_for(replies_indexed, 60, what="every recorded reply indexed")
    assert replies <= len(log.accepted)
    assert await dead_letter_count(stack.settings.nats_url, "ingest") == 0


async def test_retrieval_down_longer_than_the_old_retry_budget(start_stack) -> None:
    # The old policy gave up after 3 deliveries, 0.2 + 0.5 s apart: 0.7 s.
    stack: Stack = start_stack(
        ENGRAM_RETRY_BACKOFF_S="0.2,0.5", ENGRAM_MAX_DELIVER="3", ENGRAM_RETRY_HORIZON_S="600"
    )
    url = gateway(stack)
    await asyncio.to_thread(stack.kill, "retrieval")
    log = ChatLog()
    await chat_stream(url, "retrieval-fault", 8, log)
    assert (len(log.accepted), log.other) == (8, [])  # chats go on without memory
    await asyncio.sleep(6)  # far beyond 0.7 s: the old policy had dead-lettered them
    await asyncio.to_thread(stack.revive, "retrieval")
    serving_at = time.monotonic()

    async with httpx2.AsyncClient(base_url=url, timeout=30) as http:

        async def memory_back() -> bool:
            body = {"model": "m", "messages": [{"role": "user", "content": "Anything?"}]}
            reply = await http.post(CHAT, json={**body, "memory": True, "memory_id": "probe"})
            return reply.headers.get("x-engram-memory") != "unavailable"

        await wait_for(memory_back, 10, what="the gateway to use memory again")
    recovered_s = time.monotonic() - serving_at
    assert recovered_s < 5, f"memory unavailable for {recovered_s:.1f}s after retrieval serves"

    async def all_indexed() -> Counter[str] | None:
        texts = await turn_texts(stack, "retrieval-fault", "user")
        return texts if all(texts[t] for t in log.accepted) else None

    users = await wait_for(all_indexed, 60, what="every turn indexed after the outage")
    assert all(users[t] == 1 for t in log.accepted)
    assert await dead_letter_count(stack.settings.nats_url, "ingest") == 0


async def test_ingest_killed_mid_batch_loses_and_duplicates_nothing(start_stack) -> None:
    stack: Stack = start_stack(ENGRAM_ACK_WAIT_S="3")
    total = 150
    texts = [f"Batch turn {n}: I planted {n} tulips." for n in range(total)]
    nc = await nats.connect(stack.settings.nats_url)
    try:
        js = nc.jetstream()
        for n, text in enumerate(texts):
            event = TurnPersisted(
                tenant="default",
                conversation_id="batch",
                turn_id=f"batch-{n}",
                role="user",
                text=text,
                turn_index=n,
            )
            await js.publish(
                event.subject,
                event.model_dump_json().encode(),
                headers={"Nats-Msg-Id": event.event_id},
            )
    finally:
        await nc.close()

    async def some_indexed() -> int | None:
        count = sum((await turn_texts(stack, "batch", "user")).values())
        return count if count >= 15 else None

    before_kill = await wait_for(some_indexed, 60, interval_s=0.05, what="a part of the batch")
    await asyncio.to_thread(stack.kill, "ingest")
    after_kill = sum((await turn_texts(stack, "batch", "user")).values())
    assert before_kill <= after_kill < total, "killed in the middle of the batch"
    await asyncio.to_thread(stack.revive, "ingest")

    async def all_indexed() -> Counter[str] | None:
        found = await turn_texts(stack, "batch", "user")
        return found if sum(found.values()) >= total else None

    found = await wait_for(all_indexed, 90, what="the whole batch indexed")
    assert found == Counter(texts)  # every turn, once
    assert await dead_letter_count(stack.settings.nats_url, "ingest") == 0
