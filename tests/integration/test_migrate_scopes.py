"""``engram migrate scopes`` on a store written before conversations belonged to users:
a summary one user had alone is re-keyed, a conversation several users shared gets each
user a summary of their own (rebuilt by the real summarize worker), a mixed episode is
removed, and a second run changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engram_cli.cli_common import CliSettings
from engram_cli.memory.migrate import migrate
from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream
from engram_core.codec import pb, to_timestamp
from engram_core.events import MemoryChanged
from engram_core.ids import SUMMARY_NAMESPACE, summary_memory_id
from engram_testing.waiting import eventually
from engram_testing.worker_stack import (
    RealRetrieval,
    WorkerStack,
    published,
    running_retrieval,
)
from engram_workers.summarize import SUMMARIZE, SummarizeSettings

pytestmark = pytest.mark.integration

TENANT = "acme"
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def legacy_summary_id(conversation: str) -> str:
    """What summaries were keyed by before they were per user."""
    return str(uuid.uuid5(SUMMARY_NAMESPACE, f"{TENANT}\x1f{conversation}"))


def memory(
    kind: pb.MemoryKind, text: str, user: str, conversation: str, minute: int, **fields
) -> pb.Memory:
    return pb.Memory(
        kind=kind,
        text=text,
        user_id=user,
        conversation_id=conversation,
        created_at=to_timestamp(T0 + timedelta(minutes=minute)),
        **fields,
    )


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


async def write_legacy_store(retrieval: RealRetrieval) -> list[str]:
    client = retrieval.client
    turns = await client.upsert(
        pb.UpsertRequest(
            tenant=TENANT,
            memories=[
                memory(pb.MEMORY_KIND_TURN, "My dog is Rex.", "alice", "default", 1, role="user"),
                memory(pb.MEMORY_KIND_TURN, "My cat is Tom.", "bob", "default", 2, role="user"),
            ],
        )
    )
    turn_ids = [r.id for r in turns.results]
    await client.upsert(
        pb.UpsertRequest(
            tenant=TENANT,
            memories=[
                memory(pb.MEMORY_KIND_FACT, "User's dog is Rex", "alice", "default", 1),
                memory(pb.MEMORY_KIND_FACT, "User's cat is Tom", "bob", "default", 2),
                memory(pb.MEMORY_KIND_FACT, "User knits scarves", "carol", "solo", 3),
                # one summary per conversation, whoever spoke: the shared one mixes users
                memory(
                    pb.MEMORY_KIND_SUMMARY,
                    "User's dog is Rex. User's cat is Tom.",
                    "alice",
                    "default",
                    4,
                    id=legacy_summary_id("default"),
                    metadata={"revision": "2", "folded_fact_ids": ""},
                ),
                memory(
                    pb.MEMORY_KIND_SUMMARY,
                    "User knits scarves.",
                    "carol",
                    "solo",
                    5,
                    id=legacy_summary_id("solo"),
                    metadata={"revision": "1"},
                ),
                memory(
                    pb.MEMORY_KIND_EPISODE,
                    "Turns 1-2: a dog and a cat.",
                    "bob",
                    "default",
                    2,
                    source_turn_ids=turn_ids,
                    turn_range=pb.TurnRange(first_turn=1, last_turn=2),
                ),
            ],
        )
    )
    return turn_ids


async def test_migrate_scopes_rekeys_rebuilds_and_is_idempotent(
    tmp_path: Path, nats_url: str, retrieval: RealRetrieval
) -> None:
    await write_legacy_store(retrieval)
    upstream = ScriptedUpstream(replies=[RuleBasedBrain()]).start()
    workers = WorkerStack(nats_url, retrieval.address)
    try:
        await workers.start(
            SUMMARIZE,
            SummarizeSettings(
                **workers.common(), llm_base_url=upstream.base_url, llm_model="scripted"
            ),
        )
        settings = CliSettings(
            data_dir=tmp_path / "data", nats_url=nats_url, retrieval_address=retrieval.address
        )
        [report] = await migrate(settings, [TENANT])
        assert (report.summaries_rekeyed, report.summaries_rebuilt, report.episodes_rebuilt) == (
            1,
            1,
            1,
        )
        client = retrieval.client

        async def summary_of(user: str, conversation: str) -> str:
            sid = summary_memory_id(TENANT, user, conversation)
            got = await client.get(pb.GetRequest(tenant=TENANT, ids=[sid]))
            return got.memories[0].text if got.memories else ""

        # carol had "solo" alone: the same summary, under her summary id
        assert await summary_of("carol", "solo") == "User knits scarves."
        # alice and bob shared "default": each gets a summary of their own facts only
        alice = await eventually(lambda: summary_of("alice", "default"), 20, "alice's summary")
        bob = await eventually(lambda: summary_of("bob", "default"), 20, "bob's summary")
        assert "Rex" in alice and "Tom" not in alice
        assert "Tom" in bob and "Rex" not in bob
        gone = await client.get(
            pb.GetRequest(
                tenant=TENANT, ids=[legacy_summary_id("default"), legacy_summary_id("solo")]
            )
        )
        assert not gone.memories
        episodes = await client.list(
            pb.ListRequest(tenant=TENANT, filter=pb.MemoryFilter(kinds=[pb.MEMORY_KIND_EPISODE]))
        )
        assert not episodes.memories  # the mixed one is gone (rebuilt per user when due)
        # every change was announced for the mirror
        changes = [c for c in await published(nats_url, MemoryChanged) if c.cause == "migrate"]
        assert sorted({(c.op, c.memory.kind) for c in changes}) == [
            ("created", "fact"),
            ("created", "summary"),
            ("created", "turn"),
            ("deleted", "episode"),
            ("deleted", "summary"),
        ]

        [again] = await migrate(settings, [TENANT])
        assert not again.changed
    finally:
        await workers.stop_all()
        upstream.stop()
