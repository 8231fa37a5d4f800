"""``engram rebuild``: an empty index gets its memories back from the file mirror, through
the real retrieval service; superseded facts stay superseded, tombstones stay out."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engram_cli.main import main
from engram_core.codec import pb
from engram_core.events import MemoryChanged
from engram_core.memory import MemoryRecord, ProposedProfileFact
from engram_core.mirror_format import live_path, render
from engram_testing.worker_stack import running_retrieval
from engram_workers.mirror import Mirror

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DOG = "11111111-1111-4111-8111-111111111111"
PIZZA_OLD = "22222222-2222-4222-8222-222222222222"
PIZZA_NEW = "33333333-3333-4333-8333-333333333333"
PHONE = "44444444-4444-4444-8444-444444444444"
TURN = "55555555-5555-4555-8555-555555555555"
EVICTED = "66666666-6666-4666-8666-666666666666"
NAME = "77777777-7777-4777-8777-777777777777"
OTHER_TENANT_FACT = "88888888-8888-4888-8888-888888888888"


def rec(memory_id: str, text: str, kind: str = "fact", minutes: int = 0, **fields) -> MemoryRecord:
    values = {
        "id": memory_id,
        "kind": kind,
        "text": text,
        "user_id": "u1",
        "conversation_id": "c1",
        "created_at": T0 + timedelta(minutes=minutes),
        **fields,
    }
    return MemoryRecord(**values)


async def write_mirror(root: Path) -> None:
    """A mirror as the worker leaves it after a short conversation."""
    mirror = Mirror(root, commit_interval_s=60, watch=False)
    await mirror.start()
    changes = [
        ("created", rec(DOG, "My dog is called Biscuit.")),
        ("created", rec(TURN, "I hate pizza now.", "turn", 1, role="user")),
        ("created", rec(PIZZA_NEW, "I hate pizza.", minutes=2)),
        (
            "superseded",
            rec(PIZZA_OLD, "I love pizza.", superseded_by=PIZZA_NEW, valid_to=T0),
        ),
        ("deleted", rec(PHONE, "My phone number is 555-0100.")),
        ("evicted", rec(EVICTED, "An old chatty turn.", "turn", role="assistant")),
        (
            "created",
            rec(
                NAME,
                "",
                "profile",
                profile=ProposedProfileFact(
                    category="identity", key="name", value="Anne", confidence=0.9
                ),
            ),
        ),
    ]
    for op, record in changes:
        await mirror.apply(MemoryChanged(tenant="acme", op=op, memory=record))
    await mirror.apply(
        MemoryChanged(tenant="other", op="created", memory=rec(OTHER_TENANT_FACT, "I like tea."))
    )
    await mirror.close()


async def run_cli(*args: str) -> int:
    # The command runs its own event loop, as it does from a shell.
    return await asyncio.to_thread(main, ["rebuild", *args])


async def test_rebuild_restores_an_empty_index_from_the_mirror(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "mirror"
    await write_mirror(root)
    (root / "acme" / "@u1" / "c1" / "facts" / "broken.md").write_text("no front matter\n")

    async with running_retrieval(tmp_path / "fresh-index") as server:
        client = server.client
        search = pb.SearchRequest(
            tenant="acme", query="What is my dog's name?", user_id="u1", conversation_id="c1"
        )
        assert not (await client.search(search)).hits  # empty index

        code = await run_cli("--mirror-root", str(root), "--retrieval", server.address)
        out, err = capsys.readouterr()
        assert code == 1  # one file could not be read; everything else was rebuilt
        assert "broken.md: no front matter" in err
        assert "rebuild 6/6 (100%)" in err.splitlines()  # the progress bar: a line per tenth
        assert "rebuilt 6 memories" in out and "5 live, 1 superseded" in out
        assert "(created 6, updated 0, unchanged 0)" in out
        assert "not re-indexed: 2 tombstones (1 deleted, 1 evicted)" in out

        hits = [hit.memory for hit in (await client.search(search)).hits]
        assert "My dog is called Biscuit." in [m.text for m in hits]
        assert {m.id for m in hits} >= {DOG}  # original ids
        got = await client.get(
            pb.GetRequest(tenant="acme", ids=[DOG, PIZZA_OLD, PIZZA_NEW, PHONE, EVICTED, NAME])
        )
        by_id = {m.id: m for m in got.memories}
        assert sorted(got.missing_ids) == [PHONE, EVICTED]  # removed on purpose
        assert by_id[PIZZA_OLD].superseded_by == PIZZA_NEW  # history survives
        assert by_id[PIZZA_OLD].text == "I love pizza."
        assert by_id[PIZZA_NEW].superseded_by == ""
        assert by_id[NAME].profile.value == "Anne"
        assert by_id[DOG].created_at.ToDatetime(tzinfo=UTC) == T0
        other = await client.get(pb.GetRequest(tenant="other", ids=[OTHER_TENANT_FACT]))
        assert [m.text for m in other.memories] == ["I like tea."]

        # Again: the same memories, nothing changes.
        (root / "acme" / "@u1" / "c1" / "facts" / "broken.md").unlink()
        assert await run_cli("--mirror-root", str(root), "--retrieval", server.address) == 0
        out, _ = capsys.readouterr()
        assert "(created 0, updated 0, unchanged 6)" in out


async def test_rebuild_one_tenant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "mirror"
    await write_mirror(root)
    async with running_retrieval(tmp_path / "fresh-index") as server:
        args = ["--mirror-root", str(root), "--retrieval", server.address, "--tenant", "other"]
        assert await run_cli(*args) == 0
        out, _ = capsys.readouterr()
        assert "rebuilt 1 memories" in out
        counts = await server.client.count(pb.CountRequest(tenant="acme"))
        assert counts.count == 0
        counts = await server.client.count(pb.CountRequest(tenant="other"))
        assert counts.count == 1


async def test_rebuild_reports_a_missing_mirror(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await run_cli("--mirror-root", str(tmp_path / "nope"), "--retrieval", "127.0.0.1:1")
    assert code == 2
    assert "no mirror at" in capsys.readouterr().err


# --- conversations belong to users ---------------------------------------------------------

ALICE = "aaaaaaaa-0000-4000-8000-000000000001"
BOB = "aaaaaaaa-0000-4000-8000-000000000002"
ALICE_SUMMARY = "aaaaaaaa-0000-4000-8000-000000000003"
OFFICE = "aaaaaaaa-0000-4000-8000-000000000004"
DOG_QUESTION = "What is my pet called?"


def two_users() -> list[MemoryRecord]:
    """Two users who both use the conversation "default", and a tenant-wide fact."""
    return [
        rec(ALICE, "My dog is called Rex.", user_id="alice", conversation_id="default"),
        rec(BOB, "My cat is called Tom.", user_id="bob", conversation_id="default"),
        rec(
            ALICE_SUMMARY,
            "Alice talked about her dog Rex.",
            "summary",
            user_id="alice",
            conversation_id="default",
        ),
        rec(OFFICE, "The office opens at 9.", user_id="", conversation_id="global"),
    ]


async def recalled(client, user: str, query: str = DOG_QUESTION) -> list[str]:
    search = pb.SearchRequest(tenant="acme", query=query, user_id=user, conversation_id="default")
    return [hit.memory.text for hit in (await client.search(search)).hits]


async def test_rebuild_from_the_user_layout_keeps_each_users_memories_theirs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "mirror"
    mirror = Mirror(root, commit_interval_s=60, watch=False)
    await mirror.start()
    for record in two_users():
        await mirror.apply(MemoryChanged(tenant="acme", op="created", memory=record))
    await mirror.close()
    assert (root / "acme" / "@alice" / "default" / "summaries" / "summary.md").is_file()
    # A file dropped into alice's folder with no user_id: alice's, from where it lies.
    dropped = root / "acme" / "@alice" / "default" / "facts" / "note.md"
    dropped.write_text(
        "---\nid: aaaaaaaa-0000-4000-8000-000000000005\nkind: fact\n---\n\n"
        "My dog Rex is afraid of thunder.\n",
        encoding="utf-8",
    )

    async with running_retrieval(tmp_path / "fresh-index") as server:
        assert await run_cli("--mirror-root", str(root), "--retrieval", server.address) == 0
        assert "rebuilt 5 memories" in capsys.readouterr().out
        alice = await recalled(server.client, "alice")
        bob = await recalled(server.client, "bob")
        assert "My dog is called Rex." in alice and "My dog Rex is afraid of thunder." in alice
        assert "My cat is called Tom." in bob
        assert not {"My dog is called Rex.", "My dog Rex is afraid of thunder."} & set(bob)
        assert "My cat is called Tom." not in alice
        got = await server.client.get(pb.GetRequest(tenant="acme", ids=[ALICE_SUMMARY, OFFICE]))
        by_id = {m.id: m for m in got.memories}
        assert (by_id[ALICE_SUMMARY].user_id, by_id[OFFICE].user_id) == ("alice", "")


async def test_rebuild_reads_a_tree_not_migrated_yet_by_its_front_matter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "mirror"
    for record in two_users():
        # Where a mirror from before the user level wrote them: <tenant>/<conversation>/.
        rel = "/".join(p for p in str(live_path("acme", record)).split("/") if p[0] != "@")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(render(record, "acme"), encoding="utf-8")
    assert sorted(p.name for p in (root / "acme").iterdir()) == ["default", "global"]

    async with running_retrieval(tmp_path / "fresh-index") as server:
        assert await run_cli("--mirror-root", str(root), "--retrieval", server.address) == 0
        assert "rebuilt 4 memories" in capsys.readouterr().out
        assert "My dog is called Rex." in await recalled(server.client, "alice")
        assert "My dog is called Rex." not in await recalled(server.client, "bob")
        got = await server.client.get(pb.GetRequest(tenant="acme", ids=[ALICE, BOB]))
        assert sorted(m.user_id for m in got.memories) == ["alice", "bob"]
