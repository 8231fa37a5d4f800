"""Hand edits end to end, with the real nats-server and the real retrieval service:
file on disk → watcher → memory.edited → edits worker → retrieval → memory.changed →
the mirror converges (no loop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from engram_core.bus import publish_event
from engram_core.codec import from_timestamp, pb, record_from_pb, to_timestamp
from engram_core.events import MemoryChanged, MemoryEdited
from engram_core.mirror_format import format_time, live_path, tombstone_path
from engram_core.retrieval_client import RetrievalClient
from engram_testing.mirror_support import git_log
from engram_testing.waiting import eventually
from engram_testing.worker_stack import (
    RealRetrieval,
    consumer_settled,
    published,
    quick_settings,
    running_worker,
)
from engram_workers.edits import EDITS, EditsSettings
from engram_workers.mirror import MIRROR, Mirror, MirrorSettings

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TENANT = "acme"


@dataclass
class Stack:
    root: Path
    retrieval: RetrievalClient
    mirror: Mirror
    nats_url: str

    async def hits(self, query: str, user: str = "u1") -> list[str]:
        reply = await self.retrieval.search(
            pb.SearchRequest(tenant=TENANT, query=query, user_id=user, conversation_id="c1")
        )
        return [hit.memory.text for hit in reply.hits]

    async def get(self, memory_id: str) -> pb.Memory | None:
        reply = await self.retrieval.get(pb.GetRequest(tenant=TENANT, ids=[memory_id]))
        return reply.memories[0] if reply.memories else None

    async def settled(self) -> bool:
        return await consumer_settled(self.nats_url, "edits") and await consumer_settled(
            self.nats_url, "mirror"
        )

    async def seed(self, publisher: Any, *texts: str) -> list[pb.Memory]:
        """Facts as reconcile would store them: upserted, then announced."""
        reply = await self.retrieval.upsert(
            pb.UpsertRequest(
                tenant=TENANT,
                memories=[
                    pb.Memory(
                        kind=pb.MEMORY_KIND_FACT,
                        text=text,
                        user_id="u1",
                        conversation_id="c1",
                        created_at=to_timestamp(T0),
                    )
                    for text in texts
                ],
            )
        )
        ids = [result.id for result in reply.results]
        stored = (await self.retrieval.get(pb.GetRequest(tenant=TENANT, ids=ids))).memories
        for memory in stored:
            record = record_from_pb(memory)
            await publish_event(
                publisher,
                MemoryChanged(
                    tenant=TENANT,
                    user_id="u1",
                    conversation_id="c1",
                    op="created",
                    memory=record,
                    cause="reconcile:ADD",
                ),
            )
        for memory in stored:
            path = self.path(memory)
            await eventually(path.exists, what=f"the file of {memory.text!r}")
        return list(stored)

    def path(self, memory: pb.Memory) -> Path:
        return self.root / str(live_path(TENANT, record_from_pb(memory)))


@pytest.fixture
async def stack(tmp_path: Path, nats_url: str, retrieval: RealRetrieval) -> AsyncIterator[Stack]:
    root = tmp_path / "mirror"
    mirror_settings = MirrorSettings(
        **quick_settings(nats_url),
        mirror_root=root,
        mirror_commit_interval_s=0.2,
        mirror_watch_debounce_ms=50,
    )
    edits_settings = EditsSettings(**quick_settings(nats_url, retrieval.address))
    async with (
        running_worker(MIRROR, mirror_settings) as mirror_worker,
        running_worker(EDITS, edits_settings),
    ):
        mirror: Mirror = mirror_worker.resources
        assert mirror.watcher is not None
        await asyncio.wait_for(mirror.watcher.watching.wait(), 10)
        yield Stack(root, retrieval.client, mirror, nats_url)


def front_matter(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8").split("---\n", 2)[1])


async def test_editing_a_fact_file_changes_what_search_returns(stack: Stack, publisher) -> None:
    [dog, job] = await stack.seed(publisher, "My dog is called Biscuit.", "I work as a nurse.")
    path = stack.path(dog)
    assert "My dog is called Biscuit." in await stack.hits("What is my dog's name?")

    path.write_text(path.read_text().replace("Biscuit", "Rex"), encoding="utf-8")

    async def dog_renamed() -> bool:
        return "My dog is called Rex." in await stack.hits("What is my dog's name?")

    await eventually(dog_renamed, what="the edit in Search")
    hits = await stack.hits("What is my dog's name?")
    assert "My dog is called Biscuit." not in hits
    stored = await stack.get(dog.id)
    assert stored is not None and stored.text == "My dog is called Rex."
    assert stored.created_at == dog.created_at  # the same memory, edited in place

    # The mirror converges on the index's state (a newer updated_at), and its own
    # rewrite is not another edit: exactly one memory.edited, then quiet.
    await eventually(
        lambda: front_matter(path)["updated_at"] != front_matter_time(dog.updated_at),
        what="the canonical rewrite",
    )
    await eventually(stack.settled, what="everything handled")
    await asyncio.sleep(0.4)
    edits = await published(stack.nats_url, MemoryEdited)
    assert [(e.op, e.memory.id) for e in edits] == [("upserted", dog.id)]
    changes = [c for c in await published(stack.nats_url, MemoryChanged) if c.cause]
    # like PATCH: the text before the edit is kept as a history version
    history, edited = [c for c in changes if c.cause == "mirror-edit"]
    assert (history.op, history.memory.text) == ("superseded", "My dog is called Biscuit.")
    assert history.memory.superseded_by == dog.id and history.memory.id != dog.id
    assert (edited.op, edited.memory.id, edited.related_ids) == (
        "updated",
        dog.id,
        [history.memory.id],
    )
    assert (await stack.get(job.id)) is not None  # the other fact is untouched
    await eventually(lambda: any("hand-edited" in s for s in git_log(stack.root)), what="commit")


def front_matter_time(ts: Any) -> str:
    value = from_timestamp(ts)
    assert value is not None
    return format_time(value)


async def test_deleting_a_file_removes_the_memory_and_leaves_a_tombstone(
    stack: Stack, publisher
) -> None:
    [allergy, _] = await stack.seed(
        publisher, "I have a severe peanut allergy.", "I moved to Lisbon last year."
    )
    assert "I have a severe peanut allergy." in await stack.hits("Do I have allergies?")
    stack.path(allergy).unlink()

    async def gone() -> bool:
        return await stack.get(allergy.id) is None

    await eventually(gone, what="the deletion in the index")
    assert "I have a severe peanut allergy." not in await stack.hits("Do I have allergies?")
    tomb = stack.root / str(tombstone_path(TENANT, record_from_pb(allergy)))
    await eventually(tomb.exists, what="the tombstone")
    front = front_matter(tomb)
    assert front["id"] == allergy.id
    assert (front["tombstone"]["reason"], front["tombstone"]["cause"]) == ("deleted", "mirror-edit")
    assert tomb.read_text().rstrip("\n").endswith("I have a severe peanut allergy.")
    assert not stack.path(allergy).exists()
    await eventually(
        lambda: any("deleted (fact)" in s for s in git_log(stack.root)), what="the commit"
    )


async def test_deleting_the_file_of_an_edited_memory_deletes_its_history_too(
    stack: Stack, publisher
) -> None:
    """The mirror's delete is the API's: the memory and every earlier version leave the
    index (nothing of it is left to search or history), each with a tombstone."""
    [car] = await stack.seed(publisher, "My car is a blue Fiat.")
    path = stack.path(car)
    path.write_text(path.read_text().replace("blue", "red"), encoding="utf-8")

    async def edited() -> pb.Memory | None:
        stored = await stack.get(car.id)
        return stored if stored is not None and "red" in stored.text else None

    await eventually(edited, what="the edit in the index")
    changes = await published(stack.nats_url, MemoryChanged)
    (history_id,) = [c.memory.id for c in changes if c.op == "superseded"]
    assert await stack.get(history_id) is not None
    await eventually(stack.settled, what="the edit mirrored")
    await eventually(path.exists, what="the rewritten file")

    path.unlink()

    async def lineage_gone() -> bool:
        return await stack.get(car.id) is None and await stack.get(history_id) is None

    await eventually(lineage_gone, what="the memory and its history deleted")
    deleted = {
        c.memory.id for c in await published(stack.nats_url, MemoryChanged) if c.op == "deleted"
    }
    assert deleted == {car.id, history_id}


async def test_a_file_dropped_into_a_users_folder_is_recalled_for_that_user(
    stack: Stack, publisher
) -> None:
    await stack.seed(publisher, "I work as a nurse.")
    # No user_id in the front matter: the folder says whose it is.
    note = stack.root / "acme" / "@u1" / "c1" / "facts" / "my note.md"
    note.write_text(
        "---\nkind: fact\ntags: [health]\n---\n\nI am allergic to cats.\n", encoding="utf-8"
    )

    async def searchable() -> bool:
        return "I am allergic to cats." in await stack.hits("Am I allergic to any animals?")

    await eventually(searchable, what="the new memory in Search")
    # Another user of the tenant with the same conversation id does not recall it.
    assert "I am allergic to cats." not in await stack.hits("Am I allergic to cats?", user="u2")
    [edit] = await published(stack.nats_url, MemoryEdited)
    stored = await stack.get(edit.memory.id)
    assert stored is not None and list(stored.tags) == ["health"]
    assert (stored.user_id, stored.conversation_id) == ("u1", "c1")
    # The hand-made name gives way to the canonical one, which carries the id.
    canonical = stack.path(stored)
    await eventually(lambda: canonical.exists() and not note.exists(), what="the canonical file")
    assert canonical.name.endswith(f"__{stored.id}.md")
    assert front_matter(canonical)["id"] == stored.id
    await eventually(stack.settled, what="everything handled")
    await asyncio.sleep(0.4)
    # Moving the file to its canonical name was the mirror's doing: not a deletion.
    assert len(await published(stack.nats_url, MemoryEdited)) == 1
    assert await stack.get(stored.id) is not None
