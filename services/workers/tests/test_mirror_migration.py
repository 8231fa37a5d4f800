"""The layout migration's edge cases, on a real git repository (no NATS): what stays
where it is, what is left in place, and that a checked tree is not scanned again."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from engram_core.memory import MemoryRecord
from engram_core.mirror_format import live_path, render
from engram_testing.mirror_support import git_log, git_status
from engram_workers.mirror import Mirror
from engram_workers.mirror.migration import MARKER_NAME, SUBJECT, plan_migration

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def fact(memory_id: str, text: str, user_id: str) -> MemoryRecord:
    return MemoryRecord(
        id=memory_id, kind="fact", text=text, user_id=user_id, conversation_id="c1", created_at=T0
    )


def write(root: Path, rel: str, content: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return path


async def start_and_stop(root: Path) -> None:
    mirror = Mirror(root, commit_interval_s=60, watch=False)
    await mirror.start()
    await mirror.close()


async def test_only_files_naming_a_user_move_and_a_taken_place_is_left_alone(
    tmp_path: Path,
) -> None:
    root = tmp_path / "mirror"
    shared = fact("11111111-1111-4111-8111-111111111111", "The office opens at 9.", "")
    hand_named = fact("22222222-2222-4222-8222-222222222222", "I like tea.", "alice")
    taken = fact("33333333-3333-4333-8333-333333333333", "I like coffee.", "alice")
    write(root, str(live_path("acme", shared)), render(shared, "acme"))
    # A hand-made name is moved to the canonical name of its new place.
    write(root, "acme/c1/facts/tea note.md", render(hand_named, "acme"))
    # Not parseable: its user cannot be known, so it stays (and the watcher reports it).
    broken = write(root, "acme/c1/facts/broken.md", "---\nuser_id: alice\nkind: [\n---\nx\n")
    # Its new place already holds another version: left where it is, and said.
    legacy_taken = write(root, "acme/c1/facts/coffee.md", render(taken, "acme"))
    newer = taken.model_copy(update={"text": "I like strong coffee."})
    write(root, str(live_path("acme", newer)), render(newer, "acme"))

    await start_and_stop(root)

    assert (root / str(live_path("acme", shared))).is_file()  # no user: where it was
    assert (root / str(live_path("acme", hand_named))).read_text() == render(hand_named, "acme")
    assert not (root / "acme/c1/facts/tea note.md").exists()
    assert broken.is_file() and legacy_taken.is_file()
    assert (root / str(live_path("acme", newer))).read_text() == render(newer, "acme")
    assert git_log(root) == [SUBJECT, "mirror: initialise"]
    assert git_status(root) == ""
    # The place conflict keeps the tree unmarked: the next start looks (and logs) again.
    assert not (root / ".git" / MARKER_NAME).exists()
    assert [m.source for m in plan_migration(root).conflicts] == ["acme/c1/facts/coffee.md"]

    legacy_taken.unlink()
    await start_and_stop(root)
    assert (root / ".git" / MARKER_NAME).is_file()
    assert git_log(root)[0] == SUBJECT  # nothing moved: no new commit


async def test_a_checked_tree_is_not_scanned_again(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    await start_and_stop(root)  # a new mirror: nothing to move, marked at once
    assert (root / ".git" / MARKER_NAME).is_file()
    # A user's file written at the no-user level after that (by hand, say) is not
    # moved by a start: the watcher refuses it as misplaced instead.
    alice = fact("44444444-4444-4444-8444-444444444444", "I like tea.", "alice")
    stray = write(root, "acme/c1/facts/stray.md", render(alice, "acme"))
    await start_and_stop(root)
    assert stray.is_file()
    assert git_log(root) == ["mirror: initialise"]


async def test_nothing_is_moved_into_a_symlinked_user_folder(tmp_path: Path) -> None:
    root, outside = tmp_path / "mirror", tmp_path / "outside"
    outside.mkdir()
    alice = fact("44444444-4444-4444-8444-444444444444", "I like tea.", "alice")
    legacy = write(root, "acme/c1/facts/tea.md", render(alice, "acme"))
    (root / "acme/@alice").symlink_to(outside, target_is_directory=True)

    await start_and_stop(root)

    assert legacy.read_text() == render(alice, "acme")  # left in place, and said
    assert list(outside.rglob("*")) == []
