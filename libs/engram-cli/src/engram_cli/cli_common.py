"""What the admin commands (import, export, search, reembed, status) share: where the
services are, the API key, and a one-line error type that becomes exit status 2."""

from __future__ import annotations

import argparse
import asyncio
import json
from contextlib import suppress
from pathlib import Path
from typing import TextIO

from faststream.nats import NatsBroker
from pydantic import Field, SecretStr

from engram_core.bus import ensure_stream, make_broker
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


async def connect_announcer(
    nats_url: str, what: str, *, replicas: int = 1, timeout_s: float = 5.0
) -> NatsBroker:
    """A connected broker (and the checked ENGRAM stream) for commands that write
    memories themselves and must announce them, so the mirror keeps them; a clear error
    when NATS is not there."""
    broker = make_broker(nats_url, client_name="engram-cli")
    try:
        await asyncio.wait_for(ensure_stream(nats_url, replicas), timeout_s)
        await asyncio.wait_for(broker.connect(), timeout_s)
    except Exception as exc:
        with suppress(Exception):
            await broker.stop()
        raise CommandError(
            f"{what} announces every memory it writes on NATS, so the Markdown mirror keeps "
            f"it; NATS at {nats_url} is unreachable ({type(exc).__name__}). Start the stack "
            "(engram up) or set ENGRAM_NATS_URL."
        ) from None
    return broker


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


class DoneLog:
    """What a resumable command has done: append-only JSON lines, a header then one line
    per finished item (its ``key``). A line cut off by an interruption is ignored, so the
    file never needs repair; re-running skips every key it holds."""

    def __init__(self, path: Path, header: dict[str, object]) -> None:
        self.path = path
        self.header = header
        self.done: set[str] = set()
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                # "unit": what import state files of earlier versions called the key
                key = entry.get("key", entry.get("unit")) if isinstance(entry, dict) else None
                if isinstance(key, str):
                    self.done.add(key)
        self._file: TextIO | None = None

    def record(self, key: str, **details: object) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            self._file = self.path.open("a", encoding="utf-8")
            if fresh:
                self._file.write(json.dumps(self.header) + "\n")
        self._file.write(json.dumps({"key": key, **details}) + "\n")
        self._file.flush()
        self.done.add(key)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
