"""Engram on a real three-node JetStream cluster (three nats-server processes routed on
loopback): the gateway, ingest and reconcile are given all three URLs and replicas 3.
Every stream and bucket they create has three replicas; then a node is killed under a
chat stream — the stream's leader, and in a second case the node leading the
event-status bucket — and every accepted turn is indexed, every fact extracted, none
twice, with no Engram process restarted."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import nats
import pytest
from nats.js import JetStreamContext

from engram_cli.stack.nats_server import NatsCluster, free_port
from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream
from engram_core.bus import ensure_stream, key_value_bucket
from engram_core.codec import pb
from engram_core.event_status import EVENTS_BUCKET
from engram_core.events import STREAM_NAME
from engram_core.retry import retry_transient
from engram_core.settings import parse_nats_urls
from engram_gateway.app import create_app
from engram_gateway.settings import GatewaySettings
from engram_testing.asgi import serving
from engram_testing.waiting import eventually
from engram_testing.worker_stack import (
    RealRetrieval,
    WorkerStack,
    quick_settings,
    running_retrieval,
)
from engram_workers.ingest import INGEST, IngestSettings
from engram_workers.locks import LOCK_BUCKET
from engram_workers.reconcile import RECONCILE, ReconcileSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = TypeVar("T")
REPLICATED = (STREAM_NAME, f"KV_{EVENTS_BUCKET}", f"KV_{LOCK_BUCKET}")
CHATS = 24
KILL_AFTER = 8


async def with_js(url: str, call: Callable[[JetStreamContext], Awaitable[T]]) -> T:
    """One JetStream request, retried while the cluster elects (the test's own reads)."""

    async def once() -> T:
        nc = await nats.connect(
            servers=parse_nats_urls(url), connect_timeout=2, max_reconnect_attempts=1
        )
        try:
            return await call(nc.jetstream(timeout=2))
        finally:
            await nc.close()

    for _ in range(20):
        try:
            return await once()
        except Exception:
            await asyncio.sleep(0.5)
    return await once()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    nodes = NatsCluster(tmp_path / "nats")
    await asyncio.to_thread(nodes.start)
    try:
        # JetStream answers once the cluster has elected its meta leader.
        await with_js(nodes.url, lambda js: js.account_info())
        yield nodes
    finally:
        await asyncio.to_thread(nodes.stop)


@dataclass
class Engram:
    cluster: NatsCluster
    retrieval: RealRetrieval
    gateway_url: str
    accepted: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    replies_recorded: int = 0
    followed: list[str] = field(default_factory=list)  # event ids of /v1/memories/add

    async def leader_of(self, stream: str) -> str:
        info = await with_js(self.cluster.url, lambda js: js.stream_info(stream))
        assert info.cluster is not None and info.cluster.leader
        return info.cluster.leader

    async def replicas(self, stream: str) -> int:
        info = await with_js(self.cluster.url, lambda js: js.stream_info(stream))
        return int(info.config.num_replicas or 1)

    async def chat(self, http: httpx2.AsyncClient, n: int) -> None:
        body: dict[str, Any] = {
            "model": "scripted",
            "user": f"u{n}",
            "memory_id": f"c{n}",
            "messages": [{"role": "user", "content": f"I own {n} bikes."}],
        }
        reply = await http.post("/v1/chat/completions", json=body)
        if reply.status_code != 200:
            self.refused.append(f"chat {n}: {reply.status_code} {reply.text[:200]}")
            return
        self.accepted.append(n)
        if reply.headers.get("x-engram-assistant-turn") != "not-persisted":
            self.replies_recorded += 1
        if n % 4 == 0:  # a followed text too: the event-status bucket is on its path
            added = await http.post(
                "/v1/memories/add",
                json={"text": f"I have {n} cats.", "user": f"u{n}", "conversation": f"a{n}"},
            )
            if added.status_code == 202:
                self.followed.extend(added.json()["event_ids"])
            else:
                self.refused.append(f"add {n}: {added.status_code} {added.text[:200]}")

    async def chat_stream(self, kill: Callable[[], Awaitable[None]]) -> None:
        async with httpx2.AsyncClient(base_url=self.gateway_url, timeout=60) as http:
            for n in range(CHATS):
                if n == KILL_AFTER:
                    await kill()
                await self.chat(http, n)

    async def texts(self, conversation: str, kind: pb.MemoryKind) -> Counter[tuple[str, str]]:
        reply = await self.retrieval.client.list(
            pb.ListRequest(
                tenant="default",
                filter=pb.MemoryFilter(conversation_id=conversation, kinds=[kind]),
                page_size=100,
            )
        )
        return Counter((m.role, m.text) for m in reply.memories)

    async def learned(self, n: int) -> bool:
        turns = await self.texts(f"c{n}", pb.MEMORY_KIND_TURN)
        facts = await self.texts(f"c{n}", pb.MEMORY_KIND_FACT)
        return turns[("user", f"I own {n} bikes.")] == 1 and facts[("", f"User owns {n} bikes")] > 0


@pytest.fixture
async def engram(
    cluster: NatsCluster, tmp_path: Path, scripted_upstream: ScriptedUpstream
) -> AsyncIterator[Engram]:
    scripted_upstream.replies = [RuleBasedBrain("Noted.")]
    async with running_retrieval(tmp_path / "retrieval") as retrieval:
        common = {
            **quick_settings(cluster.url, retrieval.address),
            "stream_replicas": 3,
            "llm_base_url": scripted_upstream.base_url,
            "llm_model": "scripted",
            "ack_wait_s": 10.0,
        }
        workers = WorkerStack(cluster.url, retrieval.address)
        settings = GatewaySettings(
            nats_url=cluster.url,
            stream_replicas=3,
            retrieval_address=retrieval.address,
            llm_base_url=scripted_upstream.base_url,
            gateway_port=free_port(),
            # An election on a loaded 2-core CI machine once outlasted the default 15 s;
            # what is asserted is that publishes retry through it, not how fast it ends.
            publish_retry_s=45.0,
        )
        try:
            async with serving(create_app(settings), settings.gateway_port) as url:
                await workers.start(INGEST, IngestSettings(**common))
                await workers.start(RECONCILE, ReconcileSettings(**common))
                yield Engram(cluster, retrieval, url)
        finally:
            await workers.stop_all()


async def assert_everything_learned_once(engram: Engram) -> None:
    assert engram.refused == []  # publishes rode out the election
    assert engram.accepted == list(range(CHATS))

    async def all_learned() -> bool:
        done = await asyncio.gather(*(engram.learned(n) for n in engram.accepted))
        # the assistant's turns too: each is its own message, indexed on its own time
        replies = await asyncio.gather(
            *(engram.texts(f"c{n}", pb.MEMORY_KIND_TURN) for n in engram.accepted)
        )
        indexed = sum(min(turns[("assistant", "Noted.")], 1) for turns in replies)
        return all(done) and indexed >= engram.replies_recorded

    await eventually(
        all_learned, 60, interval_s=0.5, what="every turn indexed (replies too), every fact"
    )
    replies = 0
    for n in engram.accepted:
        turns = await engram.texts(f"c{n}", pb.MEMORY_KIND_TURN)
        facts = await engram.texts(f"c{n}", pb.MEMORY_KIND_FACT)
        assert turns[("user", f"I own {n} bikes.")] == 1
        assert turns[("assistant", "Noted.")] <= 1
        replies += turns[("assistant", "Noted.")]
        assert facts == Counter({("", f"User owns {n} bikes"): 1})
    assert replies == engram.replies_recorded == CHATS

    async def applied(event_id: str) -> bool:
        async with httpx2.AsyncClient(base_url=engram.gateway_url, timeout=10) as http:
            reply = await http.get(f"/v1/events/{event_id}")
        return reply.status_code == 200 and reply.json()["status"] == "applied"

    for event_id in engram.followed:
        await eventually(functools.partial(applied, event_id), 30, what=f"event {event_id} applied")
    dlq = await with_js(
        engram.cluster.url, lambda js: js.stream_info(STREAM_NAME, subjects_filter="engram.dlq.>")
    )
    assert not dlq.state.subjects  # nothing dead-lettered


async def test_every_stream_and_bucket_has_three_replicas_and_the_stream_leader_can_die(
    engram: Engram,
) -> None:
    for stream in REPLICATED:
        assert await engram.replicas(stream) == 3, stream
    leader = await engram.leader_of(STREAM_NAME)

    async def kill_the_stream_leader() -> None:
        await asyncio.to_thread(engram.cluster.node(leader).kill)

    await engram.chat_stream(kill_the_stream_leader)
    assert await engram.leader_of(STREAM_NAME) != leader
    await assert_everything_learned_once(engram)


async def test_the_node_leading_the_event_status_bucket_can_die(engram: Engram) -> None:
    leader = await engram.leader_of(f"KV_{EVENTS_BUCKET}")

    async def kill_the_bucket_leader() -> None:
        await asyncio.to_thread(engram.cluster.node(leader).kill)

    await engram.chat_stream(kill_the_bucket_leader)
    assert await engram.leader_of(f"KV_{EVENTS_BUCKET}") != leader
    await assert_everything_learned_once(engram)


async def test_a_single_replica_deployment_is_raised_to_three_in_place(
    cluster: NatsCluster,
) -> None:
    """R1 -> R3: what a process with ENGRAM_STREAM_REPLICAS=3 does at start, keeping the
    data; one still configured with 1 runs against it and lowers nothing."""
    await retry_transient(lambda: ensure_stream(cluster.url, replicas=1), budget_s=20)
    # A stream just created may not have its leader yet: writes retry, as Engram's do.
    async with key_value_bucket(cluster.url, EVENTS_BUCKET, ttl_s=60) as (_, kv):
        await retry_transient(lambda: kv.put("kept", b"yes"), budget_s=20)
    nc = await nats.connect(servers=parse_nats_urls(cluster.url))
    try:
        js = nc.jetstream()
        await retry_transient(lambda: js.publish("engram.turn.persisted.v1", b"{}"), budget_s=20)
    finally:
        await nc.close()
    assert (
        await with_js(cluster.url, lambda js: js.stream_info(STREAM_NAME))
    ).config.num_replicas == 1

    await retry_transient(lambda: ensure_stream(cluster.url, replicas=3), budget_s=20)
    async with key_value_bucket(cluster.url, EVENTS_BUCKET, ttl_s=60, replicas=3) as (_, kv):
        assert (await kv.get("kept")).value == b"yes"
    # an older process: no conflict, no lowering
    await retry_transient(lambda: ensure_stream(cluster.url, replicas=1), budget_s=20)
    for stream in (STREAM_NAME, f"KV_{EVENTS_BUCKET}"):
        info = await with_js(
            cluster.url, functools.partial(JetStreamContext.stream_info, name=stream)
        )
        assert info.config.num_replicas == 3, stream
    info = await with_js(cluster.url, lambda js: js.stream_info(STREAM_NAME))
    assert info.state.messages == 1  # the data came along
