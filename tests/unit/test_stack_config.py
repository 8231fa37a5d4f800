"""`engram up`'s component list: every worker by default, a chosen subset, no typos."""

from pathlib import Path

import pytest

from engram_cli.stack.up import WORKERS, Stack, StackSettings


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


@pytest.mark.parametrize(
    ("environ", "terminal", "expected"),
    [
        ({}, True, "console"),  # a developer watching `engram up`
        ({}, False, "json"),  # redirected to a file, a pipe, CI
        ({"ENGRAM_LOG_FORMAT": "auto"}, True, "console"),
        ({"ENGRAM_LOG_FORMAT": "auto"}, False, "json"),
        ({"ENGRAM_LOG_FORMAT": "json"}, True, "json"),
        ({"ENGRAM_LOG_FORMAT": "CONSOLE"}, False, "console"),
    ],
)
def test_up_picks_the_services_log_format_and_passes_it_on(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    environ: dict[str, str],
    terminal: bool,
    expected: str,
) -> None:
    monkeypatch.delenv("ENGRAM_LOG_FORMAT", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sys.stdout.isatty", lambda: terminal)
    stack = Stack(StackSettings(data_dir=tmp_path), echo=lambda _: None)
    assert stack.log_format == expected
    assert {c.env["ENGRAM_LOG_FORMAT"] for c in stack.components} == {expected}


def test_logs_not_relayed_are_json_unless_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ENGRAM_LOG_FORMAT", raising=False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    quiet = Stack(StackSettings(data_dir=tmp_path), echo=lambda _: None, relay_logs=False)
    assert quiet.log_format == "json"  # nobody watches them: they go to the log files
    asked = Stack(
        StackSettings(data_dir=tmp_path),
        echo=lambda _: None,
        extra_env={"ENGRAM_LOG_FORMAT": "console"},
    )
    assert asked.log_format == "console"
