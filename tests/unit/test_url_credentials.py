"""A configured URL's credentials never reach a message: the upstream-unreachable error
(services/gateway/tests/test_chat.py) and the settings errors at start alike."""

from __future__ import annotations

import pytest

from engram_core.settings import ConfigError, load_settings
from engram_core.urls import without_credentials
from engram_gateway.settings import GatewaySettings
from engram_retrieval.settings import RetrievalSettings


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://bob:s3cret@llm.example:8080/v1", "http://llm.example:8080/v1"),
        ("https://llm.example/v1?api_key=s3cret#x", "https://llm.example/v1"),
        ("nats://user:s3cret@[::1]:4222", "nats://[::1]:4222"),
        ("http://[::1", "<unparseable URL>"),
        ("http://127.0.0.1:11434/v1", "http://127.0.0.1:11434/v1"),
    ],
)
def test_without_credentials(url: str, shown: str) -> None:
    assert without_credentials(url) == shown


@pytest.mark.parametrize(
    ("settings", "variable", "value"),
    [
        (GatewaySettings, "ENGRAM_LLM_BASE_URL", "ftp://bob:s3cret@llm.example/v1"),
        (GatewaySettings, "ENGRAM_LLM_BASE_URL", "http://bob:s3cret@llm.example/v1?k=1"),
        (GatewaySettings, "ENGRAM_NATS_URL", "http://bob:s3cret@nats.example:4222"),
        (RetrievalSettings, "ENGRAM_EMBED_URL", "ftp://bob:s3cret@embed.example/v1"),
        (RetrievalSettings, "ENGRAM_QDRANT_URL", "ftp://bob:s3cret@qdrant.example"),
    ],
)
def test_a_bad_url_is_refused_at_start_without_showing_its_credentials(
    settings: type, variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as refused:
        load_settings(settings)
    message = str(refused.value)
    assert variable in message and "example" in message
    assert "s3cret" not in message and "bob" not in message
