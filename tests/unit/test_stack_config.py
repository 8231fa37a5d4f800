"""`engram up`'s component list: every worker by default, a chosen subset, no typos."""

from pathlib import Path

import pytest

from engram_cli.stack import WORKERS, Stack, StackSettings


def names(stack: Stack) -> list[str]:
    return [c.name for c in stack.components]


def test_every_worker_is_its_own_process_with_its_own_health_port(tmp_path: Path) -> None:
    stack = Stack(StackSettings(data_dir=tmp_path, health_port_base=9300), echo=lambda _: None)
    assert names(stack) == ["retrieval", "gateway", *WORKERS]
    ports = [c.env["ENGRAM_HEALTH_PORT"] for c in stack.components if c.name in WORKERS]
    assert ports == [str(9300 + i) for i in range(len(WORKERS))]
    assert {c.env["OTEL_SERVICE_NAME"] for c in stack.components} == {
        f"engram-{n}" for n in names(stack)
    }


def test_a_subset_of_workers(tmp_path: Path) -> None:
    stack = Stack(StackSettings(data_dir=tmp_path), echo=lambda _: None, workers=("ingest",))
    assert names(stack) == ["retrieval", "gateway", "ingest"]


def test_an_unknown_worker_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ingset"):
        Stack(StackSettings(data_dir=tmp_path), echo=lambda _: None, workers=("ingset",))
