"""`engram up`'s component list: every worker in one process by default, a process per
worker when asked, a chosen subset, no typos."""

from pathlib import Path

import pytest

from engram_cli.cli_common import WORKERS
from engram_cli.stack import node
from engram_cli.stack.up import ALL_WORKERS, NODE, Stack, StackSettings


def names(stack: Stack) -> list[str]:
    return [c.name for c in stack.components]


def test_the_workers_share_one_process_each_with_its_own_health_port(tmp_path: Path) -> None:
    stack = Stack(StackSettings(data_dir=tmp_path, health_port_base=9300), echo=lambda _: None)
    assert names(stack) == ["retrieval", "gateway", ALL_WORKERS]
    (workers,) = [c for c in stack.components if c.name == ALL_WORKERS]
    assert workers.command[0].endswith("engram-workers")
    assert workers.command[1:] == ["--health-port-base", "9300"]  # all of them: no --only
    assert workers.env["OTEL_SERVICE_NAME"] == "engram-workers"
    assert "ENGRAM_HEALTH_PORT" not in workers.env
    # ready when every worker's /readyz is: the endpoint names each port
    assert [f":{9300 + i}/readyz" in workers.endpoint for i in range(len(WORKERS))] == [True] * len(
        WORKERS
    )


def test_a_worker_of_the_shared_process_cannot_be_killed_alone(tmp_path: Path) -> None:
    stack = Stack(StackSettings(data_dir=tmp_path), echo=lambda _: None)
    with pytest.raises(ValueError, match="process_per_worker"):
        stack.kill("ingest")


def test_every_worker_is_its_own_process_with_its_own_health_port(tmp_path: Path) -> None:
    stack = Stack(
        StackSettings(data_dir=tmp_path, health_port_base=9300),
        echo=lambda _: None,
        process_per_worker=True,
    )
    assert names(stack) == ["retrieval", "gateway", *WORKERS]
    ports = [c.env["ENGRAM_HEALTH_PORT"] for c in stack.components if c.name in WORKERS]
    assert ports == [str(9300 + i) for i in range(len(WORKERS))]
    assert {c.env["OTEL_SERVICE_NAME"] for c in stack.components} == {
        f"engram-{n}" for n in names(stack)
    }


def test_a_subset_of_workers(tmp_path: Path) -> None:
    chosen = ("ingest", "mirror")
    stack = Stack(
        StackSettings(data_dir=tmp_path),
        echo=lambda _: None,
        workers=chosen,
        process_per_worker=True,
    )
    assert names(stack) == ["retrieval", "gateway", "ingest", "mirror"]
    shared = Stack(StackSettings(data_dir=tmp_path), echo=lambda _: None, workers=chosen)
    assert shared.components[-1].command[-2:] == ["--only", "ingest,mirror"]
    none = Stack(StackSettings(data_dir=tmp_path), echo=lambda _: None, workers=())
    assert names(none) == ["retrieval", "gateway"]


def test_light_runs_retrieval_and_the_workers_in_one_process(tmp_path: Path) -> None:
    stack = Stack(
        StackSettings(data_dir=tmp_path, health_port_base=9300), echo=lambda _: None, light=True
    )
    assert names(stack) == [NODE, "gateway"]
    (node,) = [c for c in stack.components if c.name == NODE]
    assert node.command[1:] == ["-m", "engram_cli.stack.node", "--health-port-base", "9300"]
    assert node.env["OTEL_SERVICE_NAME"] == "engram-node"
    assert node.env["ENGRAM_RETRIEVAL_LISTEN"] == stack.settings.retrieval_listen
    assert "ENGRAM_HEALTH_PORT" not in node.env
    # ready when retrieval listens and every worker's /readyz answers
    assert stack.settings.retrieval_listen in node.endpoint
    assert [f":{9300 + i}/readyz" in node.endpoint for i in range(len(WORKERS))] == [True] * len(
        WORKERS
    )
    subset = Stack(
        StackSettings(data_dir=tmp_path), echo=lambda _: None, workers=("ingest",), light=True
    )
    assert subset.components[0].command[-2:] == ["--only", "ingest"]
    with pytest.raises(ValueError, match="light"):
        Stack(StackSettings(data_dir=tmp_path), light=True, process_per_worker=True)


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


def test_the_light_node_refuses_a_bad_flag_as_engram_workers_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ENGRAM_HEALTH_PORT", raising=False)
    with pytest.raises(SystemExit, match="engram-node: --health-port-base must be a port"):
        node.main(["--health-port-base", "70000"])
    with pytest.raises(SystemExit, match="engram-node: --only: unknown workers"):
        node.main(["--only", "ingset"])
