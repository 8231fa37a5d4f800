"""The file-mirror worker in-process against a real nats-server: memory.changed → files
and batched git commits; hand edits → memory.edited; no echo of its own writes."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import re
import subprocess
import threading
from collections.abc import Callable, MutableMapping
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from opentelemetry.sdk.resources import Resource
from prometheus_client.parser import text_string_to_metric_families

from engram_core.bus import publish_event
from engram_core.events import MemoryChanged, MemoryEdited
from engram_core.memory import MemoryRecord
from engram_core.metrics import prometheus_exposition, setup_metrics
from engram_core.mirror_format import (
    Tombstone,
    live_path,
    memory_files,
    render,
    tombstone_path,
)
from engram_testing.mirror_support import git_log, git_status
from engram_testing.waiting import eventually
from engram_testing.worker_stack import (
    consumer_settled,
    dead_letter_count,
    dead_letters,
    published,
    quick_settings,
    running_worker,
)
from engram_workers.mirror import MIRROR, Mirror, MirrorSettings
from engram_workers.mirror.migration import MigrationPlan, plan_migration
from engram_workers.mirror.watcher import RETRY_AFTER_S

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
        op=op,
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

    assert paths[TURN_ID] == root / f"acme/@u1/c1/turns/user/20260301T120000Z__{TURN_ID}.md"
    assert paths[reply.id].parent == root / "acme/@u1/c1/turns/assistant"
    assert paths[summary.id] == root / "acme/@u1/c1/summaries/summary.md"
    assert paths[episode.id].parent == root / "acme/@u1/c1/episodes"
    assert paths[profile.id].parent == root / "acme/@u1/c1/profile"
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
    assert superseded == root / f"acme/@u1/c1/deleted/facts/20260301T120000Z__{FACT_ID}.md"
    front, body = front_matter(superseded)
    assert body == "I love pizza."  # nothing is destroyed
    assert front["superseded_by"] == NEW_FACT_ID
    assert front["valid_to"] == "2026-03-01T12:00:00Z"
    assert front["tombstone"]["reason"] == "superseded"
    assert front["tombstone"]["cause"] == "reconcile:UPDATE"

    evicted = root / f"acme/@u1/c1/deleted/turns/user/20260301T120000Z__{TURN_ID}.md"
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
        bad = root / "acme/@u1/c1/facts/broken.md"
        bad.write_text("---\nkind: [fact\n---\nI have two cats.\n", encoding="utf-8")
        # 3. A file under deleted/ is history: not watched.
        tomb = root / "acme/@u1/c1/deleted/facts/old.md"
        tomb.parent.mkdir(parents=True)
        tomb.write_text("---\nkind: fact\n---\nwhatever\n", encoding="utf-8")
        await eventually(
            lambda: mirror.tree.known.get("acme/@u1/c1/facts/broken.md"),
            what="the broken file seen",
        )
        assert len(await published(nats_url, MemoryEdited)) == 1  # seen, rejected

        # 4. A new file without an id → an id is written back, the memory is published.
        note = root / "acme/@u1/c1/facts/my note.md"
        note.write_text("---\nkind: fact\n---\n\nI am allergic to peanuts.\n", encoding="utf-8")
        edits = await edited_events(nats_url, 2)
        created = edits[1]
        assert created.op == "upserted" and created.path == "acme/@u1/c1/facts/my note.md"
        assert created.memory.text == "I am allergic to peanuts."
        assert (created.memory.kind, created.memory.conversation_id) == ("fact", "c1")
        assert created.memory.user_id == "u1"  # dropped under @u1/: that user's
        assert front_matter(note)[0]["id"] == created.memory.id != FACT_ID

        # 5. Fixing the broken file publishes it.
        bad.write_text("---\nkind: fact\n---\nI have two cats.\n", encoding="utf-8")
        edits = await edited_events(nats_url, 3)
        assert edits[2].memory.text == "I have two cats."

        # 6. A copy of a file is a new memory (a fresh id), not a second file for one id.
        copy = root / "acme/@u1/c1/facts/copy.md"
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


async def test_oversized_and_out_of_range_files_are_reported_once_and_skipped(
    settings, root, nats_url
) -> None:
    """Neither is retried forever nor published; a date before year 1000 is fine, and a
    fixed file is picked up."""
    async with running_worker(MIRROR, settings(max_text_bytes=4096)) as worker:
        mirror = await watching(worker)
        facts = root / "acme/c1/facts"
        facts.mkdir(parents=True)
        huge, late, old = facts / "huge.md", facts / "late.md", facts / "old.md"
        far = facts / "far.md"  # a hand-typed turn_index the index cannot store
        with structlog.testing.capture_logs() as logs:
            huge.write_text("---\nkind: fact\n---\n" + "x" * 40_000 + "\n", encoding="utf-8")
            late.write_text(
                "---\nkind: fact\ncreated_at: 9999-12-31T23:59:59-14:00\n---\nA late fact.\n",
                encoding="utf-8",
            )
            old.write_text(
                "---\nkind: fact\ncreated_at: 0999-06-01T00:00:00Z\n---\nAn old fact.\n",
                encoding="utf-8",
            )
            far.write_text(f"---\nkind: fact\nturn_index: {10**30}\n---\nA far fact.\n")
            [edit] = await edited_events(nats_url, 1)
            assert edit.memory.text == "An old fact."
            assert edit.memory.created_at == datetime(999, 6, 1, tzinfo=UTC)
            for path in ("acme/c1/facts/huge.md", "acme/c1/facts/late.md", "acme/c1/facts/far.md"):
                await eventually(
                    functools.partial(mirror.tree.known.get, path), what=f"{path} seen"
                )
            await asyncio.sleep(2.5)  # a retry tick of the watcher passes: still nothing
            assert len(await published(nats_url, MemoryEdited)) == 1
        reports = [e for e in logs if e["event"] == "mirror.malformed_file"]
        assert sorted(e["path"] for e in reports) == [
            "acme/c1/facts/far.md",
            "acme/c1/facts/huge.md",
            "acme/c1/facts/late.md",
        ]  # once each
        errors = {e["path"]: e["error"] for e in reports}
        assert "larger than a memory may be" in errors["acme/c1/facts/huge.md"]
        assert "created_at: out of range" in errors["acme/c1/facts/late.md"]
        assert "turn_index: out of range" in errors["acme/c1/facts/far.md"]

        late.write_text(late.read_text().replace("9999-12-31T23:59:59-14:00", "2026-01-01"))
        edits = await edited_events(nats_url, 2)
        assert edits[1].memory.text == "A late fact."


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


# --- conversations belong to users ----------------------------------------------------------

ALICE_FACT = "aaaaaaaa-0000-4000-8000-000000000001"
BOB_FACT = "aaaaaaaa-0000-4000-8000-000000000002"
ALICE_SUMMARY = "aaaaaaaa-0000-4000-8000-000000000003"
BOB_SUMMARY = "aaaaaaaa-0000-4000-8000-000000000004"
TENANT_WIDE = "aaaaaaaa-0000-4000-8000-000000000005"
BOB_OLD = "aaaaaaaa-0000-4000-8000-000000000006"
ALICE_TURN = "aaaaaaaa-0000-4000-8000-000000000007"
ALICE_DELETED = "aaaaaaaa-0000-4000-8000-000000000008"


async def test_two_users_same_named_conversations_and_their_summaries_stay_apart(
    settings, root, publisher, nats_url
) -> None:
    records = [
        rec(ALICE_FACT, "My dog is called Rex.", user_id="alice", conversation_id="default"),
        rec(BOB_FACT, "My cat is called Tom.", user_id="bob", conversation_id="default"),
        rec(
            ALICE_SUMMARY,
            "Alice talked about Rex.",
            "summary",
            user_id="alice",
            conversation_id="default",
        ),
        rec(
            BOB_SUMMARY,
            "Bob talked about Tom.",
            "summary",
            user_id="bob",
            conversation_id="default",
        ),
        rec(TENANT_WIDE, "The office opens at 9.", user_id="", conversation_id="global"),
    ]
    async with running_worker(MIRROR, settings()):
        for record in records:
            await publish_event(publisher, changed("created", record))
        await all_acknowledged(nats_url)
        await eventually(lambda: git_status(root) == "", what="the commit")

    assert front_matter(root / "acme/@alice/default/summaries/summary.md")[1] == (
        "Alice talked about Rex."
    )
    assert front_matter(root / "acme/@bob/default/summaries/summary.md")[1] == (
        "Bob talked about Tom."
    )
    [alice_fact] = (root / "acme/@alice/default/facts").iterdir()
    [bob_fact] = (root / "acme/@bob/default/facts").iterdir()
    assert front_matter(alice_fact)[0]["user_id"] == "alice"
    assert front_matter(bob_fact)[0]["user_id"] == "bob"
    # No user: the tenant-wide bucket stays at the level it always had.
    assert front_matter(root / str(live_path("acme", records[4])))[1] == "The office opens at 9."
    assert (root / "acme/global/facts").is_dir()
    assert not (root / "acme/default").exists()


async def test_a_file_naming_another_user_or_conversation_than_its_folder_is_refused(
    settings, root, publisher, nats_url, capsys, caplog
) -> None:
    alice = rec(ALICE_FACT, "My dog is called Rex.", user_id="alice")
    async with running_worker(MIRROR, settings()) as worker:
        mirror = await watching(worker)
        await publish_event(publisher, changed("created", alice))
        alice_path = root / str(live_path("acme", alice))
        await eventually(alice_path.exists, what="alice's file")
        await eventually(lambda: git_status(root) == "", what="the commit")

        # A copy of alice's file in bob's folder is refused; removing it again removes
        # a file, not alice's memory (her own file still holds it).
        copy = root / "acme/@bob/c1/facts" / alice_path.name
        copy.parent.mkdir(parents=True)
        copy.write_text(alice_path.read_text())
        copy_rel = str(copy.relative_to(root))
        await eventually(lambda: mirror.tree.known.get(copy_rel), what="the copy refused")
        copy.unlink()
        await eventually(lambda: mirror.tree.known.get(copy_rel, "") is None, what="copy gone")

        # A file in alice's folder that says it is bob's.
        claims_bob = root / "acme/@alice/c1/facts/bob.md"
        claims_bob.write_text("---\nkind: fact\nuser_id: bob\n---\n\nI like jazz.\n")
        # A file in alice's folder that names another conversation.
        other_conv = root / "acme/@alice/c1/facts/conv.md"
        other_conv.write_text("---\nkind: fact\nconversation_id: c2\n---\n\nI like rock.\n")
        # A user's memory dropped at the no-user level.
        no_user_level = root / "acme/c1/facts/top.md"
        no_user_level.parent.mkdir(parents=True)
        no_user_level.write_text("---\nkind: fact\nuser_id: alice\n---\n\nI like pop.\n")
        # Alice's own file moved into bob's folder: refused, and not a deletion.
        moved = root / "acme/@bob/c1/facts" / alice_path.name
        alice_path.rename(moved)

        refused = [claims_bob, other_conv, no_user_level, moved]
        rels = [str(p.relative_to(root)) for p in refused]
        await eventually(lambda: all(mirror.tree.known.get(r) for r in rels), what="all seen")
        await all_acknowledged(nats_url)
        await asyncio.sleep(0.3)
        assert await published(nats_url, MemoryEdited) == []  # nothing published, no delete

    # structlog prints, or (once a process configured logging) goes through the stdlib.
    logged = "".join(capsys.readouterr()) + caplog.text
    for rel, mismatch in zip(
        rels,
        [
            "user_id 'bob' differs from the directory '@alice'",
            "conversation_id 'c2' differs from the directory 'c1'",
            "user_id 'alice', but the file is in a folder of memories with no user",
            "user_id 'alice' differs from the directory '@bob'",
        ],
        strict=True,
    ):
        line = next(line for line in logged.splitlines() if rel in line and "malformed" in line)
        assert mismatch in line, line
    assert "I like jazz" not in logged  # the log names the file, never its text
    assert all(p.exists() for p in refused)  # nothing is lost either


def legacy_rel(rel: str) -> str:
    """The path a mirror wrote before conversations belonged to users: no ``@<user>/``."""
    return "/".join(part for part in rel.split("/") if not part.startswith("@"))


def old_mirror(root: Path, files: dict[str, str]) -> None:
    """A repository as a mirror from before the user level left it: every file under
    ``<tenant>/<conversation>/``, committed."""
    env = {
        "GIT_AUTHOR_NAME": "old mirror",
        "GIT_AUTHOR_EMAIL": "old@example.invalid",
        "GIT_COMMITTER_NAME": "old mirror",
        "GIT_COMMITTER_EMAIL": "old@example.invalid",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "PATH": os.environ["PATH"],
    }
    root.mkdir()
    for rel, content in files.items():
        path = root / legacy_rel(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        ["commit", "-q", "--no-verify", "-m", "an old mirror's commits"],
    ):
        subprocess.run(["git", "-C", str(root), *args], check=True, env=env)


def last_commit(root: Path) -> str:
    """The newest commit's message body and the files it touched (renames detected)."""
    return subprocess.run(
        ["git", "-C", str(root), "log", "-1", "--format=%b", "--name-status"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


async def test_a_tree_from_before_users_had_folders_is_migrated_in_one_commit(
    settings, root, publisher, nats_url
) -> None:
    alice_fact = rec(
        ALICE_FACT, "My dog is called Rex.", user_id="alice", conversation_id="default"
    )
    alice_turn = rec(
        ALICE_TURN, "I have a dog.", "turn", role="user", user_id="alice", conversation_id="default"
    )
    alice_summary = rec(
        ALICE_SUMMARY,
        "Alice talked about Rex.",
        "summary",
        user_id="alice",
        conversation_id="default",
    )
    bob_fact = rec(BOB_FACT, "My cat is called Tom.", user_id="bob", conversation_id="default")
    bob_old = rec(
        BOB_OLD,
        "My cat is called Tim.",
        user_id="bob",
        conversation_id="default",
        superseded_by=BOB_FACT,
        valid_to=T0,
    )
    tenant_wide = rec(TENANT_WIDE, "The office opens at 9.", user_id="", conversation_id="global")
    tomb = Tombstone(reason="superseded", at=T0, cause="reconcile:UPDATE")
    gone = Tombstone(reason="deleted", at=T0, cause="api")
    files = {
        str(live_path("acme", r)): render(r, "acme")
        for r in (alice_fact, alice_turn, alice_summary, bob_fact, tenant_wide)
    }
    files[str(tombstone_path("acme", bob_old))] = render(bob_old, "acme", tomb)
    deleted_turn = alice_turn.model_copy(update={"id": ALICE_DELETED, "text": "My PIN is 1."})
    files[str(tombstone_path("acme", deleted_turn))] = render(deleted_turn, "acme", gone)
    old_mirror(root, files)
    # Edited by hand while the mirror was down (before the upgrade): still an edit after.
    edited = root / legacy_rel(str(live_path("acme", alice_fact)))
    edited.write_text(edited.read_text().replace("Rex", "Max"), encoding="utf-8")

    async with running_worker(MIRROR, settings()):
        [edit] = await edited_events(nats_url, 1)
        await eventually(lambda: git_status(root) == "", what="everything committed")

    for rel, content in files.items():
        if rel == str(live_path("acme", alice_fact)):
            content = content.replace("Rex", "Max")
        assert (root / rel).read_text(encoding="utf-8") == content, rel  # moved as it was
    assert sorted(p.name for p in (root / "acme").iterdir()) == ["@alice", "@bob", "global"]
    assert (edit.op, edit.memory.id, edit.memory.user_id) == ("upserted", ALICE_FACT, "alice")
    assert edit.path == str(live_path("acme", alice_fact))
    assert edit.memory.text == "My dog is called Max."
    subjects = git_log(root)
    assert subjects == [
        "mirror: conversations belong to users (layout migration)",
        "an old mirror's commits",
    ]
    body = last_commit(root)
    assert "6 files of users' conversations moved" in body
    assert f"R100\tacme/default/deleted/facts/20260301T120000Z__{BOB_OLD}.md" in body

    # A second start moves nothing (nothing is left to move: the marker only spares the scan).
    assert plan_migration(root) == MigrationPlan(moves=[], conflicts=[])
    async with running_worker(MIRROR, settings()):
        await asyncio.sleep(0.3)
    assert git_log(root) == subjects
    assert git_status(root) == ""


# --- symlinks and special files: never followed, never opened ------------------------------


SKIPPED = "engram_mirror_files_skipped_total"


def unblock(fifos: list[Path], done: threading.Event) -> None:
    """Until ``done``, open each pipe's write end now and then, so a reader stuck on one
    (a watcher that opens FIFOs) returns and the test fails instead of hanging."""
    while not done.wait(0.1):
        for fifo in fifos:
            with suppress(OSError):  # nobody reads it: nothing is stuck
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def unsafe_reports(logs: list[MutableMapping[str, Any]]) -> dict[str, str]:
    return {e["path"]: e["reason"] for e in logs if e["event"] == "mirror.unsafe_path"}


async def test_a_symlink_to_a_fifo_does_not_freeze_the_watcher_for_other_tenants(
    settings, root, tmp_path, publisher, nats_url
) -> None:
    """A FIFO (linked into the tree, or made in it) is never opened: the watcher and the
    writer go on for everyone, and both are reported."""
    setup_metrics(Resource.create({"service.name": "engram-mirror-test"}))
    skipped = {"engram_mirror_side": "watcher"}
    links, specials = (
        metric(SKIPPED, engram_mirror_reason=reason, **skipped)
        for reason in ("symlink", "special_file")
    )
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    evil = root / "mallory/c1/facts"
    done = threading.Event()
    unblocker = threading.Thread(target=unblock, args=([pipe, evil / "made.md"], done), daemon=True)
    async with running_worker(MIRROR, settings()) as worker:
        await watching(worker)
        evil.mkdir(parents=True)
        try:
            with structlog.testing.capture_logs() as logs:
                (evil / "linked.md").symlink_to(pipe)
                os.mkfifo(evil / "made.md")
                await asyncio.sleep(0.3)  # the watcher sees them first
                note = root / "acme/c1/facts/note.md"
                note.parent.mkdir(parents=True)
                note.write_text("---\nkind: fact\n---\nI live in Lyon.\n", encoding="utf-8")
                [edit] = await edited_events(nats_url, 1)
                assert (edit.tenant, edit.memory.text) == ("acme", "I live in Lyon.")
                # The writer shares the watcher's lock: it is not held by a stuck read.
                fact = rec(FACT_ID, "My dog is called Biscuit.")
                await publish_event(publisher, changed("created", fact))
                written = root / str(live_path("acme", fact))
                await eventually(written.exists, what="a memory written after the FIFOs")
            assert unsafe_reports(logs) == {
                "mallory/c1/facts/linked.md": "symlink",
                "mallory/c1/facts/made.md": "special_file",
            }
            assert metric(SKIPPED, engram_mirror_reason="symlink", **skipped) == links + 1
            assert metric(SKIPPED, engram_mirror_reason="special_file", **skipped) == specials + 1
        except BaseException:
            unblocker.start()
            raise
    done.set()
    assert len(await published(nats_url, MemoryEdited)) == 1


async def test_a_symlinked_user_folder_is_never_written_through(
    settings, root, tmp_path, publisher, nats_url
) -> None:
    """A memory whose folder is a symlink is refused and dead-lettered (replayable once the
    folder is fixed); nothing lands outside the root and git keeps committing."""
    outside = tmp_path / "outside"
    outside.mkdir()
    alice = rec(FACT_ID, "I am Alice.", user_id="alice")
    bob = rec(NEW_FACT_ID, "I am Bob.", user_id="bob")
    async with running_worker(MIRROR, settings()) as worker:
        await watching(worker)
        (root / "acme").mkdir()
        with structlog.testing.capture_logs() as logs:
            (root / "acme/@alice").symlink_to(outside, target_is_directory=True)
            await publish_event(publisher, changed("created", alice))
            await publish_event(publisher, changed("created", bob))
            bob_file = root / str(live_path("acme", bob))
            await eventually(bob_file.exists, what="bob's memory written")
            await eventually(lambda: dead_letter_count(nats_url, "mirror"), what="dead letter")
            await eventually(lambda: "I am Bob." in git_show(root, bob_file), what="commit")
            await asyncio.sleep(0.5)  # a few commit rounds
        assert list(outside.rglob("*")) == []
        [letter] = await dead_letters(nats_url, "mirror")
        assert "'acme/@alice' in" in letter.reason and "symlink" in letter.reason
        reports = unsafe_reports(logs)  # (the watcher may also have seen the link made)
        assert reports.pop(str(live_path("acme", alice))) == "symlink"
        assert set(reports) <= {"acme/@alice"}
        assert not [e for e in logs if e["event"] == "mirror.commit_failed"]


def git_show(root: Path, path: Path) -> str:
    rel = path.relative_to(root).as_posix()
    done = subprocess.run(
        ["git", "-C", str(root), "show", f"HEAD:{rel}"], capture_output=True, text=True
    )
    return done.stdout


async def test_a_symlink_to_a_file_outside_the_mirror_is_not_imported(
    settings, root, tmp_path, nats_url
) -> None:
    """Neither linked while the mirror runs nor found at start-up; a linked folder's files
    neither. A real file beside them still is."""
    secret = tmp_path / "outside/secret.md"
    secret.parent.mkdir()
    secret.write_text("---\nkind: fact\n---\nThe root password is hunter2.\n", encoding="utf-8")
    async with running_worker(MIRROR, settings()):
        pass  # the repository exists; the next link is made while the mirror is down
    facts = root / "acme/c1/facts"
    facts.mkdir(parents=True)
    (facts / "before.md").symlink_to(secret)
    with structlog.testing.capture_logs() as logs:
        async with running_worker(MIRROR, settings()) as worker:
            await watching(worker)
            (facts / "during.md").symlink_to(secret)
            (root / "acme/@eve").symlink_to(secret.parent, target_is_directory=True)
            (root / "acme/c2").mkdir()
            (root / "acme/c2/facts").symlink_to(secret.parent, target_is_directory=True)
            (facts / "real.md").write_text("---\nkind: fact\n---\nA real one.\n", encoding="utf-8")
            [edit] = await edited_events(nats_url, 1)
            assert edit.memory.text == "A real one."
            await asyncio.sleep(1.0)  # any other batch has been handled
    assert len(await published(nats_url, MemoryEdited)) == 1
    reports = unsafe_reports(logs)
    assert reports["acme/c1/facts/before.md"] == reports["acme/c1/facts/during.md"] == "symlink"
    assert all(reason == "symlink" for reason in reports.values()), reports


def test_memory_files_lists_no_symlink_or_special_file(root, tmp_path) -> None:
    """What `engram rebuild`, export and the mirror's start-up scan read."""
    outside = tmp_path / "outside"
    (outside / "facts").mkdir(parents=True)
    (outside / "facts/x.md").write_text("x", encoding="utf-8")
    facts = root / "acme/c1/facts"
    facts.mkdir(parents=True)
    (facts / "real.md").write_text("x", encoding="utf-8")
    (facts / "link.md").symlink_to(outside / "facts/x.md")
    os.mkfifo(facts / "pipe.md")
    (root / "acme/c2").symlink_to(outside, target_is_directory=True)
    (root / "acme/@u1").mkdir()
    (root / "acme/@u1/c3").symlink_to(outside, target_is_directory=True)
    (root / "linked").symlink_to(root / "acme", target_is_directory=True)
    assert memory_files(root) == ["acme/c1/facts/real.md"]
    assert memory_files(root, "linked") == []


async def test_a_stuck_watcher_fails_readiness_and_shows_in_metrics(
    settings, root, nats_url
) -> None:
    """An idle watcher still passes (every RETRY_AFTER_S); one stuck in a pass does not."""
    setup_metrics(Resource.create({"service.name": "engram-mirror-test"}))
    stall_s = RETRY_AFTER_S + 1.0
    async with running_worker(MIRROR, settings(mirror_watch_stall_s=stall_s)) as worker:
        mirror = await watching(worker)
        for _ in range(8):  # idle for longer than the limit: ready throughout
            assert await readiness_of(worker, "watcher")
            await asyncio.sleep(stall_s / 6)
        release = asyncio.Event()
        read = mirror.tree.read

        async def stuck(rel: str) -> bytes | None:
            await release.wait()
            return await read(rel)

        mirror.tree.read = stuck  # type: ignore[method-assign]
        try:
            note = root / "acme/c1/facts/note.md"
            note.parent.mkdir(parents=True)
            note.write_text("---\nkind: fact\n---\nI live in Lyon.\n", encoding="utf-8")
            await eventually(lambda: readiness_of(worker, "watcher", False), what="not ready")
            assert metric("engram_mirror_watch_staleness_seconds") >= stall_s
        finally:
            release.set()
        await edited_events(nats_url, 1)
        await eventually(lambda: readiness_of(worker, "watcher"), what="ready again")


def metric(name: str, **labels: str) -> float:
    """A sample of this process's metrics (0 when it has not been recorded)."""
    body, _ = prometheus_exposition()
    for family in text_string_to_metric_families(body.decode()):
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                return float(found.value)
    return 0.0


async def readiness_of(worker: Any, check: str, expected: bool = True) -> bool:
    return (await worker.readiness()).get(check) is expected
