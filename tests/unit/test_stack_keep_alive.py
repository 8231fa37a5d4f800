"""`engram up` keeps the stack up: a piece that exits after start is started again, and
one caught in a crash loop stops the stack with a message that says so."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from engram_cli.stack import up
from engram_cli.stack.up import Component, Stack, StackSettings


def one_piece(tmp_path: Path, script: str) -> tuple[Stack, Component, list[str]]:
    said: list[str] = []
    stack = Stack(StackSettings(data_dir=tmp_path), echo=said.append, relay_logs=False)
    stack.log_dir.mkdir(parents=True)
    piece = Component(
        name="piece",
        command=[sys.executable, "-c", script],
        env={},
        endpoint="nowhere",
        is_ready=lambda: True,
    )
    stack.components = [piece]
    return stack, piece, said


def wait_exit(process: subprocess.Popen[bytes] | None) -> None:
    assert process is not None
    process.wait(timeout=10)


def test_a_piece_that_exits_is_started_again(tmp_path: Path) -> None:
    stack, piece, said = one_piece(tmp_path, "import time; time.sleep(60)")
    stack._spawn(piece)
    try:
        stack.keep_alive()  # alive: nothing to do
        assert said == []
        first = piece.process
        assert first is not None
        first.kill()
        wait_exit(first)
        stack.keep_alive()
        assert piece.process is not None and piece.process is not first
        assert piece.process.poll() is None
        assert any("piece exited with -9; starting it again (1 of 5" in line for line in said)
        assert any("(restarted)" in line for line in said)
    finally:
        stack.stop()


def test_a_crash_loop_stops_the_stack_and_says_why(tmp_path: Path) -> None:
    stack, piece, said = one_piece(tmp_path, "import sys; sys.exit(3)")
    stack._spawn(piece)
    try:
        for _ in range(up.MAX_RESTARTS):
            wait_exit(piece.process)
            stack.keep_alive()
        wait_exit(piece.process)
        with pytest.raises(RuntimeError, match="exited with 3 for the 6th time in 120s"):
            stack.keep_alive()
        assert sum("starting it again" in line for line in said) == up.MAX_RESTARTS
    finally:
        stack.stop()


def test_restarts_long_ago_do_not_count(tmp_path: Path) -> None:
    stack, piece, _ = one_piece(tmp_path, "import sys; sys.exit(3)")
    stack._restarts["piece"] = [time.monotonic() - up.RESTART_WINDOW_S - 1] * up.MAX_RESTARTS
    stack._spawn(piece)
    try:
        wait_exit(piece.process)
        stack.keep_alive()  # the old restarts are outside the window: started again
        assert len(stack._restarts["piece"]) == 1
    finally:
        stack.stop()
