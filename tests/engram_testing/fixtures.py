"""pytest fixtures shared by every test directory (registered in the root conftest)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_cli.stack.nats_server import NatsServerProcess, free_port
from engram_core.bus import change_subjects
from engram_testing.upstream import ScriptedUpstream


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServerProcess]:
    """A real nats-server with JetStream on a free port, storing under tmp_path."""
    server = NatsServerProcess(tmp_path / "nats", port=free_port(), log_file=tmp_path / "nats.log")
    server.start()
    change_subjects.forget()  # what this process read of another server's consumers
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServerProcess) -> str:
    return nats_server.url


@pytest.fixture
def scripted_upstream() -> Iterator[ScriptedUpstream]:
    """A recording OpenAI-compatible upstream; set ``.replies`` before use."""
    upstream = ScriptedUpstream().start()
    try:
        yield upstream
    finally:
        upstream.stop()
