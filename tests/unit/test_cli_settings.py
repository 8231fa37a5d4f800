"""One settings object for where the local stack's pieces are: ``engram up`` places
them there and every client command looks there, so a relocated stack is found with
the same variables and nothing else; ``--help`` shows what this environment gives."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engram_cli.cli_common import WORKERS, CliSettings, cli_settings
from engram_cli.main import build_parser
from engram_cli.stack.up import Stack

LOCATION_VARS = (
    "ENGRAM_GATEWAY_URL",
    "ENGRAM_GATEWAY_HOST",
    "ENGRAM_GATEWAY_PORT",
    "ENGRAM_RETRIEVAL_ADDRESS",
    "ENGRAM_RETRIEVAL_LISTEN",
    "ENGRAM_NATS_URL",
    "ENGRAM_HEALTH_PORT_BASE",
    "ENGRAM_DATA_DIR",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LOCATION_VARS:
        monkeypatch.delenv(name, raising=False)


def test_defaults() -> None:
    settings = CliSettings()
    assert settings.gateway_url == "http://127.0.0.1:8100"
    assert settings.retrieval_address == settings.retrieval_listen == "127.0.0.1:50051"
    assert settings.worker_health_ports() == {w: 8201 + i for i, w in enumerate(WORKERS)}


@pytest.mark.parametrize(
    ("environ", "gateway_url"),
    [
        ({"ENGRAM_GATEWAY_PORT": "9100"}, "http://127.0.0.1:9100"),
        (
            {"ENGRAM_GATEWAY_HOST": "0.0.0.0", "ENGRAM_GATEWAY_PORT": "9100"},
            "http://127.0.0.1:9100",
        ),
        ({"ENGRAM_GATEWAY_HOST": "::"}, "http://[::1]:8100"),
        ({"ENGRAM_GATEWAY_HOST": "10.1.2.3"}, "http://10.1.2.3:8100"),
        (
            {"ENGRAM_GATEWAY_PORT": "9100", "ENGRAM_GATEWAY_URL": "https://engram.example"},
            "https://engram.example",
        ),
    ],
)
def test_clients_find_the_gateway_where_up_serves_it(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], gateway_url: str
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert CliSettings().gateway_url == gateway_url


@pytest.mark.parametrize(
    ("environ", "listen", "address"),
    [
        ({"ENGRAM_RETRIEVAL_LISTEN": "0.0.0.0:6000"}, "0.0.0.0:6000", "127.0.0.1:6000"),
        ({"ENGRAM_RETRIEVAL_ADDRESS": "127.0.0.1:6001"}, "127.0.0.1:6001", "127.0.0.1:6001"),
        (
            {"ENGRAM_RETRIEVAL_LISTEN": "0.0.0.0:6000", "ENGRAM_RETRIEVAL_ADDRESS": "r:6000"},
            "0.0.0.0:6000",
            "r:6000",
        ),
    ],
)
def test_retrieval_is_configured_once(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], listen: str, address: str
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    settings = CliSettings()
    assert (settings.retrieval_listen, settings.retrieval_address) == (listen, address)


def test_up_tells_its_children_where_the_others_are(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ENGRAM_GATEWAY_HOST", "0.0.0.0")
    monkeypatch.setenv("ENGRAM_GATEWAY_PORT", "9100")
    monkeypatch.setenv("ENGRAM_RETRIEVAL_LISTEN", "0.0.0.0:6000")
    monkeypatch.setenv("ENGRAM_HEALTH_PORT_BASE", "9300")
    stack = Stack(CliSettings(data_dir=tmp_path), echo=lambda _: None)
    env = {c.name: c.env for c in stack.components}
    assert env["gateway"]["ENGRAM_RETRIEVAL_ADDRESS"] == "127.0.0.1:6000"
    assert env["retrieval"]["ENGRAM_RETRIEVAL_LISTEN"] == "0.0.0.0:6000"
    assert env["gateway"]["ENGRAM_GATEWAY_PORT"] == "9100"
    workers = next(c for c in stack.components if c.name == "workers")
    assert workers.command[1:3] == ["--health-port-base", "9300"]
    assert workers.env["ENGRAM_RETRIEVAL_ADDRESS"] == "127.0.0.1:6000"
    gateway = next(c for c in stack.components if c.name == "gateway")
    assert gateway.endpoint == "http://127.0.0.1:9100/v1"  # what it tells you to use


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_GATEWAY_PORT", "9100")
    monkeypatch.setenv("ENGRAM_HEALTH_PORT_BASE", "9300")
    args = argparse.Namespace(
        gateway="http://elsewhere:1", retrieval="r:2", nats="nats://n:3", health_port_base=9400
    )
    settings = cli_settings(args)
    assert settings.gateway_url == "http://elsewhere:1"
    assert settings.retrieval_address == "r:2"
    assert settings.nats_url == "nats://n:3"
    assert settings.health_port_base == 9400


def _help(*command: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])


GATEWAY, RETRIEVAL, HEALTH, DATA = "127.0.0.1:9100", "127.0.0.1:6000", "9300", "/srv/engram"


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("status", (GATEWAY, RETRIEVAL, HEALTH)),
        ("search", (GATEWAY, RETRIEVAL)),
        ("import", (GATEWAY, RETRIEVAL, DATA)),
        ("export", (RETRIEVAL, DATA)),
        ("reembed", (RETRIEVAL, DATA)),
        ("rebuild", (RETRIEVAL, DATA)),
        ("up", (GATEWAY, RETRIEVAL, "9300-9305", DATA)),
    ],
)
def test_help_shows_the_defaults_this_environment_gives(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    shown: tuple[str, ...],
) -> None:
    monkeypatch.setenv("ENGRAM_GATEWAY_PORT", "9100")
    monkeypatch.setenv("ENGRAM_RETRIEVAL_LISTEN", RETRIEVAL)
    monkeypatch.setenv("ENGRAM_HEALTH_PORT_BASE", HEALTH)
    monkeypatch.setenv("ENGRAM_DATA_DIR", DATA)
    _help(command)
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for value in shown:
        assert value in text, (value, text)
    assert ":8100" not in text and ":50051" not in text and "8201" not in text


def test_help_still_works_when_the_environment_is_invalid(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ENGRAM_GATEWAY_PORT", "not-a-port")
    _help("status")
    assert "--gateway" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="ENGRAM_GATEWAY_PORT"):
        cli_settings(argparse.Namespace())
