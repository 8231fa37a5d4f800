"""What the admin commands (import, export, search, reembed, status) share: where the
services are, the API key, and a one-line error type that becomes exit status 2."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import Field, SecretStr

from engram_core.settings import EngramSettings, load_settings


class CliSettings(EngramSettings):
    """``ENGRAM_*`` variables the admin commands read (flags override them)."""

    gateway_url: str = Field(
        default="http://127.0.0.1:8100", description="The gateway's base URL (no /v1)."
    )
    api_key: SecretStr | None = Field(
        default=None, description="An Engram API key, sent as the bearer token."
    )
    mirror_root: Path | None = Field(
        default=None, description="The mirror's root (default <data_dir>/mirror)."
    )
    health_port_base: int = Field(default=8201, ge=1, le=65535)
    llm_model: str = Field(
        default="", description="import --via http: the model extraction uses (--model)."
    )

    @property
    def mirror(self) -> Path:
        return self.mirror_root or self.data_dir / "mirror"


class CommandError(Exception):
    """A problem the user can fix, reported as one line; exit status 2."""


def add_retrieval_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--retrieval",
        metavar="HOST:PORT",
        help="retrieval service (default: $ENGRAM_RETRIEVAL_ADDRESS or 127.0.0.1:50051)",
    )


def add_gateway_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gateway",
        metavar="URL",
        help="gateway base URL (default: $ENGRAM_GATEWAY_URL or http://127.0.0.1:8100)",
    )
    parser.add_argument(
        "--api-key", help="Engram API key (default: $ENGRAM_API_KEY; none in single-tenant mode)"
    )


def cli_settings(args: argparse.Namespace) -> CliSettings:
    overrides: dict[str, object] = {}
    if getattr(args, "retrieval", None):
        overrides["retrieval_address"] = args.retrieval
    if getattr(args, "gateway", None):
        overrides["gateway_url"] = args.gateway
    if getattr(args, "api_key", None):
        overrides["api_key"] = args.api_key
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = args.data_dir
    if getattr(args, "mirror_root", None):
        overrides["mirror_root"] = args.mirror_root
    return load_settings(CliSettings, **overrides)


def auth_headers(settings: CliSettings) -> dict[str, str]:
    if settings.api_key is None:
        return {}
    return {"Authorization": f"Bearer {settings.api_key.get_secret_value()}"}


def api_error(response: object) -> str:
    """The message of an OpenAI-shaped error body, else the status line."""
    import httpx

    assert isinstance(response, httpx.Response)
    try:
        error = response.json()["error"]
        return (
            f"{response.status_code} {error.get('code') or error.get('type')}: {error['message']}"
        )
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} {response.reason_phrase}: {response.text[:200]}"
