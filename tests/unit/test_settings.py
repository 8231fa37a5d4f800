"""Shared settings fail fast with a message that names the variable."""

import pytest

from engram_core.settings import ConfigError, EngramSettings, load_settings


def test_defaults_are_local(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ENGRAM_NATS_URL", "ENGRAM_RETRIEVAL_ADDRESS", "ENGRAM_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    settings = load_settings(EngramSettings)
    assert settings.nats_url == "nats://127.0.0.1:4222"
    assert settings.retrieval_address == "127.0.0.1:50051"
    assert str(settings.data_dir) == ".engram"


@pytest.mark.parametrize(
    ("var", "value", "needle"),
    [
        ("ENGRAM_NATS_URL", "http://localhost:4222", "ENGRAM_NATS_URL"),
        ("ENGRAM_RETRIEVAL_ADDRESS", "localhost", "ENGRAM_RETRIEVAL_ADDRESS"),
        ("ENGRAM_LOG_LEVEL", "loud", "ENGRAM_LOG_LEVEL"),
        ("ENGRAM_STREAM_REPLICAS", "0", "ENGRAM_STREAM_REPLICAS"),
    ],
)
def test_bad_values_exit_with_the_variable_name(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, needle: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        load_settings(EngramSettings)
    assert needle in str(info.value)
    assert info.value.code != 0


def test_log_level_is_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_LOG_LEVEL", "DEBUG")
    assert load_settings(EngramSettings).log_level == "debug"
