"""The file-mirror worker in-process against a real nats-server: memory.changed → files
and batched git commits; hand edits → memory.edited; no echo of its own writes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from engram_core.bus import publish_event
from engram_core.events import MemoryChanged, MemoryEdited
from engram_core.memory import MemoryRecord
from engram_core.mirror_format import live_path, tombstone_path
from engram_testing.mirror_support import git_log, git_status
from engram_testing.waiting import eventually
from engram_testing.worker_stack import consumer_settled, published, quick_settings, running_worker
from engram_workers.mirror import MIRROR, Mirror, MirrorSettings

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
FACT_ID = "11111111-1111-4111-8111-111111111111"
NEW_FACT_ID = "22222222-2222-4222-8222-222222222222"
TURN_ID = "33333333-3333-4333-8333-333333333333"


def rec(memory_id: str, text: str, kind: str = "fact", **fields: Any) -> MemoryRecord:
    values: dict[str, Any] = {
        "id": memory_id,
        "kind": kind,
        "text": text,
        "user_id": "u1",
        "conversation_id": "c1",
        "created_at": T0,
        "updated_at": T0,
        **fields,
    }
    return MemoryRecord(**values)


def changed(op: str, record: MemoryRecord, **fields: Any) -> MemoryChanged:
    return MemoryChanged(
        tenant="acme",
        user_id=record.user_id,
        conversation_id=record.conversation_id,
        op=op,  # type: ignore[arg-type]
        memory=record,
        **fields,
    )


def front_matter(path: Path) -> tuple[dict[str, Any], str]:
    _, header, body = path.read_text(encoding="utf-8").split("---\n", 2)
    return yaml.safe_load(header), body.removeprefix("\n").removesuffix("\n")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "mirror"


@pytest.fixture
def settings(nats_url: str, root: Path) -> Callable[..., MirrorSettings]:
    def make(**overrides: Any) -> MirrorSettings:
        values: dict[str, Any] = {
            **quick_settings(nats_url),
            "mirror_root": root,
            "mirror_commit_interval_s": 0.2,
            "mirror_watch_debounce_ms": 50,
            **overrides,
        }
        return MirrorSettings(**values)

    return make


async def edited_events(nats_url: str, count: int, timeout_s: float = 10.0) -> list[MemoryEdited]:
    async def enough() -> list[MemoryEdited] | None:
        events = await published(nats_url, MemoryEdited)
        return events if len(events) >= count else None

    events = await eventually(enough, timeout_s, what=f"{count} memory.edited events")
    assert len(events) == count, [e.path for e in events]
    return events


async def watching(worker: Any) -> Mirror:
    mirror: Mirror = worker.resources
    assert mirror.watcher is not None
    await asyncio.wait_for(mirror.watcher.watching.wait(), 10)
    return mirror


async def test_every_kind_is_a_file_with_front_matter_and_nothing_echoes(
    settings, root, publisher, nats_url
) -> None:
    fact = rec(
        FACT_ID,
        "The user's name is Jane.",
        source_id="D1:1",
        source_turn_ids=[TURN_ID],
        valid_from=T0,
        tags=["identity"],
    )
    turn = rec(TURN_ID, "Hi, I'm Jane.", kind="turn", role="user", source_id="D1:1")
    reply = rec(
        "44444444-4444-4444-8444-444444444444", "Hello Jane!", kind="turn", role="assistant"
    )
    summary = rec("55555555-5555-4555-8555-555555555555", "Jane introduced herself.", "summary")
    episode = rec(
        "66666666-6666-4666-8666-666666666666", "Turns 1-20: intro.", "episode", turn_range=(1, 20)
    )
    profile = rec(
        "77777777-7777-4777-8777-777777777777",
        "",
        "profile",
        profile={"category": "identity", "key": "name", "value": "Jane", "confidence": 0.9},
    )
    records = [fact, turn, reply, summary, episode, profile]
    async with running_worker(MIRROR, settings()) as worker:
        await watching(worker)
        for record in records:
            await publish_event(publisher, changed("created", record, cause="test"))
        paths = {r.id: root / str(live_path("acme", r)) for r in records}
        await eventually(lambda: all(p.exists() for p in paths.values()), what="the files")
        await eventually(lambda: git_status(root) == "", what="the commits")
        # Its own writes reach the watcher too, and are not edits.
        await asyncio.sleep(0.5)
        assert await published(nats_url, MemoryEdited) == []

    assert paths[TURN_ID] == root / f"acme/c1/turns/user/20260301T120000Z__{TURN_ID}.md"
    assert paths[reply.id].parent == root / "acme/c1/turns/assistant"
    assert paths[summary.id] == root / "acme/c1/summaries/summary.md"
    assert paths[episode.id].parent == root / "acme/c1/episodes"
    assert paths[profile.id].parent == root / "acme/c1/profile"
    front, body = front_matter(paths[FACT_ID])
    assert body == "The user's name is Jane."
    assert front == {
        "id": FACT_ID,
        "kind": "fact",
        "role": "",
        "tenant": "acme",
        "user_id": "u1",
        "conversation_id": "c1",
        "created_at": "2026-03-01T12:00:00Z",
        "updated_at": "2026-03-01T12:00:00Z",
        "source_id": "D1:1",
        "source_turn_ids": [TURN_ID],
        "tags": ["identity"],
        "valid_from": "2026-03-01T12:00:00Z",
    }
    assert front_matter(paths[episode.id])[0]["turn_range"] == {"first_turn": 1, "last_turn": 20}
    assert front_matter(paths[profile.id])[0]["profile"]["value"] == "Jane"
    # Committed in the background every 0.2 s: one or two commits, depending on timing.
    *batches, first = git_log(root)
    assert first == "mirror: initialise"
    assert all(re.fullmatch(r"mirror: \d created \(.*\)", subject) for subject in batches)
    assert sum(int(subject.split()[1]) for subject in batches) == 6


async def test_superseded_deleted_and_evicted_become_tombstones_in_one_commit(
    settings, root, publisher, nats_url
) -> None:
    old = rec(FACT_ID, "I love pizza.")
    new = rec(NEW_FACT_ID, "I hate pizza.", created_at=T0 + timedelta(minutes=1))
    turn = rec(TURN_ID, "I hate pizza now.", kind="turn", role="user")
    gone = rec("88888888-8888-4888-8888-888888888888", "My phone number is 123.")
    # A long interval: everything below lands in the commit made at shutdown.
    async with running_worker(MIRROR, settings(mirror_commit_interval_s=60)):
        for event in (
            changed("created", old),
            changed("created", turn),
            changed("created", gone),
            changed("created", new, cause="reconcile:UPDATE"),
            changed(
                "superseded",
                old.model_copy(update={"superseded_by": NEW_FACT_ID, "valid_to": T0}),
                cause="reconcile:UPDATE",
                related_ids=[NEW_FACT_ID],
            ),
            changed("evicted", turn, cause="evict"),
            changed("deleted", gone, cause="api"),
        ):
            await publish_event(publisher, event)
        await all_acknowledged(nats_url)
        assert git_log(root) == ["mirror: initialise"]  # not yet committed...
    # ...flushed on shutdown, as one commit.
    assert git_log(root) == [
        "mirror: 4 created (3 fact, 1 turn); 1 superseded (fact); 1 deleted (fact); "
        "1 evicted (turn)",
        "mirror: initialise",
    ]
    assert git_status(root) == ""
    assert not (root / str(live_path("acme", old))).exists()
    assert not (root / str(live_path("acme", turn))).exists()
    assert (root / str(live_path("acme", new))).exists()

    superseded = root / str(tombstone_path("acme", old))
    assert superseded == root / f"acme/c1/deleted/facts/20260301T120000Z__{FACT_ID}.md"
    front, body = front_matter(superseded)
    assert body == "I love pizza."  # nothing is destroyed
    assert front["superseded_by"] == NEW_FACT_ID
    assert front["valid_to"] == "2026-03-01T12:00:00Z"
    assert front["tombstone"]["reason"] == "superseded"
    assert front["tombstone"]["cause"] == "reconcile:UPDATE"

    evicted = root / f"acme/c1/deleted/turns/user/20260301T120000Z__{TURN_ID}.md"
    front, body = front_matter(evicted)
    assert (front["tombstone"]["reason"], front["tombstone"]["cause"]) == ("evicted", "evict")
    assert front["tombstone"]["at"].endswith("Z") and body == "I hate pizza now."
    front, _ = front_matter(root / str(tombstone_path("acme", gone)))
    assert front["tombstone"]["reason"] == "deleted"


async def all_acknowledged(nats_url: str) -> None:
    await eventually(lambda: consumer_settled(nats_url, "mirror"), what="every message answered")


async def test_redelivered_and_stale_events_change_nothing(
    settings, root, publisher, nats_url
) -> None:
    fact = rec(FACT_ID, "I live in Lisbon.")
    first = changed("created", fact)
    path = root / str(live_path("acme", fact))
    async with running_worker(MIRROR, settings()):
        await publish_event(publisher, first)
        await eventually(path.exists, what="the file")
        await eventually(lambda: len(git_log(root)) == 2, what="the commit")
        written = path.stat().st_mtime_ns
        # The same change again under another event id (a re-publish): no rewrite.
        await publish_event(publisher, first.model_copy(update={"event_id": "again"}))
        # An older state arriving late (a redelivery after a retry) is skipped.
        stale = changed("updated", fact.model_copy(update={"text": "I live in Porto."}))
        stale = stale.model_copy(update={"occurred_at": first.occurred_at - timedelta(seconds=5)})
        await publish_event(publisher, stale)
        await all_acknowledged(nats_url)
        await asyncio.sleep(0.4)
    assert path.stat().st_mtime_ns == written
    assert front_matter(path)[1] == "I live in Lisbon."
    assert len(git_log(root)) == 2


async def test_hand_edits_new_files_deletions_and_malformed_files(
    settings, root, publisher, nats_url
) -> None:
    fact = rec(FACT_ID, "My dog is called Biscuit.")
    other = rec(NEW_FACT_ID, "I work as a nurse.")
    async with running_worker(MIRROR, settings()) as worker:
        mirror = await watching(worker)
        for record in (fact, other):
            await publish_event(publisher, changed("created", record))
        fact_path = root / str(live_path("acme", fact))
        other_path = root / str(live_path("acme", other))
        await eventually(lambda: fact_path.exists() and other_path.exists(), what="the files")
        await eventually(lambda: git_status(root) == "", what="the commit")

        # 1. A text edit → upserted, with the new text and everything else unchanged.
        fact_path.write_text(fact_path.read_text().replace("Biscuit", "Rex"), encoding="utf-8")
        [edit] = await edited_events(nats_url, 1)
        assert (edit.op, edit.tenant, edit.path) == (
            "upserted",
            "acme",
            str(live_path("acme", fact)),
        )
        assert edit.memory == fact.model_copy(update={"text": "My dog is called Rex."})

        # 2. Malformed front matter → reported in the log, nothing published.
        bad = root / "acme/c1/facts/broken.md"
        bad.write_text("---\nkind: [fact\n---\nI have two cats.\n", encoding="utf-8")
        # 3. A file under deleted/ is history: not watched.
        tomb = root / "acme/c1/deleted/facts/old.md"
        tomb.parent.mkdir(parents=True)
        tomb.write_text("---\nkind: fact\n---\nwhatever\n", encoding="utf-8")
        await eventually(
            lambda: mirror.tree.known.get("acme/c1/facts/broken.md"), what="the broken file seen"
        )
        assert len(await published(nats_url, MemoryEdited)) == 1  # seen, rejected

        # 4. A new file without an id → an id is written back, the memory is published.
        note = root / "acme/c1/facts/my note.md"
        note.write_text("---\nkind: fact\n---\n\nI am allergic to peanuts.\n", encoding="utf-8")
        edits = await edited_events(nats_url, 2)
        created = edits[1]
        assert created.op == "upserted" and created.path == "acme/c1/facts/my note.md"
        assert created.memory.text == "I am allergic to peanuts."
        assert (created.memory.kind, created.memory.conversation_id) == ("fact", "c1")
        assert front_matter(note)[0]["id"] == created.memory.id != FACT_ID

        # 5. Fixing the broken file publishes it.
        bad.write_text("---\nkind: fact\n---\nI have two cats.\n", encoding="utf-8")
        edits = await edited_events(nats_url, 3)
        assert edits[2].memory.text == "I have two cats."

        # 6. A copy of a file is a new memory (a fresh id), not a second file for one id.
        copy = root / "acme/c1/facts/copy.md"
        copy.write_text(other_path.read_text(), encoding="utf-8")
        edits = await edited_events(nats_url, 4)
        assert edits[3].memory.id not in (NEW_FACT_ID, FACT_ID)
        assert edits[3].memory.text == other.text

        # 7. Deleting a file → deleted, carrying the last committed state.
        other_path.unlink()
        edits = await edited_events(nats_url, 5)
        assert (edits[4].op, edits[4].memory.id) == ("deleted", NEW_FACT_ID)
        assert edits[4].memory.text == "I work as a nurse."

        # The mirror commits the hand edits too.
        await eventually(lambda: "hand-" in " ".join(git_log(root)), what="hand-edit commit")
    subjects = git_log(root)
    assert any("hand-deleted (fact)" in s for s in subjects), subjects
    assert any("hand-created" in s for s in subjects), subjects
    assert any("hand-edited (fact)" in s for s in subjects), subjects


async def test_edits_made_while_the_mirror_was_down_are_picked_up(
    settings, root, publisher, nats_url
) -> None:
    fact = rec(FACT_ID, "My dog is called Biscuit.")
    other = rec(NEW_FACT_ID, "I work as a nurse.")
    fact_path = root / str(live_path("acme", fact))
    other_path = root / str(live_path("acme", other))
    async with running_worker(MIRROR, settings()):
        for record in (fact, other):
            await publish_event(publisher, changed("created", record))
        await eventually(lambda: fact_path.exists() and other_path.exists(), what="the files")
    assert git_status(root) == ""

    # While it is down: a person edits one file; the other is changed the way a mirror
    # that crashed after writing, before committing, leaves it (journaled).
    fact_path.write_text(fact_path.read_text().replace("Biscuit", "Rex"), encoding="utf-8")
    own = other_path.read_text().replace("nurse", "doctor")
    other_path.write_text(own, encoding="utf-8")
    journal = root / ".git" / "engram-mirror-journal.jsonl"
    rel = str(live_path("acme", other))
    entry = {"path": rel, "sha": hashlib.sha256(own.encode()).hexdigest()}
    journal.write_text(json.dumps(entry) + "\n", encoding="utf-8")

    async with running_worker(MIRROR, settings()):
        [edit] = await edited_events(nats_url, 1)
        assert edit.memory.id == FACT_ID and edit.memory.text == "My dog is called Rex."
        await eventually(lambda: git_status(root) == "", what="both committed")
        await asyncio.sleep(0.3)
    assert len(await published(nats_url, MemoryEdited)) == 1
