"""ENGRAM_EVENT_LOOP: services run on uvloop where installed, the standard loop on request,
and a uvloop that is asked for but missing fails at start-up."""

import asyncio

import pytest

from engram_core import event_loop
from engram_core.settings import ConfigError, EngramSettings, load_settings


async def _loop_name() -> str:
    await asyncio.sleep(0)
    return event_loop.running_loop_name()


@pytest.mark.parametrize(("choice", "expected"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_run_uses_the_chosen_loop(choice: event_loop.EventLoopChoice, expected: str) -> None:
    assert event_loop.run(_loop_name(), choice) == expected


def test_auto_prefers_uvloop_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    assert event_loop.run(_loop_name(), "auto") == "uvloop"
    monkeypatch.setattr(event_loop, "uvloop_installed", lambda: False)
    assert event_loop.run(_loop_name(), "auto") == "asyncio"


def test_the_setting_defaults_to_auto_and_ignores_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_EVENT_LOOP", raising=False)
    assert load_settings(EngramSettings).event_loop == "auto"
    monkeypatch.setenv("ENGRAM_EVENT_LOOP", "AsyncIO")
    assert load_settings(EngramSettings).event_loop == "asyncio"


def test_uvloop_asked_for_but_missing_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engram_core.settings.uvloop_installed", lambda: False)
    monkeypatch.setenv("ENGRAM_EVENT_LOOP", "uvloop")
    with pytest.raises(ConfigError, match=r"ENGRAM_EVENT_LOOP: .*uvloop is not installed"):
        load_settings(EngramSettings)
    monkeypatch.setenv("ENGRAM_EVENT_LOOP", "tokio")
    with pytest.raises(ConfigError, match="ENGRAM_EVENT_LOOP"):
        load_settings(EngramSettings)
