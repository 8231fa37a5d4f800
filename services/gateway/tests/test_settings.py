"""Gateway settings: defaults, the environment, and bad values failing fast by name."""

from __future__ import annotations

import pytest

from engram_core.settings import ConfigError, load_settings
from engram_gateway.settings import GatewaySettings


def test_settings_defaults() -> None:
    settings = GatewaySettings()
    assert (settings.gateway_host, settings.gateway_port) == ("127.0.0.1", 8100)
    assert settings.llm_base_url == "http://localhost:11434/v1"
    assert settings.llm_api_key is None
    assert settings.gateway_memory_top_k is None  # retrieval's default applies


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_GATEWAY_PORT", "9000")
    monkeypatch.setenv("ENGRAM_LLM_BASE_URL", "https://api.example.com/v1/")
    monkeypatch.setenv("ENGRAM_LLM_API_KEY", "sk-secret")
    settings = load_settings(GatewaySettings)
    assert settings.gateway_port == 9000
    assert settings.llm_base_url == "https://api.example.com/v1"
    assert settings.llm_api_key is not None
    assert "sk-secret" not in repr(settings)


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("ENGRAM_GATEWAY_PORT", "70000"),
        ("ENGRAM_LLM_BASE_URL", "localhost:11434"),
        ("ENGRAM_LLM_TIMEOUT_S", "0"),
        ("ENGRAM_GATEWAY_MEMORY_TOP_K", "0"),
        ("ENGRAM_GATEWAY_MAX_BODY_BYTES", "many"),
    ],
)
def test_bad_settings_fail_fast_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        load_settings(GatewaySettings)
    assert var in str(info.value)
