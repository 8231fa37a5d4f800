"""The mirror's file access never follows a symlink nor opens a special file: what it
reads, writes, moves and removes stays under the root, and nothing blocks."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from engram_workers.mirror.no_follow import (
    UnsafePath,
    is_regular,
    move_file,
    read_file,
    remove_file,
    write_file,
)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "acme/c1/facts").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.md").write_text("secret", encoding="utf-8")
    return root, outside


async def test_a_fifo_is_refused_without_blocking(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    os.mkfifo(root / "acme/c1/facts/pipe.md")
    os.mkfifo(outside / "pipe")
    (root / "acme/c1/facts/linked.md").symlink_to(outside / "pipe")
    for rel, reason in (
        ("acme/c1/facts/pipe.md", "special_file"),
        ("acme/c1/facts/linked.md", "symlink"),
    ):
        with pytest.raises(UnsafePath) as refused:
            await asyncio.wait_for(asyncio.to_thread(read_file, root, rel), timeout=5)
        assert refused.value.reason == reason
        assert not is_regular(root, rel)


def test_a_symlinked_folder_is_neither_read_nor_written_through(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    (root / "acme/@eve").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePath, match=r"'acme/@eve' in 'acme/@eve/secret\.md' is a symlink"):
        read_file(root, "acme/@eve/secret.md")
    with pytest.raises(UnsafePath) as refused:
        write_file(root, "acme/@eve/c1/facts/x.md", b"x", 0o644)
    assert (refused.value.reason, refused.value.component) == ("symlink", "acme/@eve")
    with pytest.raises(UnsafePath):
        remove_file(root, "acme/@eve/secret.md")
    with pytest.raises(UnsafePath):
        move_file(root, "acme/@eve/secret.md", "acme/c1/x.md")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.md"]
    assert (outside / "secret.md").read_text(encoding="utf-8") == "secret"


def test_a_link_at_the_files_own_path_is_replaced_or_removed_never_followed(
    tree: tuple[Path, Path],
) -> None:
    root, outside = tree
    link = root / "acme/c1/facts/x.md"
    link.symlink_to(outside / "secret.md")
    assert write_file(root, "acme/c1/facts/x.md", b"mine", 0o644)
    assert not link.is_symlink() and link.read_bytes() == b"mine"
    link.unlink()
    link.symlink_to(outside / "secret.md")
    assert remove_file(root, "acme/c1/facts/x.md")
    assert not link.exists() and (outside / "secret.md").read_text(encoding="utf-8") == "secret"


def test_regular_files_and_missing_paths(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    assert read_file(root, "acme/c1/facts/none.md") is None
    assert read_file(root, "nope/c1/facts/none.md") is None
    assert write_file(root, "acme/@u1/c1/facts/x.md", b"x", 0o644)  # folders are made
    assert not write_file(root, "acme/@u1/c1/facts/x.md", b"x", 0o644)  # same bytes
    assert read_file(root, "acme/@u1/c1/facts/x.md") == b"x"
    move_file(root, "acme/@u1/c1/facts/x.md", "acme/@u2/c1/facts/x.md")
    assert is_regular(root, "acme/@u2/c1/facts/x.md")
    assert not remove_file(root, "acme/@u1/c1/facts/x.md")
    with pytest.raises(ValueError, match="escapes"):
        read_file(root, "../outside/secret.md")
